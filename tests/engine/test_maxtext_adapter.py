"""The MaxText adapter against a stand-in with maxtext 0.2.5's signatures and behaviour.

The adapter must pass the engine contract's conformance checks (staging included, which MaxText
itself lacks), score exactly the bench's completion mask under MaxText's own mask alignment, and
make STAGE_BEFORE_UPDATE change when copies happen, never what is trained. Its config must start
from MaxText's Qwen3.5 model with the cell's shapes and mesh, pass the trainer's keys last, refuse
what MaxText cannot split or replay before the compile, report drops only where MaxText counts
them, and keep every file MaxText writes (and its profiler) out of the timed steps and the
caller's folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import weakref
from pathlib import Path

import jax
import numpy as np
import pytest
from maxtext_stand_in import (
    STAND_IN_API,
    MaxTextTrainingEngine,
    MetricsBuffer,
    RLTrainerPayload,
    StandInMaxTextEngine,
    WeightedMetric,
    initialize,
    make_router_replay_loss_fn,
    router_replay_gen_model_input_fn,
)

from rl_trainer_bench.bench import step_record
from rl_trainer_bench.bench.driver import Bench
from rl_trainer_bench.config.knobs import BenchConfig, StageConfig
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.config import MeshConfig
from rl_trainer_bench.engine.contract import (
    STAGING_METHODS,
    ContractError,
    example_payload,
    example_payloads_for,
    missing_methods,
)
from rl_trainer_bench.engine.maxtext import keys as maxtext_keys
from rl_trainer_bench.engine.maxtext import metrics as maxtext_metrics
from rl_trainer_bench.engine.maxtext.adapter import PreparedMaxTextInput
from rl_trainer_bench.engine.maxtext.payload import replay_payload_type, to_maxtext_payload
from rl_trainer_bench.engine.returns import check_engine

QWEN35 = PRESETS["cpu-tiny-qwen3.5"].engine


def small_engine_config(**changes):
    """The Qwen3.5 cell on 8 host devices (2x2x2), with a smaller vocabulary."""
    model = dataclasses.replace(QWEN35.model, vocab_size=128)
    return dataclasses.replace(QWEN35, model=model, **changes)


def stand_in_config(config):
    """The MaxText config the adapter's words build (the stand-in parses them as MaxText does)."""
    model = STAND_IN_API.model_config(maxtext_keys.maxtext_model(config).name)
    args = maxtext_keys.maxtext_args(config, model, "/results/engine")
    return args, initialize(["", *args.words])


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


def test_the_qwen35_cell_runs_maxtexts_qwen3_5_decoder_on_the_cells_mesh():
    _, hyper = stand_in_config(small_engine_config())
    assert (hyper.model_name, hyper.decoder_block) == ("qwen3.5-397b-a17b", "qwen3_5")
    assert (hyper.base_num_decoder_layers, hyper.inhomogeneous_layer_cycle_interval) == (4, 4)
    assert (hyper.base_emb_dim, hyper.head_dim, hyper.num_experts) == (64, 32, 8)
    assert (hyper.shared_experts, hyper.base_moe_mlp_dim, hyper.base_mlp_dim) == (1, 64, 64)
    assert (hyper.gdn_num_key_heads, hyper.gdn_num_value_heads, hyper.gdn_chunk_size) == (2, 4, 32)
    assert (hyper.partial_rotary_factor, hyper.rope_max_timescale) == (0.25, 10_000_000)
    # a quarter of a 32-wide head rotates: 4 frequency pairs, [11, 11, 10] scaled
    assert hyper.mrope_section == [2, 1, 1]
    assert (
        hyper.ici_fsdp_parallelism,
        hyper.ici_context_parallelism,
        hyper.ici_expert_parallelism,
    ) == (2, 2, 2)
    assert hyper.per_device_batch_size * 8 == 4 and hyper.max_target_length == 128
    assert hyper.context_parallel_load_balance is False
    assert (hyper.weight_dtype, hyper.profiler_steps, hyper.jax_cache_dir) == ("float32", 0, "")
    assert hyper.base_output_directory == "/results/engine"


def test_the_dense_cell_runs_maxtexts_default_decoder_without_dropout():
    _, hyper = stand_in_config(PRESETS["cpu-tiny-dense"].engine)
    make_router_replay_loss_fn(hyper)  # MaxText refuses it with dropout on and no dropout rng
    assert (hyper.model_name, hyper.decoder_block, hyper.num_experts) == ("default", "llama2", 1)
    assert (hyper.enable_dropout, hyper.skip_step_on_spikes) == (False, False)
    assert hyper.ici_fsdp_parallelism == 8 and hyper.base_mlp_dim == 128


def test_every_engine_config_field_has_one_fate():
    assert maxtext_keys.covered_fields() == maxtext_keys.config_fields()
    translated = {row.field for row in maxtext_keys.TRANSLATIONS}
    assert not translated & set(maxtext_keys.NOT_TAKEN)
    assert not translated & set(maxtext_keys.ADAPTER_FIELDS)


@pytest.mark.parametrize(
    ("parts", "total", "expected"),
    [([11, 11, 10], 32, [11, 11, 10]), ([11, 11, 10], 4, [2, 1, 1]), ([11, 11, 10], 8, [3, 3, 2])],
)
def test_mrope_split_scales_to_the_rotated_half_head(parts, total, expected):
    assert maxtext_keys.scaled_split(parts, total) == expected


def test_trainer_keys_pass_unchanged_and_last_and_held_ones_are_said():
    trainer = (
        ("remat_policy", "minimal"),
        ("mu_dtype", "bfloat16"),
        ("base_output_directory", "gs://bucket/maxtext"),
        ("profiler_steps", "5"),
        ("remat_policy", "full"),
    )
    args, hyper = stand_in_config(small_engine_config(trainer_maxtext_keys=trainer))
    assert args.words[-3:] == ("remat_policy=minimal", "mu_dtype=bfloat16", "remat_policy=full")
    assert args.held == ("base_output_directory=gs://bucket/maxtext", "profiler_steps=5")
    # mu_dtype is also an engine key (float32 here), so the trainer's value replaces the bench's.
    assert args.replaced == ("remat_policy=full->minimal", "mu_dtype=float32->bfloat16")
    assert (hyper.mu_dtype, hyper.remat_policy) == ("bfloat16", "full")
    assert hyper.base_output_directory == "/results/engine" and hyper.profiler_steps == 0


RECIPE_MOE_KEYS = (
    ("megablox", "true"),
    ("use_tokamax_gmm", "true"),
    ("use_ring_of_experts", "true"),
    ("use_ragged_sort", "true"),
    ("ragged_buffer_factor", "2.0"),
    ("remat_policy", "full"),
)


def host_words(config, platform):
    model = STAND_IN_API.model_config(maxtext_keys.maxtext_model(config).name)
    host = maxtext_keys.platform_keys(config, platform)
    return maxtext_keys.maxtext_args(config, model, "/results/engine", host)


def test_a_tpu_runs_the_trainers_moe_kernels_as_written():
    args = host_words(small_engine_config(trainer_maxtext_keys=RECIPE_MOE_KEYS), "tpu")
    assert args.words[-6:] == tuple(f"{k}={v}" for k, v in RECIPE_MOE_KEYS) and args.held == ()


def test_off_a_tpu_one_expert_shard_takes_xlas_grouped_matmul_over_the_trainers_kernels():
    mesh = MeshConfig(fsdp=4, context=2, expert=1)
    args = host_words(small_engine_config(mesh=mesh, trainer_maxtext_keys=RECIPE_MOE_KEYS), "cpu")
    hyper = initialize(["", *args.words])
    # interpreted megablox was ~98% of the step; ragged_dot is XLA's own
    assert (hyper.megablox, hyper.use_tokamax_gmm, hyper.remat_policy) == (False, False, "full")
    assert args.held[:2] == ("megablox=true", "use_tokamax_gmm=true")
    # one expert shard: no ring asked of the host, so the trainer's ring keys pass
    assert "use_ring_of_experts=true" in args.trainer_words


def test_off_a_tpu_expert_shards_keep_megablox_which_alone_takes_their_group_offset():
    args = host_words(small_engine_config(trainer_maxtext_keys=RECIPE_MOE_KEYS), "cpu")
    hyper = initialize(["", *args.words])
    assert (hyper.megablox, hyper.use_tokamax_gmm) == (True, False)
    assert (hyper.use_ring_of_experts, hyper.use_ragged_sort) == (True, False)
    assert hyper.ragged_buffer_factor == -1.0
    assert "megablox=true" in args.trainer_words and "megablox=true" not in args.held


def test_the_log_says_when_maxtext_will_interpret_its_grouped_matmul(tmp_path):
    sharded = StandInMaxTextEngine(small_engine_config(output_dir=str(tmp_path / "a")))
    assert sharded.info()["interpreted_kernels"].startswith("megablox grouped matmul")
    one_shard = MeshConfig(fsdp=4, context=2, expert=1)
    plain = StandInMaxTextEngine(
        small_engine_config(mesh=one_shard, output_dir=str(tmp_path / "b"))
    )
    assert plain.info()["interpreted_kernels"] == "-"


def test_a_dense_model_gets_no_grouped_matmul_keys():
    assert maxtext_keys.platform_keys(PRESETS["cpu-tiny-dense"].engine, "cpu") == {}


def test_a_micro_batch_maxtexts_mesh_cannot_split_is_refused_before_building():
    config = small_engine_config(micro_batch_rows=2)
    with pytest.raises(ContractError, match=r"micro_batch_rows=2: .*fsdp=2 x expert=2 = 4"):
        StandInMaxTextEngine(config)
    # The trainer's keys move MaxText's mesh: the check is against the mesh MaxText builds.
    moved = small_engine_config(
        trainer_maxtext_keys=(
            ("ici_fsdp_parallelism", "8"),
            ("ici_context_parallelism", "1"),
            ("ici_expert_parallelism", "1"),
        )
    )
    with pytest.raises(ContractError, match=r"micro_batch_rows=4: .*fsdp=8 x expert=1 = 8"):
        StandInMaxTextEngine(moved)


def test_a_mesh_short_of_the_devices_is_refused_in_one_line():
    config = small_engine_config(mesh=MeshConfig(fsdp=4), micro_batch_rows=4)
    with pytest.raises(ContractError, match=r"product of the ICI parallelism 4\): make mesh_fsdp"):
        StandInMaxTextEngine(config)


def test_a_moe_maxtext_cannot_replay_is_refused_naming_the_decoders():
    config = PRESETS["qwen3-30b-a3b-cell"].engine
    with pytest.raises(ContractError, match="qwen3_5, mixtral, gemma4"):
        StandInMaxTextEngine(config)


def test_drops_are_counted_only_where_maxtext_measures_them():
    loss = WeightedMetric(np.array([4.0, 2.0]), np.array([2.0, 2.0]))
    scalars = {"gradient_norm": np.array([0.5]), "has_moe_overflow": np.array([True, False])}
    buffer = MetricsBuffer(id=0, weighted_metrics={"loss": loss}, scalar_metrics=scalars)
    measured = maxtext_metrics.step_metrics(buffer, 7, "step")
    assert measured["overflow_count"] == 1 and measured["loss"] == 1.5
    assert measured["replay_count"] is None and measured["mult_prob_error_max"] is None
    unmeasured = maxtext_metrics.step_metrics(buffer, 7, None)
    assert unmeasured["overflow_count"] is None


def test_overflow_flags_from_maxtext_reach_the_step_metrics():
    """MaxText's step-fallback flag, per micro-batch, counted against the routes themselves: one
    micro-batch routes all its pairs, the other half of them, and only the first overflows."""
    config = small_engine_config(
        mesh=MeshConfig(fsdp=8),
        micro_batch_rows=8,
        trainer_maxtext_keys=(("moe_dropless_fallback", "step"), ("ragged_buffer_factor", "0.6")),
    )
    engine = StandInMaxTextEngine(config)
    full, half = example_payloads_for(config, 2, prefix="drop")
    rows = np.arange(config.micro_batch_rows)[:, None, None, None]
    half = dataclasses.replace(half, routed_experts=np.where(rows < 4, half.routed_experts, -1))
    engine.compile(full)
    for payload in (full, half):
        engine.fwd_bwd(payload)
    engine.update()
    metrics = engine.get_metrics()
    buffer = int(config.micro_batch_rows * config.seq_len * config.model.top_k * 0.6)
    loads = [np.count_nonzero(p.routed_experts[:, :, 0] >= 0) for p in (full, half)]
    assert loads[0] > buffer >= loads[1]
    assert metrics["overflow_count"] == 1
    assert "overflow_count" not in engine.info()["not_measured"]
    # on the CPU the adapter says it runs jax's triangular solve as XLA's op (cpu_lowerings)
    assert engine.info()["host_lowerings"] == "triangular_solve=xla-hlo"


def test_maxtext_itself_lacks_the_staging_methods():
    _, hyper = stand_in_config(small_engine_config())
    assert missing_methods(MaxTextTrainingEngine(hyper), STAGING_METHODS) == list(STAGING_METHODS)


@pytest.fixture(scope="module")
def conformance(tmp_path_factory):
    # A folder of pytest's for MaxText's files: the engine outlives a module's last test (its
    # arguments are held until that test's teardown, after the session's emptiness check)
    config = small_engine_config(output_dir=str(tmp_path_factory.mktemp("conformance")))
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
    # really sharded as MaxText shards it: rows over fsdp x expert, the sequence over context
    assert prepared.batch["inputs"].sharding.spec[:2] == (("fsdp", "expert"), "context")
    engine.fwd_bwd(prepared)
    engine.update()
    metrics = engine.get_metrics()
    assert metrics["tokens"] == np.count_nonzero(payload.segment_ids)
    assert metrics["loss_denominator"] == np.count_nonzero(payload.completion_mask)


def _arm(stage: StageConfig, folder):
    """A fresh adapter (same seed, same initial weights) driven through one arm, run from
    `folder`/cwd with its results in `folder`/results; 6 micro steps cover the micro steps
    MaxText's default profiler window would trace."""
    preset = dataclasses.replace(PRESETS["cpu-tiny"], engine=small_engine_config())
    config = BenchConfig(
        preset=preset,
        steps=2,
        micro_steps=2,
        distinct_micro_batches=3,
        results_dir=folder / "results",
    )
    (folder / "cwd").mkdir(parents=True)
    bench = Bench(config, lambda _: None, engine_factory=StandInMaxTextEngine)
    with contextlib.chdir(folder / "cwd"):
        bench.setup()
        try:
            result = bench.run(steps=2, stage=stage)
            return result, bench.engine.engine.parameters()
        finally:
            bench.close()


@pytest.fixture(scope="module")
def arm_folders(tmp_path_factory):
    return tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("staged")


@pytest.fixture(scope="module")
def staged_and_plain(arm_folders):
    plain, staged = arm_folders
    return (
        _arm(StageConfig(), plain),
        _arm(StageConfig(before_update=True, issue="after_last"), staged),
    )


def test_maxtext_writes_only_under_the_results_folder_and_never_profiles(
    staged_and_plain, arm_folders
):
    for folder in arm_folders:
        assert list((folder / "cwd").iterdir()) == []  # nothing in the caller's folder
        events = folder / "results" / "engine" / maxtext_keys.RUN_NAME / "tensorboard"
        assert (events / "events.out.tfevents").is_file()
        assert list(folder.rglob("*.xplane.pb")) == []  # MaxText's profiler never started


def test_an_engine_built_outside_the_driver_writes_into_a_temporary_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    engine = StandInMaxTextEngine(small_engine_config())
    assert list(tmp_path.iterdir()) == []  # not ./maxtext_output, MaxText's own choice
    events = Path(engine.output_dir) / maxtext_keys.RUN_NAME / "tensorboard"
    assert (events / "events.out.tfevents").is_file()


def test_unmeasured_drops_and_replays_are_shown_as_such(staged_and_plain):
    (plain, _), _ = staged_and_plain
    line = step_record.format_line(plain.records[0])
    assert " overflow=- replays=- " in line
    parsed = step_record.parse_line(line)
    assert (parsed.overflow_count, parsed.replay_count) == (None, None)


def test_staged_and_plain_runs_train_the_same_data(staged_and_plain):
    (plain, plain_params), (staged, staged_params) = staged_and_plain
    assert staged.stages == len(staged.records) and plain.stages == 0
    assert [r.digests for r in staged.records] == [r.digests for r in plain.records]
    for field in ("loss", "grad_norm", "loss_denominator", "tokens"):
        assert [getattr(r, field) for r in staged.records] == [
            getattr(r, field) for r in plain.records
        ], field
    for name in plain_params:
        np.testing.assert_array_equal(staged_params[name], plain_params[name])
    assert staged.recompiles == [] and plain.recompiles == []


def test_an_arms_maxtext_key_reaches_maxtexts_config_after_the_trainers():
    from rl_trainer_bench.config.engine_keys import engine_config_from

    trainer = "MAXTEXT_EXTRA_FLAGS='remat_policy=full' python -m app.trainer"
    config, _ = engine_config_from(
        PRESETS["cpu-tiny-qwen3.5"], trainer, "maxtext.remat_policy=minimal"
    )
    args, hyper = stand_in_config(
        small_engine_config(trainer_maxtext_keys=config.trainer_maxtext_keys)
    )
    assert args.words[-2:] == ("remat_policy=full", "remat_policy=minimal")
    assert hyper.remat_policy == "minimal"


def test_a_folder_the_engine_made_for_maxtexts_files_goes_with_it(tmp_path):
    """Built outside the driver (no output_dir), the engine makes a temporary folder for what
    MaxText writes and removes it when it is collected; a folder the caller gave stays."""
    engine = StandInMaxTextEngine(small_engine_config())
    made = Path(engine.output_dir)
    assert made.is_dir() and made.name.startswith("rl-trainer-bench-maxtext-")
    del engine
    gc.collect()
    assert not made.exists()
    given = tmp_path / "engine"
    engine = StandInMaxTextEngine(small_engine_config(output_dir=str(given)))
    del engine
    gc.collect()
    assert given.is_dir()


def minimal_remat_config():
    """The small cell with one more MaxText key, one that changes a program, not the state."""
    from rl_trainer_bench.config.engine_keys import engine_config_from

    keyed, _ = engine_config_from(PRESETS["cpu-tiny-qwen3.5"], "", "maxtext.remat_policy=minimal")
    return small_engine_config(trainer_maxtext_keys=keyed.trainer_maxtext_keys)


def state_leaves(adapter) -> list:
    """The leaves of the weights and moments MaxText's engine under `adapter` holds."""
    return jax.tree.leaves(STAND_IN_API.state_avals(adapter.engine))


def test_an_engine_for_another_maxtext_key_trains_the_first_engines_state():
    """share_state over maxtext 0.2.5's surface: the sibling (its own MaxText engine, built for
    another MaxText key) takes the first engine's weights and moments, not a copy; an update on
    one is the other's once it takes the state back (its train step too); a config whose
    weights have other shapes (another vocabulary) is refused naming the first such leaf."""
    from rl_trainer_bench.engine.contract import StateMismatch

    config = small_engine_config()
    first = StandInMaxTextEngine(config)
    given = state_leaves(first)
    sibling = first.share_state(minimal_remat_config())
    assert sibling.maxtext_config.remat_policy == "minimal"
    assert all(a is b for a, b in zip(state_leaves(sibling), given, strict=True))  # not a copy
    payload = example_payloads_for(config, 1)[0]
    sibling.compile(payload)
    first.compile(payload)
    with pytest.raises(ContractError, match="call take_shared_state"):
        sibling.fwd_bwd(payload)
    first.fwd_bwd(payload)
    assert first.update() == 1
    sibling.take_shared_state()
    assert sibling.train_step == 1
    sibling.fwd_bwd(payload)
    assert sibling.update() == 2
    first.take_shared_state()
    assert first.train_step == 2
    other_vocabulary = dataclasses.replace(
        config, model=dataclasses.replace(config.model, vocab_size=64)
    )
    with pytest.raises(StateMismatch, match=r"\['embed'\] has shape \[128, .*needs \[64, "):
        first.share_state(other_vocabulary)


def test_only_the_engine_that_took_the_state_holds_its_arrays():
    """Once another engine of its family takes the state, the giving engine holds none of it:
    its weights and moments are shapes, so every array it handed over is freed when the taker's
    update replaces it (the stand-in's update donates nothing, as MaxText's leaves a leaf it
    cannot alias). Both ways: the first engine gives, then takes back and the sibling gives."""
    config = small_engine_config()
    payload = example_payloads_for(config, 1)[0]
    first = StandInMaxTextEngine(config)
    handed = [weakref.ref(leaf) for leaf in state_leaves(first)]
    sibling = first.share_state(minimal_remat_config())
    assert not any(isinstance(leaf, jax.Array) for leaf in state_leaves(first))
    sibling.compile(payload)
    sibling.fwd_bwd(payload)
    sibling.update()
    gc.collect()
    assert [ref for ref in handed if ref() is not None] == []
    handed = [weakref.ref(leaf) for leaf in state_leaves(sibling)]
    first.take_shared_state()
    assert not any(isinstance(leaf, jax.Array) for leaf in state_leaves(sibling))
    first.compile(payload)
    first.fwd_bwd(payload)
    assert first.update() == 2
    gc.collect()
    assert [ref for ref in handed if ref() is not None] == []


def test_an_engine_over_another_state_allocates_none_and_compiles_holding_it(monkeypatch):
    """The sibling's MaxText engine is built with its state as shapes (its weights are made
    only under tracing, never allocated), and an engine that compiles takes the family's
    state first (MaxText compiles against the arrays it holds)."""
    import maxtext_stand_in

    made = []
    init_params = maxtext_stand_in._init_params

    def recording(config):
        params = init_params(config)
        made.append(not isinstance(params["embed"], jax.core.Tracer))
        return params

    monkeypatch.setattr(maxtext_stand_in, "_init_params", recording)
    first = StandInMaxTextEngine(small_engine_config())
    assert made == [True]
    sibling = first.share_state(minimal_remat_config())
    assert made == [True, False]
    payload = example_payloads_for(first.config, 1)[0]
    first.compile(payload)
    assert first._family.holder is first
    sibling.compile(payload)
    assert sibling._family.holder is sibling


def test_maxtext_counts_the_models_flops_as_the_builtin_engine_does():
    """The step ruler's MFU for MaxText's engine: the model FLOPs of real tokens by the built-in
    engine's count (694,272,000 for the small Qwen3.5 cell's 4 rows of 100 real tokens and 28 of
    padding each), so rows of padding count nothing."""
    config = small_engine_config()
    engine = StandInMaxTextEngine(config)
    (payload,) = example_payloads_for(config, 1, segment_len=100)
    assert engine.model_flops(payload) == pytest.approx(694_272_000, rel=1e-12)
    two_rows = payload.segment_ids * (np.arange(4)[:, None] < 2)
    halved = dataclasses.replace(payload, segment_ids=two_rows)
    assert engine.model_flops(halved) == pytest.approx(694_272_000 / 2, rel=1e-12)
