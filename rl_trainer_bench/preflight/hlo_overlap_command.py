"""`rl-trainer-bench hlo-overlap`: the collective-overlap report of an HLO file, or of a preset's
programs compiled for a target as `aot` compiles them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from rl_trainer_bench.errors import UserError
from rl_trainer_bench.preflight.hlo_overlap import analyze_file, analyze_text
from rl_trainer_bench.preflight.hlo_overlap_report import format_report
from rl_trainer_bench.preflight.hlo_replica_groups import parse_mesh


def add_arguments(parser) -> None:
    parser.add_argument(
        "file", nargs="?", metavar="FILE.hlo", help="HLO text (compiled.as_text() or an XLA dump)"
    )
    parser.add_argument(
        "--mesh",
        metavar="AXES",
        help="mesh of FILE, major to minor, e.g. fsdp=2,context=2,expert=2: maps groups to axes",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--summary-only", action="store_true", help="leave out the per-collective rows"
    )
    from rl_trainer_bench.config.knobs import ENGINE_KNOBS, add_knob_flags
    from rl_trainer_bench.preflight.aot.command import add_target_arguments

    add_target_arguments(parser)
    add_knob_flags(parser, ENGINE_KNOBS, {"ENGINE": "; its programs are compiled as aot does"})


def run(args) -> int:
    if args.file:
        path = Path(args.file)
        if not path.is_file():
            raise UserError(f"FILE.hlo: {args.file!r} does not exist; pass an HLO text file")
        mesh = parse_mesh(args.mesh) if args.mesh else None
        try:
            data = path.read_bytes()
        except OSError as error:
            raise UserError(f"{args.file}: cannot read ({error.strerror})") from None
        reports = analyze_file(data, str(path), mesh, Path(path.name.removesuffix(".gz")).stem)
    else:
        from rl_trainer_bench.config.engine_choice import choose_engine
        from rl_trainer_bench.config.presets import preset
        from rl_trainer_bench.preflight.aot.check import compiled_texts
        from rl_trainer_bench.preflight.quiet_stderr import quiet_libtpu

        choice = choose_engine(args.engine, args.trainer_argv, preset(args.preset).engine)
        texts = compiled_texts(
            args.preset,
            args.target,
            args.layers,
            choice.spec,
            trainer_argv=args.trainer_argv,
            engine_flags=args.engine_flags,
        )
        with quiet_libtpu():  # libtpu's start-up noise when compiling for a TPU slice
            reports = [analyze_text(text, name, mesh, name) for name, text, mesh in texts]
    if args.json:
        text = json.dumps([r.to_json() for r in reports], indent=1)
    else:
        text = "\n\n".join(format_report(r, details=not args.summary_only) for r in reports)
    print_to_a_pipe(text)
    return 0


def print_to_a_pipe(text: str) -> None:
    """Print `text`; a reader that closed the pipe early (`| head`) has all it wanted, not an error."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python would report the broken pipe again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
