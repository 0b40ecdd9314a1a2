"""`rl-trainer-bench hlo-overlap`: the collective-overlap report of an HLO file, or of a preset's
programs compiled for a target as `aot` compiles them."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from rl_trainer_bench.config.engine_choice import choose_engine
from rl_trainer_bench.config.knobs import HLO_OVERLAP, add_knob_flags, knobs_of
from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import check_output_file, write_text_atomically
from rl_trainer_bench.preflight.aot.arguments import LOCAL, add_target_arguments
from rl_trainer_bench.preflight.compiler_flags import compiler_flags
from rl_trainer_bench.preflight.hlo.overlap import analyze_file, analyze_text
from rl_trainer_bench.preflight.hlo.replica_groups import parse_mesh
from rl_trainer_bench.preflight.hlo.report import format_report
from rl_trainer_bench.preflight.quiet_stderr import quiet_libtpu

# The driver's knobs `hlo-overlap` takes as flags: the rows of the knob table that say so.
HLO_OVERLAP_KNOBS = knobs_of(HLO_OVERLAP)


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
        "--output",
        metavar="FILE",
        help="also write the JSON reports to FILE (rewritten as each program of a preset compiles)",
    )
    parser.add_argument(
        "--summary-only", action="store_true", help="leave out the per-collective rows"
    )
    add_target_arguments(parser)
    notes = {"ENGINE": "; its programs are compiled as aot does"}
    add_knob_flags(parser, HLO_OVERLAP_KNOBS, notes)


def run(args) -> int:
    """Exit 0 when every report was made, 1 when a program of a preset did not compile (the
    others are reported), 2 for bad input."""
    if args.output is not None:
        check_output_file(args.output, "--output")  # before the compiles, which take minutes
    if not args.file:
        return compiled_reports(args)
    reports = file_reports(args)
    write_output(args, reports)
    if args.json:
        print_to_a_pipe(as_json(reports))
    else:
        print_to_a_pipe("\n\n".join(render(r, args) for r in reports))
    return 0


def file_reports(args) -> list:
    path = Path(args.file)
    if not path.is_file():
        raise UserError(f"FILE.hlo: {args.file!r} does not exist; pass an HLO text file")
    mesh = parse_mesh(args.mesh) if args.mesh else None
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UserError(f"{args.file}: cannot read ({error.strerror})") from None
    return analyze_file(data, str(path), mesh, Path(path.name.removesuffix(".gz")).stem)


def compiled_reports(args) -> int:
    """The report of each program of the preset, printed as soon as it is compiled (the text
    form: a full-depth compile takes minutes a program); a program that does not compile is named
    with its error, on stdout among the reports and on stderr, and the others still run."""
    # JAX from here on: `hlo-overlap --help`, and a FILE's report, answer without it
    from rl_trainer_bench.preflight.aot.check import compiled_texts

    choice = choose_engine(args.engine, args.trainer_argv, preset(args.preset).engine)
    texts = compiled_texts(
        args.preset,
        args.target,
        args.layers,
        choice.spec,
        trainer_argv=args.trainer_argv,
        engine_flags=args.engine_flags,
    )
    flags = compiler_flags(args.target != LOCAL)
    reports, failures, shown = [], [], []
    with quiet_libtpu():  # libtpu's start-up noise when compiling for a TPU slice
        for name, text, mesh, error in texts:
            if text is None:
                failures.append(f"program {name} did not compile for {args.target}: {error}")
                print(f"rl-trainer-bench hlo-overlap: {failures[-1]}", file=sys.stderr, flush=True)
                block = failures[-1]
            else:
                report = analyze_text(text, name, mesh, name)
                reports.append(dataclasses.replace(report, compiler_flags=flags))
                write_output(args, reports)  # a later program's long compile loses nothing
                block = render(reports[-1], args)
            if not args.json:  # a blank line between blocks, as the file's reports are joined
                if not print_to_a_pipe(f"\n{block}" if shown else block):
                    return 0  # the reader has all it wanted: no more minutes of compiling
                shown.append(name)
    if args.json:
        print_to_a_pipe(as_json(reports))
    return 1 if failures else 0


def render(report, args) -> str:
    return format_report(report, details=not args.summary_only)


def as_json(reports) -> str:
    return json.dumps([r.to_json() for r in reports], indent=1)


def write_output(args, reports) -> None:
    if args.output is not None:
        write_text_atomically(Path(args.output), as_json(reports) + "\n")


def print_to_a_pipe(text: str) -> bool:
    """Print `text`; False when the reader closed the pipe early (`| head`): it has all it wanted,
    which is not an error."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python would report the broken pipe again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return False
    return True
