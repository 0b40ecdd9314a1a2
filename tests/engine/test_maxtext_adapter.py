"""The MaxText adapter against a stand-in with maxtext 0.2.5's signatures and behaviour.

The adapter must pass the engine contract's conformance checks (staging included, which MaxText
itself lacks), score exactly the bench's completion mask under MaxText's own mask alignment, and
make STAGE_BEFORE_UPDATE change when copies happen, never what is trained.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from maxtext_stand_in import (
    MaxTextTrainingEngine,
    RLTrainerPayload,
    StandInMaxTextEngine,
    initialize,
    router_replay_gen_model_input_fn,
)

from rl_trainer_bench.bench.driver import Bench
from rl_trainer_bench.config.knobs import BenchConfig, StageConfig
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.contract import (
    STAGING_METHODS,
    example_payload,
    example_payloads_for,
    missing_methods,
)
from rl_trainer_bench.engine.maxtext_adapter import (
    PreparedMaxTextInput,
    maxtext_keys,
    replay_payload_type,
    to_maxtext_payload,
)
from rl_trainer_bench.engine.returns import check_engine


def small_engine_config():
    """cpu-tiny's model cut to one layer, 8 rows so the batch shards over the 8 host devices."""
    engine = PRESETS["cpu-tiny"].engine
    model = dataclasses.replace(engine.model, num_layers=1, vocab_size=128)
    return dataclasses.replace(engine, model=model, micro_batch_rows=8, seq_len=64)


def test_maxtext_scores_exactly_the_bench_completion_mask():
    """MaxText shifts a token mask left by one; the adapter's right shift makes its loss weights
    equal the bench's target-aligned completion mask, segment ends included."""
    payload = example_payload(3, 48, 64, num_layers=2, top_k=2, num_experts=4, segment_len=10)
    converted = to_maxtext_payload(payload, replay_payload_type(RLTrainerPayload))
    inputs = router_replay_gen_model_input_fn(converted)
    np.testing.assert_array_equal(
        np.asarray(inputs["targets_segmentation"]) != 0, payload.completion_mask != 0
    )
    np.testing.assert_array_equal(np.asarray(inputs["inputs"]), payload.input_ids)
    np.testing.assert_array_equal(np.asarray(inputs["inputs_position"]), payload.positions)
    np.testing.assert_array_equal(
        np.asarray(inputs["forced_routed_experts"]), payload.routed_experts
    )


def test_routes_survive_maxtext_rebuilding_the_payload():
    """MaxText replaces `metadata` with `dataclasses.replace` before reading the routes."""
    payload = example_payload(2, 16, 32, num_layers=1, top_k=2, num_experts=4)
    converted = to_maxtext_payload(payload, replay_payload_type(RLTrainerPayload))
    rebuilt = dataclasses.replace(converted, metadata={})
    np.testing.assert_array_equal(rebuilt.routed_experts, payload.routed_experts)


def test_keys_build_the_same_model_and_batch():
    config = small_engine_config()
    keys = maxtext_keys(config)
    hyper = initialize(None, **keys)
    assert hyper.base_emb_dim == config.model.d_model
    assert hyper.num_experts == config.model.num_experts
    assert hyper.per_device_batch_size * hyper.ici_fsdp_parallelism == config.micro_batch_rows
    dense = dataclasses.replace(config.model, num_experts=1, top_k=1)
    assert "num_experts" not in maxtext_keys(dataclasses.replace(config, model=dense))


def test_maxtext_itself_lacks_the_staging_methods():
    hyper = initialize(None, **maxtext_keys(small_engine_config()))
    assert missing_methods(MaxTextTrainingEngine(hyper), STAGING_METHODS) == list(STAGING_METHODS)


@pytest.fixture(scope="module")
def conformance():
    config = small_engine_config()
    engine = StandInMaxTextEngine(config)
    return engine, check_engine(engine, example_payloads_for(config, 2, prefix="check"))


def test_adapter_conforms_to_the_engine_contract(conformance):
    engine, failures = conformance
    assert failures == []
    assert not missing_methods(engine, STAGING_METHODS)


def test_compile_reports_seconds_per_kernel():
    config = small_engine_config()
    engine = StandInMaxTextEngine(config)
    seconds = engine.compile(example_payloads_for(config, 1)[0])
    assert {"fwd_bwd", "fwd_bwd_accum", "update", "eval"} <= set(seconds)
    assert all(seconds[name] > 0 for name in ("fwd_bwd", "fwd_bwd_accum", "update"))


def test_staged_input_lands_on_the_fwd_bwd_input_shardings(conformance):
    engine, _ = conformance
    payload = example_payloads_for(engine.config, 1, prefix="stage")[0]
    prepared = engine.prepare_fwd_bwd_input(payload)
    assert isinstance(prepared, PreparedMaxTextInput)
    assert engine.wait_for_device() >= 0
    expected = engine.engine._compiled_fwd_bwd.input_shardings[0][2]
    placed = [key for key in prepared.batch if expected[key] is not None]  # None: input unread
    assert "inputs" in placed
    for key in placed:
        array = prepared.batch[key]
        assert array.sharding.is_equivalent_to(expected[key], array.ndim), key
    assert prepared.batch["inputs"].sharding.spec[0] == "fsdp"  # really sharded, not replicated
    engine.fwd_bwd(prepared)
    engine.update()
    metrics = engine.get_metrics()
    assert metrics["tokens"] == np.count_nonzero(payload.segment_ids)
    assert metrics["loss_denominator"] == np.count_nonzero(payload.completion_mask)


def _arm(stage: StageConfig):
    """A fresh adapter (same seed, same initial weights) driven through one arm."""
    preset = dataclasses.replace(PRESETS["cpu-tiny"], engine=small_engine_config())
    config = BenchConfig(preset=preset, steps=2, micro_steps=2, distinct_micro_batches=3)
    bench = Bench(config, lambda _: None, engine_factory=StandInMaxTextEngine)
    bench.setup()
    try:
        result = bench.run(steps=2, stage=stage)
        return result, bench.engine.engine.parameters()
    finally:
        bench.close()


@pytest.fixture(scope="module")
def staged_and_plain():
    return _arm(StageConfig()), _arm(StageConfig(before_update=True, issue="after_last"))


def test_staged_and_plain_runs_train_the_same_data(staged_and_plain):
    (plain, plain_params), (staged, staged_params) = staged_and_plain
    assert staged.stages == len(staged.records) - 1 and plain.stages == 0
    assert [r.digests for r in staged.records] == [r.digests for r in plain.records]
    for field in ("loss", "grad_norm", "loss_denominator", "tokens"):
        assert [getattr(r, field) for r in staged.records] == [
            getattr(r, field) for r in plain.records
        ], field
    for name in plain_params:
        np.testing.assert_array_equal(staged_params[name], plain_params[name])
    assert staged.recompiles == [] and plain.recompiles == []
