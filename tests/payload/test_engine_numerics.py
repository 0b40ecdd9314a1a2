"""Numerics knobs: a rounding-only knob passes against the float32 reference, and each of the three
comparisons fails once its tolerance is below the difference the knob makes."""

import dataclasses

import pytest

from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.payload.build import build_micro_batch
from rl_trainer_bench.payload.engine_numerics import (
    check_numerics,
    default_knobs,
    format_numerics,
    numerics_reference,
)
from rl_trainer_bench.payload.routing_profile import load_profile

TINY = preset("cpu-tiny").engine
# cpu-tiny cut to its one full-attention layer, MoE and all: what these checks judge is the same,
# and each engine run compiles in a third of cpu-tiny's time (linear attention compiles slowly on
# the CPU; tests/engine/test_linear_attention.py checks its numerics).
ONE_LAYER = dataclasses.replace(
    TINY, model=dataclasses.replace(TINY.model, num_layers=1, layer_types=("full_attention",))
)


@pytest.mark.slow
def test_bfloat16_logits_pass_and_each_comparison_can_fail():
    payload = build_micro_batch(ONE_LAYER, load_profile(None), seed=0, index=0)
    bf16 = default_knobs(ONE_LAYER)[0]
    assert bf16.name == "loss.logits_dtype=bfloat16"
    tight = [  # the same setting (run once), one tolerance below what bfloat16 logits change
        dataclasses.replace(bf16, name="tight loss", loss_rtol=1e-7),
        dataclasses.replace(bf16, name="tight grad norm", grad_norm_rtol=1e-7),
        dataclasses.replace(bf16, name="tight logp", logp_atol=1e-7),
    ]
    reference, results = check_numerics(ONE_LAYER, payload, (bf16, *tight))
    assert reference.mask.sum() == (payload.completion_mask != 0).sum()  # the loss's tokens
    rounding = results[0]
    assert rounding.passed, format_numerics(reference, results)
    assert rounding.loss_rdiff > 0 and rounding.grad_norm_rdiff > 0 and rounding.logp_max_diff > 0
    assert [r.passed for r in results[1:]] == [False, False, False]
    verdicts = [
        line.rsplit(" ", 1)[-1] for line in format_numerics(reference, results).splitlines()[2:]
    ]
    assert verdicts == ["pass", "FAIL", "FAIL", "FAIL"]


@pytest.mark.slow
def test_the_token_sorted_dropless_layout_matches_the_capacity_reference():
    payload = build_micro_batch(ONE_LAYER, load_profile(None), seed=0, index=0)
    (knob,) = [k for k in default_knobs(ONE_LAYER) if k.name == "moe.dropless_compute=ragged_dot"]
    reference, results = check_numerics(ONE_LAYER, payload, (knob,))
    assert results[0].passed, format_numerics(reference, results)
    assert numerics_reference(ONE_LAYER).moe.dropless_compute == "capacity"  # two different layouts


def test_the_numerics_check_builds_the_built_in_engine_through_the_factory(monkeypatch):
    """Every command builds an engine by its name through `engine.factory`; the numerics check
    does too, on one CPU device, so it exercises the class a run would."""
    from rl_trainer_bench.engine import factory

    asked = []

    class Stop(Exception):
        pass

    def engine_class(spec, knob="ENGINE"):
        asked.append(spec)

        def build(config, devices):
            asked.append((config.mesh.size, [d.platform for d in devices]))
            raise Stop

        return build

    monkeypatch.setattr(factory, "engine_class", engine_class)
    payload = build_micro_batch(ONE_LAYER, load_profile(None), seed=0, index=0)
    with pytest.raises(Stop):
        check_numerics(ONE_LAYER, payload)
    assert asked == [factory.BUILT_IN, (1, ["cpu"])]
