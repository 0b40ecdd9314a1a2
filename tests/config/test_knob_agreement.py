"""One table per knob: the renderer, the driver, the CLI and `aot` read every knob the same way."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rl_trainer_bench.config.engine_keys import (
    engine_config_from,
    format_engine_flags,
    parse_engine_flags,
)
from rl_trainer_bench.config.knobs import (
    DRIVER_KNOBS,
    KNOBS,
    BenchConfig,
    add_driver_knob_arguments,
    driver_knobs,
    misspelt_knob,
)
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.errors import ConfigError, UserError
from rl_trainer_bench.launch import knobs as render_knobs
from rl_trainer_bench.launch.client_command import ClientCommand
from rl_trainer_bench.launch.render import driver_environment

PASS_THROUGH = [knob.env for knob in render_knobs.RENDER_KNOBS if knob.env in DRIVER_KNOBS]
_ANY_TEXT = st.text(st.characters(exclude_characters="\0", exclude_categories=("Cs",)), max_size=30)
# Values shaped like each knob's forms, so the property meets accepted values often, not by luck.
_SHAPED = st.one_of(
    st.integers(-3, 400).map(str),
    st.tuples(st.integers(0, 30), st.sampled_from([":", "-", ",", " : "]), st.integers(0, 30)).map(
        lambda t: f"{t[0]}{t[1]}{t[2]}"
    ),
    st.sampled_from(["²", "٣", "1e3", "+4", " 7 ", "0x10", "3:2", "--a=1 'b c'", "'open"]),
    st.sampled_from(
        ["v5p:4x8x8", "tpu7x:4x4x8", "v5e:2x4", "v9:1x1", "v5p:3", "V6E:2x2", "v5p:٢x2x2"]
    ),
    st.lists(
        st.tuples(
            st.from_regex(r"[a-z_][a-z0-9_.]{0,8}", fullmatch=True),
            st.one_of(_ANY_TEXT, st.sampled_from(["{'max_norm': 0.5}", "a b", "x,y", "'q'"])),
        ),
        max_size=3,
    ).map(lambda pairs: " ".join(f"{k}={v}" for k, v in pairs)),
)


def _rendered_value(knob: str, text: str):
    """What the pod's driver reads for `knob` after the renderer took `text`; ConfigError refused."""
    knobs = render_knobs.RenderKnobs.from_strings({knob.lower(): text})
    launch = ClientCommand(env={}, program=["python", "-m", "trainer"], argv=[])
    environment = driver_environment(launch, knobs, None, "sha")
    return _driver_value(knob, environment)


def _driver_value(knob: str, env: dict[str, str]):
    value = DRIVER_KNOBS[knob].read(env)
    if knob == "ENGINE_FLAGS":  # kept as text; its meaning is the parsed pairs
        return parse_engine_flags(value or "")
    return value if value is not None else DRIVER_KNOBS[knob].read({})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knob=st.sampled_from(PASS_THROUGH), text=st.one_of(_SHAPED, _ANY_TEXT))
@example(knob="PROFILE_STEPS", text="2-3")
@example(knob="PROFILE_STEPS", text="1,3")
@example(knob="STEPS", text="²")
@example(knob="ENGINE_FLAGS", text="optimizer_chain_kwargs={'max_norm': 0.5} beta=0.1")
@example(knob="ENGINE_FLAGS", text='a=\'x "y\' b="p q"')
@example(knob="ENGINE_FLAGS", text="a=\"x' b=1")
def test_the_renderer_accepts_a_pass_through_value_iff_the_driver_does_with_the_same_meaning(
    knob, text
):
    try:
        direct = _driver_value(knob, {knob: text})
    except ConfigError:
        direct = ConfigError
    try:
        rendered = _rendered_value(knob, text)
    except UserError:
        rendered = ConfigError
    assert rendered == direct


def test_pass_through_knobs_are_the_ones_the_pod_reads():
    assert set(PASS_THROUGH) == {
        "ENGINE",
        "STEPS",
        "MICRO_STEPS",
        "PROFILE_STEPS",
        "TRAINER_ARGV",
        "ORCH_ARGV",
        "ENGINE_FLAGS",
        "TRAINER_SLICE",
        "RESULTS_URI",
        "COMPILE_CACHE",
    }


@pytest.mark.parametrize("form", ["2:3", "2-3", "2 - 3"])
def test_profile_window_forms_mean_the_same_window_everywhere(form):
    env = {"PROFILE_STEPS": form, "STEPS": "4"}
    assert BenchConfig.from_env(env).profile_steps == (2, 3)
    rendered = render_knobs.RenderKnobs.from_strings({"profile_steps": form})
    assert rendered.passed("PROFILE_STEPS") == (2, 3)


def test_engine_flags_with_a_spaced_dict_parse_the_same_in_run_and_aot():
    text = "optimizer_chain_kwargs={'max_norm': 0.5} beta=0.1"
    config = BenchConfig.from_env({"ENGINE_FLAGS": text})
    preset = PRESETS["cpu-tiny"]
    in_run, _ = engine_config_from(preset, config.trainer_argv, config.engine_flags)
    in_aot, _ = engine_config_from(preset, "", text)  # what `aot --engine-flags` passes
    assert in_run == in_aot
    assert in_run.optimizer.max_grad_norm == 0.5 and in_run.loss.beta == 0.1


@given(
    st.dictionaries(
        st.from_regex(r"[a-z_][a-z0-9_.]{0,8}", fullmatch=True),
        st.text(st.sampled_from("ab {}'\", \t"), max_size=8)
        | st.text(st.characters(exclude_characters="\0", exclude_categories=("Cs",)), max_size=12),
        max_size=4,
    )
)
@settings(max_examples=200, deadline=None)
def test_formatted_engine_flags_read_back_as_written(pairs):
    def needs_quoting(v: str) -> bool:
        plain = v and not re.search(r"[\s,]", v) and v[0] not in "\"'{"
        return not plain and not re.fullmatch(r"\{[^}]*\}", v)

    unrepresentable = [v for v in pairs.values() if '"' in v and "'" in v and needs_quoting(v)]
    if unrepresentable:  # needs quoting but holds both quote characters
        with pytest.raises(ConfigError, match="no ENGINE_FLAGS form carries it"):
            format_engine_flags(pairs.items())
        return
    assert parse_engine_flags(format_engine_flags(pairs.items())) == pairs


@pytest.mark.parametrize(
    ("name", "nearest"),
    [
        ("MICROSTEPS", "MICRO_STEPS"),
        ("micro_steps", "MICRO_STEPS"),
        ("MICRO_STEP", "MICRO_STEPS"),
        ("STAGE_BEFORE_UPDATES", "STAGE_BEFORE_UPDATE"),
        ("STAGE_BEFORE_UPDA", "STAGE_BEFORE_UPDATE"),  # two letters short: the most allowed
        ("RESULT_DIR", "RESULTS_DIR"),
        ("TRAINER_ARGS", "TRAINER_ARGV"),
        ("seed", "SEED"),
    ],
)
def test_names_close_to_a_knob_are_taken_for_typos(name, nearest):
    assert misspelt_knob(name) == nearest
    with pytest.raises(ConfigError, match=f"{name} is not a knob: did you mean {nearest}\\?"):
        driver_knobs({name: "3"}, argparse.Namespace())


def test_a_pods_own_environment_is_not_taken_for_typos():
    """Names a trainer pod carries (Kubernetes, TPU runtime, the trainer's own) pass untouched."""
    pod = [
        "HOME", "PATH", "HOSTNAME", "PWD", "LANG", "TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES",
        "JOBSET_NAME", "REPLICATED_JOB_NAME", "JOB_INDEX", "JOB_COMPLETION_INDEX",
        "KUBERNETES_SERVICE_HOST", "LIBTPU_INIT_ARGS", "MAX_GRAD_NORM", "PYTHONUNBUFFERED",
        "CHECKPOINT_ASYNC", "ROLLOUT_MESH_TP", "VERIFY_WEIGHTS", "FLOAT32_LOGITS", "XLA_FLAGS",
        "JAX_PLATFORMS", "BENCH_CODE_DIR", "BENCH_CODE_SHA256", "PYTHONPATH", "STEP_ID", "SEEDS",
    ]  # fmt: skip
    assert [name for name in pod if misspelt_knob(name)] == []


def test_a_misspelt_knob_in_driver_env_is_refused_at_render_time():
    with pytest.raises(ConfigError, match="WORKERS is not a knob: did you mean WORKER\\?"):
        render_knobs.RenderKnobs.from_strings({"driver_env": "WORKERS=fused"})


def test_every_knob_has_one_flag_and_its_help_names_the_default():
    parser = argparse.ArgumentParser()
    add_driver_knob_arguments(parser)
    help_text = " ".join(parser.format_help().split())
    for knob in KNOBS:
        assert knob.flag in help_text
        if knob.default:
            assert f"(default {knob.default})" in help_text


def test_every_knob_is_a_bench_config_field_with_the_knobs_default():
    """BenchConfig is derived from the table: a row without a field, or a field without a row,
    fails here; the defaults are the ones written in the table."""
    fields = {f.name: f for f in dataclasses.fields(BenchConfig)}
    derived = {
        "preset_source",
        "engine_source",
        "step_shape",
        "micro_steps_source",
        "resolved_engine",
    }
    assert {knob.dest for knob in KNOBS} | derived == set(fields)
    config = BenchConfig(preset=PRESETS["cpu-tiny"])
    assert (config.steps, config.warmup_steps, config.seed, config.worker) == (5, 1, 0, "separate")
    assert config.results_dir == Path("bench_results") and config.trainer_argv == ()
    assert config.micro_steps == PRESETS["cpu-tiny"].micro_steps
    assert config.distinct_micro_batches == config.micro_steps + 1


def test_the_config_line_names_every_logged_knob_in_table_order():
    env = {"STAGE_BEFORE_UPDATE": "on", "PROFILE_STEPS": "1:2", "TRAINER_ARGV": "--a 'b c'"}
    described = BenchConfig.from_env(env).describe()
    assert list(described) == [
        "PRESET",
        "STEPS",
        "WARMUP_STEPS",
        "MICRO_STEPS",
        "DISTINCT_MICRO_BATCHES",
        "STAGE",
        "PROFILE_STEPS",
        "MEASURE_PEAK",
        "RESULTS_DIR",
        "RESULTS_URI",
        "COMPILE_CACHE",
        "ROUTING_PROFILE",
        "SEED",
        "TRAINER_ARGV",
        "ENGINE_FLAGS",
        "ORCH_ARGV",
        "WORKER",
        "ENGINE",
        "MAXTEXT_DRIVER",
    ]
    assert described["STAGE"] == "before_update(issue=auto)"
    assert described["PROFILE_STEPS"] == "1:2" and described["TRAINER_ARGV"] == "--a 'b c'"
    assert described["ROUTING_PROFILE"] == "-" and described["ENGINE_FLAGS"] == "-"


def _subcommand_flags():
    """(command, flag, argparse action) for every flag of every `rl-trainer-bench` command."""
    from rl_trainer_bench import cli

    parser = cli.build_parser(command.name for command in cli.COMMANDS)
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        for action in sub._actions:
            for flag in action.option_strings:
                yield name, flag, action


def test_a_flag_named_after_a_knob_is_declared_by_its_row_in_every_command():
    """--engine, --trainer-argv, --engine-flags, --seed, ... mean one thing wherever they appear:
    the row's help, and its default (or none where the environment supplies it: `run`). The
    renderer's knobs have their own table (`launch/knobs.py`; the pass-through ones are checked
    above), and the knobs `ab` owns for every arm (`arms.RESERVED_KNOBS`) are its own flags."""
    from rl_trainer_bench.ab.arms import RESERVED_KNOBS

    by_flag = {knob.flag: knob for knob in KNOBS}
    seen = set()
    for command, flag, action in _subcommand_flags():
        knob = by_flag.get(flag)
        if knob is None or flag == "--preset" or command == "render":
            continue
        if command == "ab" and knob.name in RESERVED_KNOBS:
            continue
        seen.add((command, flag))
        assert knob.help in action.help, (command, flag)
        if command == "run":
            assert action.default is None
        elif command != "ab":  # ab's --engine adds ENGINE=... to every arm's knobs
            assert action.default == knob.read({}), (command, flag)
    for command in ("check-engine", "aot"):
        assert {(command, f) for f in ("--engine", "--trainer-argv", "--engine-flags")} <= seen


def test_every_preset_flag_has_the_one_default():
    """The commands that time a cell on this host (run, ab) leave it unset, for the host's
    default (its one TPU chip's preset, else cpu-tiny); the others default to cpu-tiny."""
    presets = [(c, a) for c, flag, a in _subcommand_flags() if flag == "--preset"]
    assert {c for c, _ in presets} >= {"payload", "check", "check-engine", "aot", "ab", "run"}
    for command, action in presets:
        expected = None if command in ("run", "ab") else "cpu-tiny"
        assert action.default == expected, command
        if command in ("run", "ab"):
            assert "one TPU chip its one-chip preset (tpu-v5e-1 on v5e, tpu-v6e-1 on v6e)" in (
                action.help
            )
