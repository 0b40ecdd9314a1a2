"""MaxText's engine driven through Tunix's TrainerWorker with Tunix's GRPO loss (stand-ins of both).

The micro-batch must reach Tunix's loss token-aligned (its log-probs score token t at position
t), so its loss denominator is the bench's count of completion targets; the rollout's routes must
reach the model; the choice between Tunix's driver and the adapter's own calls must follow
MAXTEXT_DRIVER and what imports, and the plan must say which loss runs through which calls.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from maxtext_stand_in import (
    STAND_IN_TUNIX_API,
    StandInMaxTextEngine,
    StandInTunixMaxTextEngine,
    TrainerWorker,
)

from rl_trainer_bench.bench import engine_plan
from rl_trainer_bench.bench.driver import Bench
from rl_trainer_bench.config.knobs import BenchConfig
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.contract import (
    STAGING_METHODS,
    ContractError,
    Payload,
    example_payloads_for,
    missing_methods,
)
from rl_trainer_bench.engine.maxtext import tunix_grpo
from rl_trainer_bench.engine.returns import check_engine
from rl_trainer_bench.errors import ConfigError

QWEN35 = PRESETS["cpu-tiny-qwen3.5"].engine
DENSE = PRESETS["cpu-tiny-dense"].engine


def small(config, **changes):
    return dataclasses.replace(
        config, model=dataclasses.replace(config.model, vocab_size=128), **changes
    )


def written_payload() -> Payload:
    """One row of 8: segment 1 = prompt of 2 + completion of 3, segment 2 = prompt of 1 +
    completion of 1, one padding token. Input-aligned mask: 1 where the *next* token scores."""
    return Payload(
        input_ids=np.array([[5, 6, 7, 8, 9, 3, 4, 0]], np.int32),
        segment_ids=np.array([[1, 1, 1, 1, 1, 2, 2, 0]], np.int32),
        positions=np.array([[0, 1, 2, 3, 4, 0, 1, 0]], np.int32),
        completion_mask=np.array([[0, 1, 1, 1, 0, 1, 0, 0]], np.int32),
        advantages=np.array([[0.5] * 5 + [-1.0] * 2 + [0.0]], np.float32),
        old_logps=np.arange(10, 18, dtype=np.float32)[None],
    )


def test_the_micro_batch_reaches_tunix_token_aligned():
    """Tunix scores token t at position t: the mask, advantages and log-probs move right by one."""
    routed = tunix_grpo.to_train_example(written_payload(), STAND_IN_TUNIX_API)
    example = routed.train_example
    np.testing.assert_array_equal(example.completion_mask, [[0, 0, 1, 1, 1, 0, 1, 0]])
    np.testing.assert_array_equal(example.old_per_token_logps, [[0, 10, 11, 12, 13, 14, 15, 16]])
    np.testing.assert_array_equal(example.advantages, [[0, 0.5, 0.5, 0.5, 0.5, 0.5, -1, -1]])
    np.testing.assert_array_equal(example.completion_ids, [[5, 6, 7, 8, 9, 3, 4, 0]])
    np.testing.assert_array_equal(example.segment_ids, [[1, 1, 1, 1, 1, 2, 2, 0]])
    np.testing.assert_array_equal(example.segment_positions, [[0, 1, 2, 3, 4, 0, 1, 0]])
    assert example.prompt_ids.shape == (1, 0) and example.ref_per_token_logps is None
    assert example.num_segments == 9 and routed.routed_experts is None


def test_tunix_grpo_config_is_the_engine_configs_loss():
    loss = dataclasses.replace(QWEN35.loss, epsilon=0.1, epsilon_high=0.3, beta=0.02)
    config = tunix_grpo.grpo_config(STAND_IN_TUNIX_API, loss)
    assert (config.epsilon, config.epsilon_high, config.beta) == (0.1, 0.3, 0.02)
    assert (config.loss_agg_mode, config.kl_loss_mode, config.temperature) == (
        "token-mean",
        "low_var_kl",
        1.0,
    )


def test_the_tunix_loss_divides_by_the_bench_count_of_completion_targets():
    config = small(DENSE, micro_batch_rows=8)
    engine = StandInTunixMaxTextEngine(config)
    assert isinstance(engine.calls, TrainerWorker)  # the bench's calls go through the worker
    payloads = example_payloads_for(config, 2, prefix="den")
    engine.compile(payloads[0])
    for payload in payloads:
        engine.fwd_bwd(payload)
    engine.update()
    metrics = engine.get_metrics()
    assert metrics["loss_denominator"] == sum(np.count_nonzero(p.completion_mask) for p in payloads)
    assert np.isfinite(metrics["loss"]) and metrics["train_step"] == 1


@pytest.fixture(scope="module")
def qwen_engine():
    """The Qwen3.5 cell on Tunix's path, through the contract's conformance checks (compiled)."""
    config = small(QWEN35)
    engine = StandInTunixMaxTextEngine(config)
    return engine, check_engine(engine, example_payloads_for(config, 2, prefix="check"))


def test_the_rollouts_routes_reach_the_model_through_tunixs_loss(qwen_engine):
    """Replayed routes decide the expert load: other routes, another loss on the same weights."""
    engine, _ = qwen_engine
    payload = example_payloads_for(engine.config, 1, prefix="routes")[0]
    rerouted = dataclasses.replace(
        payload,
        input_ids=payload.input_ids.copy(),  # another micro-batch: the adapter caches by its ids
        routed_experts=(payload.routed_experts + 1) % engine.config.model.num_experts,
    )
    for micro_batch in (payload, rerouted):  # no update between: the same weights
        engine.fwd_bwd(micro_batch)
    losses = engine.engine.get_metrics(clear_cache=False).weighted_metrics["loss"]
    engine.update()
    engine.get_metrics()
    assert losses.unreduced_sum[0] != losses.unreduced_sum[1]
    count = np.count_nonzero(payload.completion_mask)
    np.testing.assert_array_equal(losses.denominator, [count, count])
    info = engine.info()
    assert info["model_call"] == "MaxText's TunixMaxTextAdapter"  # Qwen3.5: MaxText can wrap it
    assert info["loss"] == "tunix algo_core.grpo_loss_fn (token-mean, routes replayed)"
    assert info["chunked_logps"] == (
        "applied, chunk 512, via MaxText's decoder: its hidden states, then"
        " Transformer.logits_from_hidden_states_for_vocab_tiling (the decoder's apply_output_head)"
        " on each chunk"
    )


def test_overflow_is_not_measured_through_tunixs_loss():
    config = small(QWEN35, trainer_maxtext_keys=(("moe_dropless_fallback", "step"),))
    info = StandInTunixMaxTextEngine(config).info()
    assert info["not_measured"] == "overflow_count,replay_count,mult_prob_error_max"
    assert "loss.epsilon" not in info["not_taken"].split(",")
    # Tunix's chunked pass takes the chunk: it is not among the keys MaxText's engine leaves
    assert "loss.compute_logps_chunk_size" not in info["not_taken"].split(",")


def test_the_dense_model_is_called_through_the_bench_tunix_call():
    info = StandInTunixMaxTextEngine(small(DENSE)).info()
    assert info["model_call"].startswith("MaxText's Transformer through the bench's Tunix call")
    assert info["driver"] == "tunix TrainerWorker (MAXTEXT_DRIVER=auto, Tunix importable)"


def test_auto_falls_back_to_the_adapters_own_calls_without_tunix():
    engine = StandInMaxTextEngine(small(DENSE))
    assert engine.tunix is None and engine.calls is engine.engine
    assert engine.info()["driver"] == (
        "the adapter's own calls (MAXTEXT_DRIVER=auto and Tunix is not importable"
        " (No module named 'tunix' (the stand-in's engine has none)))"
    )
    assert engine.info()["loss"] == "maxtext router-replay cross-entropy"


def test_tunix_asked_for_and_absent_is_one_line():
    with pytest.raises(ContractError, match=r"^MAXTEXT_DRIVER=tunix needs Tunix's TrainerWorker"):
        StandInMaxTextEngine(small(DENSE, maxtext_driver="tunix"))


def test_maxtext_asked_for_runs_the_adapters_own_calls_with_tunix_present():
    engine = StandInTunixMaxTextEngine(small(DENSE, maxtext_driver="maxtext"))
    assert engine.tunix is None and engine.calls is engine.engine
    assert engine.info()["driver"] == "the adapter's own calls (MAXTEXT_DRIVER=maxtext)"


@pytest.mark.parametrize(("driver", "through_tunix"), [("auto", True), ("maxtext", False)])
def test_the_knob_reaches_the_engine_the_driver_builds(driver, through_tunix, tmp_path):
    preset = dataclasses.replace(PRESETS["cpu-tiny-dense"], engine=small(DENSE))
    config = BenchConfig(preset=preset, maxtext_driver=driver, results_dir=tmp_path)
    bench = Bench(config, lambda _: None, engine_factory=StandInTunixMaxTextEngine)
    bench.build()
    try:
        assert (bench.engine.tunix is not None) == through_tunix
    finally:
        bench.close()


def test_the_tunix_path_conforms_and_stages_onto_the_fwd_bwd_input_shardings(qwen_engine):
    engine, failures = qwen_engine
    assert failures == []
    assert not missing_methods(engine, STAGING_METHODS)
    payload = example_payloads_for(engine.config, 1, prefix="stage")[0]
    prepared = engine.prepare_fwd_bwd_input(payload)
    engine.wait_for_device()
    expected = engine.engine._compiled_fwd_bwd.input_shardings[0][2]["train_example"]
    mask = prepared.batch["train_example"].completion_mask
    assert mask.sharding.is_equivalent_to(expected.completion_mask, mask.ndim)
    engine.fwd_bwd(prepared)
    engine.update()
    assert engine.get_metrics()["loss_denominator"] == np.count_nonzero(payload.completion_mask)


def test_tunix_is_looked_for_without_importing_it(tmp_path, monkeypatch):
    package = tmp_path / "tunix"
    for name in ("__init__.py", *tunix_grpo.TUNIX_FILES):
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert tunix_grpo.tunix_absent() is None
    (package / "rl" / "algo_core.py").unlink()
    assert tunix_grpo.tunix_absent() == "this tunix lacks rl/algo_core.py"


def rows(driver, in_pod_image, chunk_size=1024):
    return dict(engine_plan.maxtext_loss_rows(driver, in_pod_image, chunk_size))


def test_the_plan_says_which_loss_runs_through_which_calls(monkeypatch):
    monkeypatch.setattr(tunix_grpo, "tunix_absent", lambda: None)
    here = rows("auto", True)
    assert here["loss"].startswith("Tunix's GRPO loss (algo_core.grpo_loss_fn, token-mean")
    assert here["loss"].endswith(
        "through Tunix's TrainerWorker around MaxText's training engine, as a Tunix trainer with"
        " --trainer_backend=maxtext runs it (MAXTEXT_DRIVER=auto: Tunix's worker and loss are here)"
    )
    assert here["chunked log-prob pass"].startswith(
        "checked in the pod: chunk 1024 through Tunix's own chunked pass where the image's MaxText"
        " gives hidden states and an output head"
    )
    rendered = rows("auto", False)
    assert rendered["loss"].startswith("Tunix's GRPO loss (algo_core.grpo_loss_fn, token-mean")
    # A rendered pod never falls back silently: the image is checked there (the fallback is opt-in).
    assert rendered["loss"].endswith(
        "(MAXTEXT_DRIVER=auto); checked in the pod: a pod whose image lacks Tunix's worker or loss"
        " refuses to start (MAXTEXT_DRIVER=maxtext times MaxText's own loss instead)"
    )
    assert engine_plan.MAXTEXT_LOSS not in rendered["loss"]
    assert "chunked log-prob pass" in rendered
    assert "(MAXTEXT_DRIVER=tunix); checked in the pod" in rows("tunix", False)["loss"]
    assert rows("maxtext", True) == {"loss": engine_plan.MAXTEXT_LOSS + " (MAXTEXT_DRIVER=maxtext)"}


def test_the_plan_says_why_the_adapters_own_calls_run(monkeypatch):
    monkeypatch.setattr(tunix_grpo, "tunix_absent", lambda: "tunix is not installed")
    assert rows("auto", True) == {
        "loss": engine_plan.MAXTEXT_LOSS + " (MAXTEXT_DRIVER=auto: tunix is not installed here)"
    }
    with pytest.raises(ConfigError, match=r"^MAXTEXT_DRIVER=tunix: tunix is not installed here"):
        rows("tunix", True)


def test_check_engine_builds_the_engine_with_the_knob(capsys):
    from rl_trainer_bench import cli

    spec = "maxtext_stand_in:StandInMaxTextEngine"  # the stand-in's Tunix does not import
    argv = ["check-engine", "--preset", "cpu-tiny-dense", "--engine", spec]
    assert cli.main([*argv, "--maxtext-driver", "tunix"]) == 2
    assert "MAXTEXT_DRIVER=tunix needs Tunix's TrainerWorker" in capsys.readouterr().err
