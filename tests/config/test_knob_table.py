"""The knob table drives every surface: each row's formatter is its parser's inverse, and each
command's knob flags, the renderer's pass-through knobs, the names it reserves and the pod's exports
are exactly the rows that say so."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rl_trainer_bench import cli
from rl_trainer_bench.chips.accelerators import TPU_CHIPS, TpuSlice
from rl_trainer_bench.config.knobs import (
    AB,
    AOT,
    CHECK,
    CHECK_ENGINE,
    DRIVER_KNOBS,
    HLO_OVERLAP,
    KNOBS,
    PAYLOAD,
    RENDER,
    SURFACES,
    driver_knobs,
    knobs_of,
)
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch.client_command import ClientCommand
from rl_trainer_bench.launch.knobs import RENDER_KNOBS, RenderKnobs
from rl_trainer_bench.launch.render import driver_environment
from rl_trainer_bench.preflight import aot_job_pod

V5P = next(chip for chip in TPU_CHIPS if chip.name == "v5p")
BUILT_IN = "rl_trainer_bench.engine.builtin.jax_engine:JaxEngine"

# (typed value, the text the row writes for it) for every knob: values a run holds, written here,
# never produced by the parser under test.
SAMPLES = {
    "PRESET": [
        (PRESETS["cpu-tiny"], "cpu-tiny"),
        (PRESETS["qwen3.5-397b-cell"], "qwen3.5-397b-cell"),
    ],
    "STEPS": [(1, "1"), (100_000, "100000")],
    "WARMUP_STEPS": [(2, "2")],
    "MICRO_STEPS": [(4_096, "4096")],
    "DISTINCT_MICRO_BATCHES": [(9, "9")],
    "STAGE_BEFORE_UPDATE": [(True, "on"), (False, "off")],
    "STAGE_AFTER_UPDATE": [(True, "on")],
    "STAGE_ISSUE": [("before_last", "before_last")],
    "PROFILE_STEPS": [((3, 3), "3:3"), ((0, 12), "0:12")],
    "MEASURE_PEAK": [(True, "on"), (False, "off")],
    "RESULTS_DIR": [(Path("out/bench results"), "out/bench results")],
    "RESULTS_URI": [
        ("gs://bucket/runs/a b", "gs://bucket/runs/a b"),
        ("/mnt/disk/x", "/mnt/disk/x"),
    ],
    "COMPILE_CACHE": [("off", "off"), ("/mnt/disk/xla cache", "/mnt/disk/xla cache")],
    "ROUTING_PROFILE": [("profiles/r.json", "profiles/r.json")],
    "SEED": [(0, "0"), (2**64 - 1, "18446744073709551615")],
    "TRAINER_ARGV": [
        ((), ""),
        (("A=1", "python", "-m", "app", "--x=a b"), "A=1 python -m app '--x=a b'"),
        (("--q=it's",), '"--q=it\'s"'),
        (("--q=it's $HOME `id`",), "'--q=it'\"'\"'s $HOME `id`'"),
        (("",), "''"),
    ],
    "ENGINE_FLAGS": [("beta=0.04,k={'max_norm': 0.5}", "beta=0.04,k={'max_norm': 0.5}")],
    "ORCH_ARGV": [(("--batch_size=8", "--note=a\nb"), "--batch_size=8 '--note=a\nb'")],
    "WORKER": [("fused", "fused")],
    "ENGINE": [(BUILT_IN, BUILT_IN)],
    "MAXTEXT_DRIVER": [("tunix", "tunix")],
    "TRAINER_SLICE": [(TpuSlice(V5P, "4x8x8"), "v5p:4x8x8")],
    "PLAN_ONLY": [(True, "on")],
}


def test_every_row_has_samples():
    assert set(SAMPLES) == set(DRIVER_KNOBS)


@pytest.mark.parametrize(
    ("name", "value", "text"),
    [(name, value, text) for name, pairs in SAMPLES.items() for value, text in pairs],
)
def test_a_rows_formatter_writes_the_text_its_parser_reads_back_as_the_value(name, value, text):
    knob = DRIVER_KNOBS[name]
    assert knob.format(value) == text
    assert knob.parse(name, text) == value


@settings(max_examples=300, deadline=None)
@example(["it's $HOME", "a`b'c", 'say "it\'s"'])
@given(st.lists(st.text(st.characters(exclude_characters="\0", exclude_categories=("Cs",)))))
def test_any_shell_words_round_trip_through_their_rows(words):
    for name in ("TRAINER_ARGV", "ORCH_ARGV"):
        knob = DRIVER_KNOBS[name]
        assert knob.parse(name, knob.format(tuple(words))) == tuple(words)


def test_rows_name_only_known_surfaces_and_defaults_only_for_their_own_surfaces():
    for knob in KNOBS:
        assert knob.surfaces <= set(SURFACES), knob.name
        assert set(knob.command_defaults) <= knob.surfaces, knob.name


def _knob_flags(command: str) -> dict[str, argparse.Action]:
    """{flag: action} of `command`'s flags that are spelt as a driver knob's."""
    parser = cli.build_parser([command])
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    spellings = {knob.flag for knob in KNOBS}
    return {
        flag: action
        for action in commands.choices[command]._actions
        for flag in action.option_strings
        if flag in spellings
    }


def _declaring(surface: str) -> set[str]:
    return {knob.flag for knob in KNOBS if surface in knob.surfaces}


def test_run_takes_every_row_and_the_driver_reads_every_row():
    assert set(_knob_flags("run")) == {knob.flag for knob in KNOBS}
    env = {knob.name: "x" for knob in KNOBS} | {"HOME": "/root", "XLA_FLAGS": "--a"}
    assert set(driver_knobs(env, argparse.Namespace())) == set(DRIVER_KNOBS)


# --preset is every cell command's own flag (`add_preset_flag`); ab's --engine is its shorthand
# for --knob ENGINE=... (every arm's knobs), not the row's flag.
_OWN_FLAGS = {AB: {"--preset", "--engine"}}
# The knob flags each command takes, written out: a row that loses a command's surface, or a
# command that stops reading the table, drops a flag from this list's command.
_TAKEN = {
    AB: {"--steps", "--warmup-steps", "--compile-cache"},
    AOT: {
        "--micro-steps",
        "--stage-before-update",
        "--routing-profile",
        "--seed",
        "--trainer-argv",
        "--engine-flags",
        "--engine",
    },
    CHECK_ENGINE: {"--trainer-argv", "--engine-flags", "--engine", "--maxtext-driver"},
    HLO_OVERLAP: {"--trainer-argv", "--engine-flags", "--engine"},
    PAYLOAD: {"--routing-profile", "--seed"},
    CHECK: {"--routing-profile", "--seed"},
}
_COMMANDS = [surface for surface in SURFACES if surface != RENDER]


def test_every_command_surface_is_written_out_here():
    assert set(_TAKEN) == set(_COMMANDS)


@pytest.mark.parametrize("command", _COMMANDS)
def test_each_command_takes_exactly_the_rows_that_declare_it_with_the_rows_help_and_defaults(
    command,
):
    flags = _knob_flags(command)
    taken = set(flags) - _OWN_FLAGS.get(command, {"--preset"})
    assert taken == _declaring(command) == _TAKEN[command]
    for knob in (k for k in KNOBS if command in k.surfaces):
        action = flags[knob.flag]
        assert action.help.startswith(knob.help), knob.name
        if command in knob.command_defaults:
            assert action.default is None
            assert action.help.endswith(f"(default: {knob.command_defaults[command]})")
        else:
            assert action.default == knob.read({})


def test_the_aot_job_passes_each_command_the_knob_flags_its_parser_takes():
    for name, command in aot_job_pod.COMMANDS.items():
        flags = {DRIVER_KNOBS[knob].flag for knob in command.knobs}
        assert command.knobs == knobs_of(name)
        assert flags == set(_knob_flags(name)) - {"--preset"} == _TAKEN[name]


def test_abs_warm_up_default_is_the_rows():
    help_text = _knob_flags("ab")["--warmup-steps"].help
    assert help_text.endswith(
        "(default: the most any arm's engine needs: 2 for MaxText's, which compiles its metric"
        " ops in the step after the first; else 1)"
    )


def test_the_renderer_passes_through_exactly_the_rows_that_declare_it():
    render_flags = {knob.flag for knob in RENDER_KNOBS}
    assert render_flags & {knob.flag for knob in KNOBS} == _declaring(RENDER)
    for knob in (k for k in RENDER_KNOBS if k.env in DRIVER_KNOBS):
        row = DRIVER_KNOBS[knob.env]
        assert knob.description.startswith(f"passed to the pod's driver: {row.help}")


@pytest.mark.parametrize("name", [k.name for k in KNOBS if RENDER in k.surfaces])
def test_driver_env_may_not_set_a_pass_through_knob(name):
    with pytest.raises(UserError, match=f"DRIVER_ENV sets {name}, which the renderer sets"):
        RenderKnobs.from_strings({"driver_env": f"{name}=1"})


def test_driver_env_may_set_the_knobs_the_renderer_does_not_pass_through():
    pairs = " ".join(f"{k.name}=1" for k in KNOBS if RENDER not in k.surfaces)
    assert [name for name, _ in RenderKnobs.from_strings({"driver_env": pairs}).driver_env] == [
        "PRESET",
        "WARMUP_STEPS",
        "DISTINCT_MICRO_BATCHES",
        "STAGE_BEFORE_UPDATE",
        "STAGE_AFTER_UPDATE",
        "STAGE_ISSUE",
        "MEASURE_PEAK",
        "RESULTS_DIR",
        "ROUTING_PROFILE",
        "SEED",
        "WORKER",
        "MAXTEXT_DRIVER",
        "PLAN_ONLY",
    ]


def test_the_pods_exports_are_the_rows_texts_of_the_given_pass_through_knobs():
    given = {
        "steps": " 7 ",
        "micro_steps": "4",
        "profile_steps": "2 - 3",
        "results_uri": "gs://bucket/x",
        "trainer_argv": "A=1 python -m app --x='a b'",
        "engine_flags": "beta=0.04,b=1",
        "orch_argv": "--batch_size=8",
        "engine": "builtin",
        "trainer_slice": "v5p:4x8x8",
    }
    launch = ClientCommand(env={"X": "1"}, program=["python", "-m", "trainer"], argv=[])
    environment = driver_environment(launch, RenderKnobs.from_strings(given), None, "sha")
    assert environment == {
        "BENCH_CODE_SHA256": "sha",
        "X": "1",
        "STEPS": "7",
        "MICRO_STEPS": "4",
        "PROFILE_STEPS": "2:3",
        "RESULTS_URI": "gs://bucket/x",
        "TRAINER_ARGV": "A=1 python -m app '--x=a b'",
        "ENGINE_FLAGS": "beta=0.04,b=1",
        "ORCH_ARGV": "--batch_size=8",
        "ENGINE": BUILT_IN,
        "TRAINER_SLICE": "v5p:4x8x8",
    }
