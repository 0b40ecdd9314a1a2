"""The payload room's commands: `rl-trainer-bench payload` builds one micro-batch to a file,
`profile-routing` extracts a routing profile from a real run's routed-experts dump, and `check`
runs the CPU checks on a built or loaded micro-batch."""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from rl_trainer_bench.config.knobs import CHECK, PAYLOAD, add_knob_flags, add_preset_flag, knobs_of
from rl_trainer_bench.config.presets import preset as find_preset
from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import check_output_file, write_text_atomically
from rl_trainer_bench.payload import (
    build,
    checks,
    engine_numerics,
    npz,
    routing_dump,
    routing_profile,
)
from rl_trainer_bench.payload.build import build_calibrated
from rl_trainer_bench.payload.digests import payload_digest
from rl_trainer_bench.payload.npz import save_npz
from rl_trainer_bench.payload.packing import DEFAULT_NUM_GENERATIONS, PackingLayout


def _add_micro_batch_source(parser: argparse.ArgumentParser, command: str) -> None:
    """The flags that say which micro-batch `command` (`payload` or `check`) builds: the cell,
    the knobs the table gives `command`, and the packing layout."""
    add_preset_flag(parser, "shapes of the micro-batch")
    add_knob_flags(parser, knobs_of(command))
    parser.add_argument(
        "--index", type=int, default=0, help="micro-batch index (distinct content per index)"
    )
    parser.add_argument(
        "--max-prompt-length", type=int, help="orchestrator argv: packing layout from it"
    )
    parser.add_argument(
        "--max-response-length", type=int, help="orchestrator argv: packing layout from it"
    )
    parser.add_argument(
        "--num-generations",
        type=int,
        default=DEFAULT_NUM_GENERATIONS,
        help=f"sequences per GRPO group (default {DEFAULT_NUM_GENERATIONS})",
    )
    parser.add_argument("--pad-rows", type=int, default=0, help="rows that are all padding")


def add_payload_arguments(parser: argparse.ArgumentParser) -> None:
    _add_micro_batch_source(parser, PAYLOAD)
    parser.add_argument(
        "--out", required=True, metavar="FILE.npz", help="where to write the micro-batch"
    )
    parser.add_argument(
        "--no-routed-experts", action="store_true", help="omit routed_experts (no router replay)"
    )


def add_profile_routing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dump", metavar="DUMP.npy", help="a run's routed experts, int, -1 on padding"
    )
    parser.add_argument(
        "--layout", default="BTLK", choices=("BTLK", "BLTK"), help="axis order of the dump"
    )
    parser.add_argument("--num-experts", type=int, help="expert count (default: largest id + 1)")
    parser.add_argument("--description", help="how the dump was taken (stored in the profile)")
    parser.add_argument("--out", metavar="FILE", help="write the profile here (default: stdout)")


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    _add_micro_batch_source(parser, CHECK)
    parser.add_argument(
        "--payload", metavar="FILE.npz", help="check this micro-batch instead of building one"
    )
    parser.add_argument(
        "--skip-numerics", action="store_true", help="only the well-formedness checks (no engine)"
    )


def engine_for(args) -> EngineConfig:
    """The preset's engine config (the `--preset` flag shared by `payload` and `check`)."""
    return find_preset(args.preset).engine


def layout_for(args, engine: EngineConfig) -> PackingLayout | None:
    """The layout from orchestrator flags, when `--max-prompt-length` is given."""
    if args.max_prompt_length is None and args.max_response_length is None:
        return None
    if args.max_prompt_length is None or args.max_response_length is None:
        raise UserError("--max-prompt-length and --max-response-length go together: give both")
    return PackingLayout.from_orchestrator(
        engine.micro_batch_rows,
        engine.seq_len,
        args.max_prompt_length,
        args.max_response_length,
        num_generations=args.num_generations,
        pad_rows=args.pad_rows,
    )


def run_payload(args) -> int:
    """`rl-trainer-bench payload`: build one micro-batch, print its calibration, write it."""
    if not args.out.endswith(".npz"):
        raise UserError(f"--out {args.out}: the micro-batch is written as .npz; name it FILE.npz")
    check_output_file(args.out, "--out")
    engine = engine_for(args)
    shipped = find_preset(args.preset).routing_profile
    profile = routing_profile.load_profile(args.routing_profile, shipped)
    built = build_calibrated(
        engine,
        profile,
        seed=args.seed,
        index=args.index,
        layout=layout_for(args, engine),
        replay=False if args.no_routed_experts else None,
    )
    if built.calibration is not None:
        print(built.calibration.format())
    save_npz(built.payload, args.out)
    payload = built.payload
    print(
        f"{payload.name}: {payload.shape[0]} x {payload.shape[1]} tokens, "
        f"{int((payload.segment_ids > 0).sum())} real, {payload.nbytes / 1e9:.3f} GB, "
        f"built in {built.seconds:.2f} s, digest {payload_digest(payload)} -> {args.out}"
    )
    return 0


def run_profile_routing(args) -> int:
    """`rl-trainer-bench profile-routing`: a profile from a run's routed-experts dump."""
    if args.out is not None:
        check_output_file(args.out, "--out")  # before the dump is read
    try:
        dump = np.load(args.dump, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"routing dump {args.dump}: cannot read as .npy ({reason})") from None
    if not isinstance(dump, np.ndarray):
        dump.close()
        raise UserError(
            f"routing dump {args.dump}: an .npz archive; pass one .npy array of routed experts "
            "(np.save(path, routed))"
        )
    profile = routing_dump.profile_from_dump(
        dump,
        layout=args.layout,
        num_experts=args.num_experts,
        description=args.description or f"extracted from {os.path.basename(args.dump)}",
    )
    text = json.dumps(profile.to_json(), indent=1) + "\n"
    if args.out is None:
        sys.stdout.write(text)
        return 0
    write_text_atomically(args.out, text)
    ratios = profile.max_load_ratio
    print(
        f"{args.out}: {profile.num_layers} layers, {profile.num_experts} experts, top-{profile.top_k}; "
        f"max-load ratio {ratios.min():.2f}..{ratios.max():.2f}",
        file=sys.stderr,
    )
    return 0


def run_check(args) -> int:
    """`rl-trainer-bench check`: well-formedness of a built or loaded micro-batch, then numerics.

    Exit 0 when everything passes, 1 when a check fails (2 is bad input, from the cli).
    """
    engine = engine_for(args)
    if args.payload:
        payload = npz.load_npz(args.payload, verify=False)  # a digest mismatch is reported below
    else:
        payload = build.build_micro_batch(
            engine,
            routing_profile.load_profile(
                args.routing_profile, find_preset(args.preset).routing_profile
            ),
            seed=args.seed,
            index=args.index,
            layout=layout_for(args, engine),
        )
    problems = checks.check_payload(payload, engine)
    for warning in checks.payload_warnings(payload, engine):
        print(f"{payload.name}: warning: {warning}")
    for problem in problems:
        print(f"{payload.name}: {problem}")
    print(
        f"{payload.name}: well-formedness {'FAILED' if problems else 'ok'} ({len(problems)} problems)"
    )
    if problems or args.skip_numerics:
        return 1 if problems else 0
    reference, results = engine_numerics.check_numerics(engine, payload)
    print(engine_numerics.format_numerics(reference, results))
    return 0 if all(r.passed for r in results) else 1
