"""Hostile argv and knob values at every command: exit 0, 1 or 2, one line, no half-written file.

Words are drawn from each command's own flags and choices and from a pool of values users get
wrong (Unicode digits, reversed ranges, paths that are folders, binary or gzipped files, missing
folders). Device work is out of scope here: the first call that would start it raises
`ReachedDeviceWork`, so each example tests what the command decides before any compile. The
example count and the tally of outcomes: `fuzz_support` (an argv that reaches device work counts
as accepted, exit 0).
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import pytest
from fuzz_support import EXAMPLES, TALLY, write_tally
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rl_trainer_bench import cli

FIXTURE = Path(__file__).resolve().parent / "testdata" / "launch_dryrun_fixture.yaml"

COMMANDS = ("payload", "check", "check-engine", "aot", "config-diff", "render-diff", "run", "ab")


class ReachedDeviceWork(BaseException):
    """Raised where a command would start device work: every check before it has passed."""


class _Stop:
    """Stands in for each start of device work, a function or an engine class: calling it stops."""

    def __init__(self, *_args, **_kwargs):
        raise ReachedDeviceWork


# In place of the built-in engine class it must sit in that engine's module, where `aot` looks up
# the lowering functions it compiles from.
_Stop.__module__ = "rl_trainer_bench.engine.builtin.jax_engine"


DEVICE_WORK = (
    "rl_trainer_bench.bench.distributed.initialize_runtime",
    "rl_trainer_bench.preflight.aot.check.compile_programs",
    "rl_trainer_bench.payload.engine_numerics.check_numerics",
    "rl_trainer_bench.preflight.check_engine.check_engine",
    "rl_trainer_bench.engine.builtin.jax_engine.JaxEngine",
)


@pytest.fixture(scope="module", autouse=True)
def tally():
    yield
    write_tally()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Inputs of every kind a path argument may be handed."""
    root = tmp_path_factory.mktemp("inputs")
    made = {
        "empty": root / "empty.yaml",
        "binary": root / "binary.bin",
        "gzip": root / "flags.txt.gz",
        "text": root / "flags.txt",
        "yaml": root / "config.yaml",
        "folder": root / "folder",
        "regular": root / "regular",
    }
    made["empty"].write_text("")
    made["binary"].write_bytes(bytes(range(256)) * 4)
    made["gzip"].write_bytes(gzip.compress(b"beta=0.04\n"))
    made["text"].write_text("beta=0.04 seed=3\n")
    made["yaml"].write_text("beta: 0.04\nmesh_fsdp: 2\n")
    made["folder"].mkdir()
    made["regular"].write_text("a file where a folder belongs\n")
    return made


def _flag_words(command: str) -> list[str]:
    """The command's own option strings and choices, as its parser declares them."""
    parser = cli.build_parser([command])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    words: list[str] = []
    for action in sub.choices[command]._actions:
        words += [s for s in action.option_strings if s not in ("-h", "--help")]
        words += [str(choice) for choice in action.choices or ()]
    return words


def _values(files: dict[str, Path], out: Path) -> list[str]:
    paths = [str(p) for p in files.values()]
    return [
        *paths,
        str(files["regular"] / "under-a-file.npz"),
        str(out / "missing-folder" / "x.json"),
        str(out / "result.json"),
        str(out / "mb.npz"),
        "/nonexistent/x.yaml",
        "",
        "-",
        "²",
        "٣",
        "0",
        "-1",
        "1",
        "2",
        "3:2",
        "1-2",
        "nan",
        "1e400",
        "on",
        "off",
        "maybe",
        "cpu-tiny",
        "no-such-preset",
        "v5e:2x2",
        "tpu9:1x1",
        "beta=0.04",
        "mesh_fsdp=3",
        "ragged_buffer_factor=0",
        "--mesh_fsdp=2",
        "{'max_norm': 1.0}",
        "off,on,off,on",
        "a=b=c",
        "\x00",
        "é" * 3,
    ]


def _usual_start(command: str, files: dict[str, Path], out: Path) -> list[str]:
    """Words that make a working command line, so the draws also reach past argument parsing."""
    return {
        "payload": ["--out", str(out / "mb.npz")],
        "check": ["--skip-numerics"],
        "check-engine": [],
        "aot": [],
        "config-diff": [str(files["yaml"]), str(files["text"])],
        "render-diff": [str(FIXTURE), str(FIXTURE)],
        "run": ["--steps", "1"],
        "ab": ["--steps", "1"],
    }[command]


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.startswith(".") or ".tmp" in p.name)


@pytest.mark.parametrize("command", COMMANDS)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_any_argv_ends_in_0_1_or_2_with_one_line_and_no_partial_file(
    command, files, tmp_path_factory, monkeypatch, data
):
    for target in DEVICE_WORK:
        monkeypatch.setattr(target, _Stop, raising=False)
    out = tmp_path_factory.mktemp("out")
    words = _values(files, out)
    pair = st.tuples(st.sampled_from(_flag_words(command)), st.sampled_from(words))
    extra = st.lists(
        st.one_of(pair.map(list), st.sampled_from(words).map(lambda w: [w])), max_size=4
    )
    start = data.draw(st.sampled_from([[], _usual_start(command, files, out)]), label="start")
    argv = start + [word for words_ in data.draw(extra, label="extra") for word in words_]
    env = data.draw(
        st.dictionaries(
            st.sampled_from(["STEPS", "MICRO_STEPS", "PROFILE_STEPS", "RESULTS_DIR", "SEED"]),
            st.sampled_from([w for w in words if "\x00" not in w]),
            max_size=2,
        ),
        label="env",
    )
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        patch.chdir(out)
        try:
            code = cli.main([command, *argv])
        except ReachedDeviceWork:
            event("accepted: reached device work")
            TALLY[command, 0] += 1
            return
    event(f"exit {code}")
    assert code in (0, 1, 2), (command, argv, env)
    TALLY[command, code] += 1
    assert _leftovers(out) == []
    if code == 2:
        assert not (out / "result.json").exists() and not (out / "mb.npz").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_refusals_are_one_line_that_names_the_command(command, files, capsys, monkeypatch):
    for target in DEVICE_WORK:
        monkeypatch.setattr(target, _Stop, raising=False)
    argv = {
        "payload": ["--out", str(files["regular"] / "x.npz"), "--seed", "²"],
        "check": ["--payload", str(files["binary"])],
        "check-engine": ["--engine", "no_such_module_here:Engine"],
        "aot": ["--preset", "no-such-preset"],
        "config-diff": [str(files["binary"]), "beta=0.04"],
        "render-diff": [str(files["gzip"]), str(files["folder"])],
        "run": ["--steps", "²"],
        "ab": ["--from-logs", str(files["binary"])],
    }[command]
    assert cli.main([command, *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("rl-trainer-bench"), err
    assert "Traceback" not in err and "internal error" not in err


@pytest.mark.parametrize("command", ["payload", "check"])
def test_a_routing_profile_that_is_not_text_is_one_line(command, files, capsys, tmp_path):
    argv = ["--routing-profile", str(files["binary"])]
    if command == "payload":
        argv += ["--out", str(tmp_path / "mb.npz")]
    assert cli.main([command, *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "not UTF-8 text" in err, err
    assert not (tmp_path / "mb.npz").exists()
