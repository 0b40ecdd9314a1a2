"""The step boundary's copy before launch: its bytes are the micro-batch's, split as the mesh and
the runtime split it, and its predicted cost follows the link's rate and per-transfer cost; the
run measures that link, and an A/B's report sets the prediction beside what the steps measured."""

from __future__ import annotations

import dataclasses

import jax
import pytest

from rl_trainer_bench import cli
from rl_trainer_bench.ab import boundary
from rl_trainer_bench.bench import host_link
from rl_trainer_bench.bench.boundary_copy import (
    ASSUMED,
    MEASURED,
    HostLink,
    boundary_copy,
    exposed_with_stage,
)
from rl_trainer_bench.bench.runtime import runtime_for
from rl_trainer_bench.bench.step_record import ArmRun, StepRecord
from rl_trainer_bench.chips.accelerators import parse_slice
from rl_trainer_bench.config.presets import PRESETS
from rl_trainer_bench.engine.factory import BUILT_IN
from rl_trainer_bench.payload.build import build_micro_batch
from rl_trainer_bench.payload.routing_profile import load_profile

CPU_TINY = PRESETS["cpu-tiny"].engine_for(BUILT_IN)
CELL = PRESETS["qwen3.5-397b-cell"].engine_for(BUILT_IN)
PATHWAYS = runtime_for({"JAX_PLATFORMS": "proxy,cpu"})
ONE_PROCESS_A_HOST = runtime_for({"TPU_WORKER_HOSTNAMES": ",".join(f"h{i}" for i in range(32))})


@pytest.mark.parametrize("filler", [0, 5000])
def test_the_bytes_are_the_micro_batchs_array_by_array(filler):
    engine = dataclasses.replace(CPU_TINY, extra_host_bytes=filler)
    built = build_micro_batch(engine, load_profile(None), seed=0, index=0)
    copy = boundary_copy(engine, None, None)
    assert dict(copy.arrays) == {name: a.nbytes for name, a in built.arrays().items()}
    assert copy.total == built.nbytes
    assert (copy.devices, copy.hosts, copy.sent_by_client) == (8, 1, built.nbytes)


def test_the_397b_cells_copy_per_device_per_host_and_as_the_client_sends_it():
    """64 rows of 65,536 tokens: six [B, T] arrays of 4 bytes a token (100,663,296 B) and the
    routes of 60 layers x 10 experts at 2 bytes (5,033,164,800 B), over 256 devices on 32 hosts."""
    tpu7x = parse_slice("tpu7x:4x4x8")
    through_proxy = boundary_copy(CELL, PATHWAYS, tpu7x)
    assert through_proxy.total == 5_133_828_096
    assert through_proxy.per_device == 20_054_016  # 5,133,828,096 / 256
    assert through_proxy.per_host == 160_432_128  # 8 devices a host
    assert through_proxy.sent_by_client == 5_133_828_096  # every host's share through the proxy
    assert boundary_copy(CELL, ONE_PROCESS_A_HOST, tpu7x).sent_by_client == 160_432_128


def test_the_predicted_copy_is_the_transfers_fixed_cost_and_the_bytes_over_the_rate():
    copy = boundary_copy(CELL, PATHWAYS, parse_slice("tpu7x:4x4x8"))
    link = HostLink(bytes_per_s=1e9, per_transfer_s=1e-3, kind=ASSUMED, source="a test")
    assert copy.seconds(link) == pytest.approx(7 * 1e-3 + 5.133828096)
    assert exposed_with_stage(0.2, 10.945) == 0  # a copy shorter than the last fwd_bwd: hidden
    assert exposed_with_stage(7.6, 5.0) == pytest.approx(2.6)
    line = copy.prediction_line(link)
    assert "each step's first fwd_bwd waits 5.14e+03 ms" in line
    assert "1 GB/s and 1 ms a transfer, ASSUMED (a test)" in line


def test_the_plan_prints_the_bytes_and_the_boundarys_cost_for_a_pathways_pod(monkeypatch, capsys):
    monkeypatch.setenv("JAX_PLATFORMS", "proxy,cpu")
    monkeypatch.setenv("TRAINER_SLICE", "tpu7x:4x4x8")
    assert cli.main(["run", "--plan", "--preset", "qwen3.5-397b-cell"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (bytes_line,) = [line for line in lines if line.startswith("plan: micro-batch bytes:")]
    assert "routed_experts 4.69 GiB" in bytes_line
    assert "per host (32)" in bytes_line
    assert "the Pathways client sends every host's share through its proxy: 4.78 GiB" in bytes_line
    (boundary_line,) = [line for line in lines if line.startswith("plan: step boundary:")]
    assert "ASSUMED" in boundary_line and boundary_line.endswith("this run: off")


class CopyingEngine:
    """An engine with its own copy of an unstaged input: a plain `device_put`, its calls counted."""

    def __init__(self):
        self.copies = []

    def copy_input(self, payload):
        self.copies.append(payload.name)
        return jax.device_put(payload.arrays())


@pytest.mark.parametrize("own_copy", [False, True], ids=["plain", "engine's-own-copy"])
def test_the_link_is_measured_with_the_micro_batchs_bytes_over_every_device(own_copy):
    """An engine with its own copy of an unstaged input is timed through it (a first copy, then
    timed ones); one without is timed as a plain engine's unstaged input goes."""
    engine = dataclasses.replace(CPU_TINY, extra_host_bytes=1 << 20)
    payload = build_micro_batch(engine, load_profile(None), seed=0, index=0)
    copying = CopyingEngine() if own_copy else object()
    link, copy_s, sent = host_link.measure(payload, engine.mesh, copying)
    assert sent == payload.nbytes  # one process: every device's share
    assert link.kind == MEASURED and link.per_transfer_s > 0 and copy_s > 0
    assert f"{len(payload.arrays())} arrays, {sent:,} B from this process" in link.source
    if own_copy:
        assert "by CopyingEngine's own copy of an unstaged input" in link.source
        assert set(copying.copies) == {payload.name} and 2 <= len(copying.copies) <= 6
    else:
        assert "as a plain engine's unstaged input goes" in link.source


def test_the_links_rate_leaves_out_the_fixed_costs_and_each_array_pays_its_share():
    """7 arrays, 50 MB: the micro-batch's copy took 52.1 ms, seven one-element arrays 2.1 ms. So
    each array's fixed cost is 0.3 ms, and the rate 50 MB over the 50.0 ms left: 1.0 GB/s; the
    same link predicts the copy back, 7 x 0.3 + 50 ms."""
    link = host_link.fit(0.0521, 0.0021, 7, 50_000_000, "a test")
    assert link.per_transfer_s == pytest.approx(0.0003)
    assert link.bytes_per_s == pytest.approx(1.0e9)
    assert link.kind == MEASURED and link.source == "a test"
    copy = dataclasses.replace(
        boundary_copy(CPU_TINY, None, None), arrays=tuple((f"a{i}", 0) for i in range(6))
    )
    copy = dataclasses.replace(copy, arrays=(*copy.arrays, ("big", 50_000_000)))
    assert copy.seconds(link) == pytest.approx(0.0521)
    assert host_link.fit(0.002, 0.0021, 7, 10, "x").bytes_per_s == float("inf")


def _record(
    step: int, first_extra: float | None, hidden: float | None = None, wait: float = 0.0
) -> StepRecord:
    return StepRecord(
        step=step, warmup=False, step_s=1.0, fwd_bwd_dispatch_s=[0.0, 0.0],
        first_call_extra_s=first_extra, update_s=0.0, drain_s=0.0, stage_s=0.0,
        device_wait_s=wait, tokens=1, tokens_per_s_per_device=1.0, tflops_per_device=None,
        mfu=None, loss=0.0, grad_norm=0.0, loss_denominator=1.0, overflow_count=0,
        replay_count=0, micro_batches=[], digests=[], device_ready_s=[], update_ready_s=None,
        boundary_idle_s=None, stage_hidden=hidden, fwd_bwd_device_s=[0.5, 0.4, 0.4, 0.4],
        staged=None if hidden is None else f"bench_{step + 1}_0",
    )  # fmt: skip


def test_the_ab_report_sets_the_prediction_beside_what_each_kind_of_boundary_measured():
    off = ArmRun("off", "off", False, [_record(0, 0.030), _record(1, 0.034)], boundary_copy_s=0.031)
    staged = [_record(0, 0.001, 0.98, wait=0.41), _record(1, 0.003, 0.96, wait=0.43)]
    on = ArmRun("on", "on", True, staged)
    compared = boundary.compare([off, on])
    assert compared.copy_s == 0.031  # the one bench that timed it
    assert compared.unstaged_extra_s == pytest.approx(0.032)
    assert compared.staged_extra_s == pytest.approx(0.002)
    assert compared.fwd_bwd_s == pytest.approx(0.4)
    assert compared.predicted_staged_s == 0  # a 31 ms copy beside a 400 ms fwd_bwd
    assert compared.hidden == pytest.approx(0.97)
    assert compared.stage_wait_s == pytest.approx(0.42)
    (line,) = compared.lines()
    assert "after an unstaged boundary 32.00 ms (predicted: the copy, 31.00 ms)" in line
    assert "after a staged one 2.00 ms (predicted 0.00 ms" in line
    assert "a staging step waited 420.00 ms for the device before update" in line
    assert boundary.compare([dataclasses.replace(off, boundary_copy_s=None)]) is None
