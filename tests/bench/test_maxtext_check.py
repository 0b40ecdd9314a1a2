"""The trainer's MaxText keys checked before launch by MaxText's own config validation (here the
stand-in's, which refuses an unknown key as maxtext 0.2.5 does), and what the plan says about it."""

from __future__ import annotations

import pytest
from maxtext_stand_in import MODEL_CONFIGS, initialize

from rl_trainer_bench import cli
from rl_trainer_bench.ab import command as ab_command
from rl_trainer_bench.ab.plan import plan_arms
from rl_trainer_bench.bench import engine_plan, maxtext_check, plan
from rl_trainer_bench.config.knobs import BenchConfig
from rl_trainer_bench.errors import ConfigError

STAND_IN = maxtext_check.ConfigBuilder(
    version="0.2.5-stand-in",
    model_config=lambda name: MODEL_CONFIGS.get(name, {}),
    build=lambda words: initialize(["", *words]),
    refused=ValueError,
)


def _config(extra_flags: str, **knobs: str) -> BenchConfig:
    argv = f"MAXTEXT_EXTRA_FLAGS='{extra_flags}' python -m app.trainer --trainer_backend=maxtext"
    # for a TPU slice: no CPU host keys (the CPU's ring of experts) come between
    environment = {"PRESET": "cpu-tiny-qwen3.5", "TRAINER_ARGV": argv, "TRAINER_SLICE": "v5p:2x2x2"}
    return BenchConfig.from_env({**environment, **knobs})


@pytest.fixture
def stand_in_maxtext(monkeypatch):
    """The stand-in as the installed MaxText, checked in this process (the child process a real
    check runs in imports the installed MaxText, which CI does not have)."""
    monkeypatch.setattr(maxtext_check, "installed_builder", lambda: STAND_IN)
    monkeypatch.setattr(
        maxtext_check,
        "check_apart",
        lambda engine, platform, flag_keys: maxtext_check.check_trainer_keys(
            engine, platform, "/r", STAND_IN, flag_keys
        ),
    )


def _rows(config: BenchConfig, rendering: bool = False) -> dict[str, str]:
    return dict(plan.resolve(config, rendering=rendering).engine_facts)


def test_keys_maxtext_takes_are_accepted_and_the_plan_names_its_version(stand_in_maxtext):
    rows = _rows(_config("ragged_buffer_factor=2.0 remat_policy=full"))
    assert rows["maxtext"] == "maxtext 0.2.5-stand-in, installed here"
    assert rows["maxtext config"].startswith("maxtext 0.2.5-stand-in built its config from")
    assert rows["maxtext config"].endswith(
        "(the trainer's 2 last) with its own validation, on no device: accepted"
    )


def test_a_key_maxtext_refuses_is_one_line_naming_it_and_the_version(stand_in_maxtext):
    with pytest.raises(ConfigError) as raised:
        plan.resolve(_config("ragged_buffer_factor=2.0 retry_when_tokens_dropped=true"))
    message = str(raised.value)
    assert message.startswith(
        "this host's maxtext 0.2.5-stand-in refuses 1 of the trainer's MaxText keys:"
        " retry_when_tokens_dropped=true (unknown MaxText config keys: ['retry_when_tokens_dropped'])"
    )
    assert "\n" not in message and "ragged_buffer_factor" not in message


def test_every_refused_key_is_named_and_a_rule_is_put_on_the_keys_that_break_it(stand_in_maxtext):
    with pytest.raises(ConfigError) as raised:
        # two unknown keys, and a ring of experts with a finite buffer but no ragged sort
        keys = "gdn=remat ragged_buffer_factor=2.0 use_ring_of_experts=true use_gdn_kernel=true"
        plan.resolve(_config(keys))
    message = str(raised.value)
    assert "refuses 4 of the trainer's MaxText keys: gdn=remat (unknown MaxText" in message
    assert "; use_gdn_kernel=true (unknown MaxText config keys: ['use_gdn_kernel'])" in message
    rule = "(Ragged buffer factor with ring of experts needs use_ragged_sort=True)"
    assert (
        f"; ragged_buffer_factor=2.0 {rule}; use_ring_of_experts=true {rule} (a trainer" in message
    )


def test_keys_engine_flags_set_are_named_as_theirs_not_the_trainers(stand_in_maxtext):
    config = _config(
        "ragged_buffer_factor=2.0", ENGINE_FLAGS="maxtext.retry_when_tokens_dropped=true"
    )
    with pytest.raises(ConfigError) as raised:
        plan.resolve(config)
    message = str(raised.value)
    assert message.startswith(
        "this host's maxtext 0.2.5-stand-in refuses 1 of the MaxText keys set as maxtext.KEY in"
        " ENGINE_FLAGS (where an A/B arm's keys go), not the trainer's:"
        " retry_when_tokens_dropped=true (unknown MaxText config keys:"
    )
    assert "trainer's MaxText keys" not in message and "MAXTEXT_EXTRA_FLAGS" not in message


def test_an_arms_refused_keys_are_named_as_the_arms(stand_in_maxtext, tmp_path):
    argv = "MAXTEXT_EXTRA_FLAGS='remat_policy=full' python -m app.trainer --trainer_backend=maxtext"
    words = ["ab", "--preset", "cpu-tiny-qwen3.5", "--out", str(tmp_path), "--engine", "maxtext"]
    words += ["--arms", "base:maxtext.remat_policy=minimal,tuned:maxtext.gdn=remat"]
    words += ["--knob", f"TRAINER_ARGV={argv}", "--knob", "TRAINER_SLICE=v5p:2x2x2"]
    args = cli.build_parser(["ab"]).parse_args(words)
    with pytest.raises(ConfigError) as raised:
        plan_arms(args, ab_command.complete(args), tmp_path, on_this_host=False)
    assert str(raised.value).startswith(
        "--arms: arm tuned: this host's maxtext 0.2.5-stand-in refuses 1 of the MaxText keys set"
        " as maxtext.KEY in ENGINE_FLAGS (where an A/B arm's keys go), not the trainer's: gdn=remat"
    )


def test_the_renderer_leaves_the_check_to_the_pod_and_a_host_without_maxtext_says_so():
    config = _config("retry_when_tokens_dropped=true")
    rendered = _rows(config, rendering=True)
    assert rendered["maxtext"].startswith("the trainer's image's, expected there")
    assert rendered["maxtext config"] == maxtext_check.IN_THE_POD
    here = _rows(config)  # this test environment has no maxtext
    assert here["maxtext config"] == "not checked: MaxText is not importable here"
    assert (
        here["loss"]
        == f"{engine_plan.MAXTEXT_LOSS} (MAXTEXT_DRIVER=auto: tunix is not installed here)"
    )
    assert rendered["loss"].startswith("Tunix's GRPO loss")
    assert "checked in the pod: a pod whose image lacks Tunix's worker" in rendered["loss"]


def test_a_config_refused_whatever_trainer_key_is_left_out_is_put_on_the_bench(stand_in_maxtext):
    # maxtext 0.2.5 chunks tokens only in its ring of experts; two chunks come from ENGINE_FLAGS
    with pytest.raises(ConfigError) as raised:
        plan.resolve(_config("remat_policy=full", ENGINE_FLAGS="num_moe_token_chunks=2"))
    assert str(raised.value).startswith(
        "this host's maxtext 0.2.5-stand-in refuses the config the bench builds for this cell, whichever"
        " trainer key is left out (num_moe_token_chunks > 1 requires use_ring_of_experts=True.:"
        " set the engine keys it names through ENGINE_FLAGS, or another PRESET)"
    )


def test_the_check_runs_apart_and_its_verdict_comes_back_as_one_line():
    """The child process gets the engine config and answers one line; here it has no MaxText."""
    engine = plan.resolve(_config("remat_policy=full")).engine
    with pytest.raises(ConfigError, match=r"^MaxText is not importable in the check's process$"):
        maxtext_check.check_apart(engine, "tpu")
