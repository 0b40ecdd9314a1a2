"""Are the built-in engine's numerics knobs harmless? The second of `rl-trainer-bench check`'s two
checks.

A knob that should only change rounding (bfloat16 logits, a smaller log-prob chunk, another expert
kernel) can change the math when it is wrong, and a step time then times another model. The check
runs the built-in engine, built by the engine factory as every command builds it, on one CPU device
under each knob, and compares loss, gradient norm and per-token log-probs with a float32 reference
on the same micro-batch. The per-token log-probs come from the built-in engine's decoder and
log-prob pass, so the check is the built-in engine's: another engine has `check-engine`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from rl_trainer_bench.engine import factory
from rl_trainer_bench.engine.config import DROPLESS, EngineConfig, MeshConfig
from rl_trainer_bench.engine.contract import Payload


@dataclasses.dataclass(frozen=True)
class Knob:
    """An engine setting that should change the math by rounding only, and how much it may."""

    name: str
    apply: Callable[[EngineConfig], EngineConfig]
    loss_rtol: float  # |loss - reference| / |reference|
    grad_norm_rtol: float
    logp_atol: float  # max |logp - reference| over the loss's tokens (nats)


def _with(section: str | None, **changes):
    def apply(config: EngineConfig) -> EngineConfig:
        if section is None:
            return dataclasses.replace(config, **changes)
        return dataclasses.replace(
            config, **{section: dataclasses.replace(getattr(config, section), **changes)}
        )

    return apply


def numerics_reference(engine: EngineConfig) -> EngineConfig:
    """The float32 reference: one device, float32 activations and logits, highest matmul
    precision, einsum experts in capacity buffers, and no dropped pairs (so every knob sees the
    same routing)."""
    return dataclasses.replace(
        engine,
        model=dataclasses.replace(engine.model, dtype="float32"),
        mesh=MeshConfig(),
        loss=dataclasses.replace(engine.loss, logits_dtype="float32"),
        moe=dataclasses.replace(
            engine.moe,
            ragged_buffer_factor=DROPLESS,
            retry_when_tokens_dropped=False,
            expert_compute="einsum",
            dropless_compute="capacity",
        ),
        matmul_precision="highest",
    )


def default_knobs(engine: EngineConfig) -> tuple[Knob, ...]:
    """The knobs `check` tries, with their tolerances.

    bfloat16 logits keep 8 significant bits: a logit of magnitude 4 moves by up to 0.016, so a
    log-prob (target logit minus logsumexp) may move by about twice that: 3e-2. The loss and
    grad-norm bounds are 4-15x the differences measured on cpu-tiny
    (benchmarks/reports/payload-build_cpu_2026-11-30.md). The other
    knobs (the linear layers' chunk size among them, when the model has Gated DeltaNet layers) only
    regroup or reorder float32 arithmetic, so they get float32-rounding bounds.
    """
    chunk = min(engine.loss.compute_logps_chunk_size, engine.seq_len)
    knobs = (
        Knob(
            "loss.logits_dtype=bfloat16", _with("loss", logits_dtype="bfloat16"), 2e-2, 1e-2, 3e-2
        ),
        Knob(
            f"loss.compute_logps_chunk_size={max(chunk // 4, 1)}",
            _with("loss", compute_logps_chunk_size=max(chunk // 4, 1)),
            1e-5,
            1e-5,
            1e-5,
        ),
        Knob("matmul_precision=default", _with(None, matmul_precision="default"), 1e-4, 1e-4, 1e-4),
        Knob(
            "moe.expert_compute=ragged_dot",
            _with("moe", expert_compute="ragged_dot"),
            1e-5,
            1e-5,
            1e-5,
        ),
        Knob(
            "moe.expert_compute=sorted_ragged_dot",
            _with("moe", expert_compute="sorted_ragged_dot"),
            1e-5,
            1e-5,
            1e-5,
        ),
        Knob(
            "moe.dropless_compute=ragged_dot",
            _with("moe", dropless_compute="ragged_dot"),
            1e-5,
            1e-5,
            1e-5,
        ),
        # Dropless, two token groups run one after the other only regroup the sums.
        Knob("moe.token_chunks=2", _with("moe", token_chunks=2), 1e-5, 1e-5, 1e-5),
    )
    if "linear_attention" not in engine.model.layer_types:
        return knobs
    linear_chunk = max(min(engine.model.linear_chunk_size, engine.seq_len) // 4, 1)
    return (
        *knobs,
        Knob(  # a smaller chunk moves work between the intra-chunk solve and the state recurrence
            f"model.linear_chunk_size={linear_chunk}",
            _with("model", linear_chunk_size=linear_chunk),
            1e-5,
            1e-5,
            1e-5,
        ),
    )


@dataclasses.dataclass(frozen=True)
class NumericsRun:
    """One engine setting's figures on the micro-batch."""

    loss: float
    grad_norm: float
    logps: np.ndarray  # [B, T] per-token log-probs (meaningful where `mask`)
    mask: np.ndarray  # [B, T] the tokens the loss counts


@dataclasses.dataclass(frozen=True)
class KnobResult:
    knob: Knob
    run: NumericsRun
    loss_rdiff: float
    grad_norm_rdiff: float
    logp_max_diff: float

    @property
    def passed(self) -> bool:
        k = self.knob
        return (
            self.loss_rdiff <= k.loss_rtol
            and self.grad_norm_rdiff <= k.grad_norm_rtol
            and self.logp_max_diff <= k.logp_atol
        )


def run_engine(config: EngineConfig, payload: Payload) -> NumericsRun:
    """Loss and grad norm from the engine's own programs (fwd_bwd, update), per-token log-probs
    from its decoder and chunked log-prob pass, all on one CPU device."""
    # JAX, here: `check --skip-numerics` checks a micro-batch on a python without it
    import jax
    import jax.numpy as jnp

    from rl_trainer_bench.engine.builtin import loss, model, sharding
    from rl_trainer_bench.engine.builtin.programs import resolved_methods

    devices = jax.devices("cpu")[:1]
    engine = factory.engine_class(factory.BUILT_IN)(config, devices=devices)
    engine.compile(payload)
    engine.fwd_bwd(payload)
    engine.update()
    metrics = engine.get_metrics()
    methods = resolved_methods(config, "cpu")

    def logps_of(params, batch):
        hidden, _, _ = model.decoder(
            params,
            batch,
            config.model,
            capacity_factor=config.moe.ragged_buffer_factor,
            token_chunks=config.moe.token_chunks,
            methods=methods,
            sums=None,
        )
        targets, has_target = loss.next_token_targets(batch["input_ids"], batch["segment_ids"])
        logits_dtype = jnp.dtype(config.loss.logits_dtype)
        head = params["head"].astype(hidden.dtype)
        chunk = config.loss.compute_logps_chunk_size
        logps = loss.sharded_logps(hidden, head, targets, chunk, logits_dtype)
        return logps, (batch["completion_mask"] != 0) & has_target

    precision = None if config.matmul_precision == "default" else config.matmul_precision
    params = model.init_params(config.model, jax.random.key(config.seed))  # the engine's start
    with (
        jax.set_mesh(sharding.make_mesh(config.mesh, devices)),
        jax.default_matmul_precision(precision),
    ):
        logps, mask = jax.jit(logps_of)(params, payload.arrays())
    return NumericsRun(
        float(metrics["loss"]), float(metrics["grad_norm"]), np.asarray(logps), np.asarray(mask)
    )


def _relative(value: float, reference: float) -> float:
    return abs(value - reference) / max(abs(reference), 1e-12)


def check_numerics(
    engine: EngineConfig, payload: Payload, knobs: tuple[Knob, ...] | None = None
) -> tuple[NumericsRun, list[KnobResult]]:
    """Each knob's loss, grad norm and log-probs against the float32 reference, same micro-batch."""
    reference_config = numerics_reference(engine)
    runs = {reference_config: run_engine(reference_config, payload)}  # one run per distinct config
    reference = runs[reference_config]
    results = []
    for knob in knobs if knobs is not None else default_knobs(engine):
        config = knob.apply(reference_config)
        if config not in runs:
            runs[config] = run_engine(config, payload)
        run = runs[config]
        counted = reference.mask & run.mask
        logp_diff = float(np.abs(run.logps - reference.logps)[counted].max(initial=0.0))
        results.append(
            KnobResult(
                knob,
                run,
                _relative(run.loss, reference.loss),
                _relative(run.grad_norm, reference.grad_norm),
                logp_diff,
            )
        )
    return reference, results


def format_numerics(reference: NumericsRun, results: list[KnobResult]) -> str:
    lines = [
        f"numerics against the float32 reference (loss {reference.loss:.6g}, grad norm "
        f"{reference.grad_norm:.6g}, {int(reference.mask.sum())} loss tokens); rel = relative difference",
        f"{'knob':40s} {'loss rel':>10s} {'(tol)':>8s} {'gnorm rel':>10s} {'(tol)':>8s} "
        f"{'max |dlogp|':>12s} {'(tol)':>8s}  verdict",
    ]
    for r in results:
        k = r.knob
        lines.append(
            f"{k.name:40s} {r.loss_rdiff:10.2e} {k.loss_rtol:8.0e} {r.grad_norm_rdiff:10.2e} "
            f"{k.grad_norm_rtol:8.0e} {r.logp_max_diff:12.2e} {k.logp_atol:8.0e}  "
            + ("pass" if r.passed else "FAIL")
        )
    return "\n".join(lines)
