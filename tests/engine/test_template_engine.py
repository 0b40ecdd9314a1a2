"""The template engine in examples/ (docs/engine-template.md): `check-engine` passes it, and it
trains: its step counts the payload's tokens and its updates lower the loss they are computed on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from rl_trainer_bench import cli
from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.engine.contract import example_payloads_for

EXAMPLES = Path(__file__).parents[2] / "examples"
SPEC = "template_engine:TemplateEngine"


@pytest.fixture
def template(monkeypatch):
    """The examples folder on the import path, as docs/engine-template.md runs it."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    return pytest.importorskip("template_engine")


def test_check_engine_passes_the_template(template, capsys):
    assert cli.main(["check-engine", "--engine", SPEC]) == 0
    out = capsys.readouterr().out
    assert f"check-engine: {SPEC} conforms to the engine contract (cpu-tiny)" in out
    assert "check-engine: no share_state: an A/B whose arms change this engine's programs" in out
    assert "FAIL" not in out


def test_a_step_counts_the_tokens_of_all_its_micro_batches(template):
    config = preset("cpu-tiny").engine
    payloads = example_payloads_for(config, 2, prefix="t")
    engine = template.TemplateEngine(config)
    assert set(engine.compile(payloads[0])) == {"fwd_bwd", "update"}
    for payload in payloads:
        engine.fwd_bwd(payload)
    assert engine.update() == 1
    metrics = engine.get_metrics()
    # cpu-tiny: 4 rows of 128 tokens in two 64-token segments; a segment's completion mask covers
    # positions 32..62, 31 tokens: 4 rows x 2 segments x 31 = 248 per micro-batch.
    assert metrics["loss_denominator"] == 2 * 248
    assert metrics["tokens"] == 2 * 4 * 128
    assert metrics["overflow_count"] is None and metrics["replay_count"] is None
    assert engine.get_metrics() == {}  # clear_cache forgot them


def test_its_updates_lower_the_surrogate_they_descend(template):
    """Training on one micro-batch at a large rate: each step's loss (computed before its update)
    falls, so the gradient is real and reaches the weights."""
    config = preset("cpu-tiny").engine
    fast = dataclasses.replace(config.optimizer, learning_rate=3e-2, max_grad_norm=1e9)
    config = dataclasses.replace(config, optimizer=fast)
    (payload,) = example_payloads_for(config, 1, prefix="t")
    engine = template.TemplateEngine(config)
    engine.compile(payload)
    losses = []
    for _ in range(6):
        engine.fwd_bwd(payload)
        engine.update()
        losses.append(engine.get_metrics()["loss"])
    assert np.all(np.diff(losses) < 0), losses
    assert losses[-1] < losses[0] - 0.1, losses
