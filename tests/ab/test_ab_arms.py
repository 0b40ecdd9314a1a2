"""Arm specs from `--arms` and predictions from `--predict`: parsing, defaults and refusals."""

import os

import pytest

from rl_trainer_bench.ab import arms as ab_arms
from rl_trainer_bench.ab import order as run_orders
from rl_trainer_bench.ab import predict as ab_predict
from rl_trainer_bench.errors import UserError


def test_default_arms_run_in_blocks_with_numbered_repeats():
    arms = ab_arms.parse_arms(ab_arms.DEFAULT_ARMS)
    assert [a.label for a in arms[:6]] == ["off", "on", "on'", "off'", "on#3", "off#3"]
    assert [a.setting for a in arms[:6]] == ["off", "on", "on", "off", "on", "off"]
    assert len(arms) == 4 * run_orders.DEFAULT_BLOCKS
    assert arms[1].driver_knobs == {"STAGE_BEFORE_UPDATE": "on"}


def test_blocks_count_is_for_the_blocks_order_only():
    assert len(ab_arms.parse_arms("off,on", None, 3)) == 12
    assert len(ab_arms.parse_arms("off,on,after", run_orders.BLOCKS, 3)) == 18
    with pytest.raises(UserError, match=r"--blocks 3 sets the blocks of --order blocks.*mirrored"):
        ab_arms.parse_arms("off,on", "mirrored", 3)


@pytest.mark.parametrize(
    ("text", "order", "labels"),
    [
        ("off,on", "block", ["off", "on", "off'", "on'"]),
        ("off,on,after", "mirrored", ["off", "on", "after", "after'", "on'", "off'"]),
        ("off,on,after", "block", ["off", "on", "after", "off'", "on'", "after'"]),
        ("off,on,off,on", None, ["off", "on", "off'", "on'"]),  # written out: run as written
        ("off,on,on,off", "written", ["off", "on", "on'", "off'"]),
    ],
)
def test_orders(text, order, labels):
    assert [a.label for a in ab_arms.parse_arms(text, order)] == labels


def test_an_order_over_spelled_out_repeats_is_refused_with_the_fix():
    with pytest.raises(UserError, match=r"--order block: --arms repeats off.*--order written"):
        ab_arms.parse_arms("off,on,off,on", "block")


@pytest.mark.parametrize(
    ("settings", "cancels"),
    [
        (["a", "b", "b", "a"], True),
        (["a", "b", "c", "c", "b", "a"], True),
        (["a", "b", "a", "b"], False),
        (["a", "b", "b", "a", "b", "a", "a", "b"], True),
    ],
)
def test_balance_says_whether_an_order_cancels_a_linear_drift(settings, cancels):
    balance = run_orders.balance(settings)
    assert balance.cancels_linear_drift is cancels
    assert ("cancels" in balance.describe()) is cancels


def test_stage_switch_arms_share_programs():
    arms = ab_arms.parse_arms("off,on,after")
    assert len({a.program_knobs for a in arms}) == 1


def test_defined_arms_split_driver_knobs_and_engine_keys():
    arms = ab_arms.parse_arms(
        "base:ragged_buffer_factor=1.25,wide:ragged_buffer_factor=2,MICRO_STEPS=3,base,wide"
    )
    assert [a.label for a in arms] == ["base", "wide", "base'", "wide'"]
    wide = arms[1]
    assert wide.engine_keys == {"ragged_buffer_factor": "2"}
    assert wide.driver_knobs == {"MICRO_STEPS": "3"}
    assert arms[0].program_knobs != wide.program_knobs
    assert arms[3].program_knobs == wide.program_knobs


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("off", "two different settings"),
        ("off,,on", "empty arm"),
        ("off,fast", "unknown arm 'fast'"),
        ("STEPS=3,off,on", "has no arm"),
        ("a:STEPS=3,off", "set it with --steps"),
        ("a:X,off", "KEY=VALUE"),
        ("a:STAGE_BEFOR_UPDATE=on,off", "not a driver knob"),
        ("a:Mixed_Case=1,off", "UPPER_CASE driver knob or a lower_case engine key"),
        ("a:SEED=1,a:SEED=2", "defined twice"),
        ("on:SEED=1,off", "defined twice"),
        ("a:SEED=1,SEED=2,off", "sets SEED twice"),
        ("a-b:SEED=1,off", "must start with a letter"),
        # two knobs run together into one value, whatever joins them
        (
            "off,tuned:maxtext.a=b;maxtext.c=d",
            "one entry of ENGINE_FLAGS, with no ';' and no '=' outside",
        ),
        ("off,tuned:ragged_buffer_factor=2 num_moe_token_chunks=2", "one entry of ENGINE_FLAGS"),
        ("off,tuned:maxtext.remat_policy=full=x", "one entry of ENGINE_FLAGS"),
        ("off,tuned:maxtext.remat_policy=full custom", "one entry of ENGINE_FLAGS"),
        ("off,tuned:maxtext.a='b' maxtext.c=d", "one entry of ENGINE_FLAGS"),
        # keys checked against the engine's and the bench's own tables
        (
            "off,a:ragged_bufer_factor=2",
            r"not an engine key \(did you mean ragged_buffer_factor\?\)",
        ),
        ("off,a:maxtext.profiler=xplane", "maxtext.profiler, which the bench holds"),
        ("off,a:maxtext.a.b=1", "write maxtext.KEY, one MaxText key"),
        # a start-up-bound variable inside an arm's TRAINER_ARGV
        (
            "off,a:TRAINER_ARGV=LIBTPU_INIT_ARGS=--xla_x=1 python -m app.trainer --mesh_fsdp=2",
            "TRAINER_ARGV with LIBTPU_INIT_ARGS=..., which binds when the process starts",
        ),
        (
            "off,a:TRAINER_ARGV=JAX_TRACEBACK_FILTERING=off python -m app.trainer",
            "JAX_TRACEBACK_FILTERING",
        ),
    ],
)
def test_bad_arms_are_refused_with_the_fix(text, message):
    with pytest.raises(UserError, match=message):
        ab_arms.parse_arms(text)


def test_well_formed_arms_keep_their_values_whole():
    arms = ab_arms.parse_arms(
        "base:ENGINE=rl_trainer_bench.engine.builtin.jax_engine:JaxEngine,"
        "t:TRAINER_ARGV=MAXTEXT_EXTRA_FLAGS=remat_policy=full python -m app.trainer --mesh_fsdp=2,"
        "maxtext.remat_policy=minimal",
        run_orders.WRITTEN,
    )
    assert arms[0].driver_knobs == {
        "ENGINE": "rl_trainer_bench.engine.builtin.jax_engine:JaxEngine"
    }
    assert arms[1].driver_knobs == {
        "TRAINER_ARGV": "MAXTEXT_EXTRA_FLAGS=remat_policy=full python -m app.trainer --mesh_fsdp=2"
    }
    assert arms[1].engine_keys == {"maxtext.remat_policy": "minimal"}
    kwargs = ab_arms.parse_arms(
        "off,k:optimizer_chain_kwargs={'max_norm': 0.5}", run_orders.WRITTEN
    )[1]
    assert kwargs.engine_keys == {"optimizer_chain_kwargs": "{'max_norm': 0.5}"}


def test_the_summary_says_which_maxtext_keys_only_the_pod_checks():
    from rl_trainer_bench.config.presets import preset

    engine_config = preset("cpu-tiny-qwen3.5").engine
    arm = ab_arms.parse_arms(
        "off,t:maxtext.remat_polcy=full,maxtext.not_a_key=1,maxtext.ici_fsdp_parallelism=2"
    )[1]
    assert ab_arms.maxtext_keys_checked_in_pod(arm, engine_config) == (
        "arm t: MaxText keys remat_polcy=full (in none of the bench's tables; did you mean"
        " remat_policy?), not_a_key=1 (in none of the bench's tables), ici_fsdp_parallelism=2: checked"
        " in the pod, by the trainer's image's MaxText before the runtime starts (a key it"
        " refuses stops the pod there, in one line)"
    )
    off = ab_arms.parse_arms("off,t:maxtext.ici_fsdp_parallelism=2")[0]
    assert ab_arms.maxtext_keys_checked_in_pod(off, engine_config) is None


def test_prediction_in_percent_by_default():
    (p,) = ab_predict.parse_predictions(["on-off=-7.4[-8.5,-5.5]"])
    assert (p.setting, p.baseline, p.value, p.low, p.high, p.unit) == (
        "on",
        "off",
        -7.4,
        -8.5,
        -5.5,
        "%",
    )
    assert p.measure({"off": 1.0, "on": 0.93}) == pytest.approx(-7.0)


def test_prediction_in_milliseconds_and_several_in_one_flag():
    first, second = ab_predict.parse_predictions(["on-off=-12ms[-15,-9]; after-off=0[-1,1]"])
    assert first.unit == "ms"
    assert first.measure({"off": 0.100, "on": 0.090}) == pytest.approx(-10.0)
    assert second.setting == "after"


@pytest.mark.parametrize(
    "text", ["on-off=-7.4", "on-off=-7.4[-5,-8]", "on=-7[-8,-5]", "on-on=0[-1,1]", "on-off=x[1,2]"]
)
def test_bad_prediction_is_refused(text):
    with pytest.raises(UserError, match="--predict"):
        ab_predict.parse_predictions([text])


def test_outcome_says_whether_the_prediction_held():
    predictions = ab_predict.parse_predictions(["on-off=-7.4[-8.5,-5.5]", "on-off=0[-1,1]"])
    held, missed = ab_predict.outcomes(predictions, {"off": 1.0, "on": 0.93})
    assert held["held"] is True and missed["held"] is False
    assert missed["measured"] == pytest.approx(-7.0)


def test_prediction_about_a_setting_not_in_the_run_is_refused():
    predictions = ab_predict.parse_predictions(["after-off=-1[-2,0]"])
    with pytest.raises(UserError, match="no setting 'after'"):
        ab_predict.check_settings(predictions, ["off", "on"])


def test_prediction_file_is_read_and_fingerprinted(tmp_path):
    path = tmp_path / "predictions.txt"
    path.write_text("# written before the run\non-off=-7.4[-8.5,-5.5]  # staging hides the copy\n")
    os.utime(path, (1_000_000, 1_000_000))
    predictions, source = ab_predict.read_prediction_file(path)
    assert [p.text for p in predictions] == ["on-off=-7.4[-8.5,-5.5]"]
    assert source.modified_unix == 1_000_000 and len(source.sha256) == 64


def test_prediction_file_without_predictions_is_refused(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("# nothing yet\n")
    with pytest.raises(UserError, match="no predictions"):
        ab_predict.read_prediction_file(path)
