"""The runtime a pod starts is the one its environment asks for, and the plan names it first.

Launchers start the trainer under Pathways with `JAX_PLATFORMS=proxy,cpu` (the reference v5p and
tpu7x launchers both do); that must start Pathways, as pathwaysutils itself decides it does.
"""

from __future__ import annotations

import sys
import types

import pytest

from rl_trainer_bench.bench import entry
from rl_trainer_bench.bench.distributed import initialize_runtime
from rl_trainer_bench.bench.runtime import runtime_for

LAUNCHER_PLATFORMS = "proxy,cpu"  # the launcher's exact value


@pytest.mark.parametrize(
    ("env", "kind"),
    [
        ({"JAX_PLATFORMS": LAUNCHER_PLATFORMS}, "pathways"),
        ({"JAX_PLATFORMS": "proxy"}, "pathways"),
        ({"JAX_PLATFORMS": " CPU , Proxy "}, "pathways"),
        ({"JAX_PLATFORMS": "tpu,cpu"}, "single process"),
        ({"JAX_PLATFORMS": "cpu", "JAX_COORDINATOR_ADDRESS": "h:1234"}, "multi-process"),
        ({"TPU_WORKER_HOSTNAMES": "h0,h1"}, "multi-host TPU"),
        ({"TPU_WORKER_HOSTNAMES": "h0"}, "single process"),
        ({}, "single process"),
    ],
)
def test_the_runtime_follows_the_environment(env, kind):
    assert runtime_for(env).kind == kind


def test_pathways_under_the_launchers_platforms_calls_pathwaysutils_initialize(monkeypatch):
    # pathwaysutils needs a Pathways cluster; a module of that name records the one call the
    # driver makes of it, before anything touches a device.
    calls = []
    stand_in = types.ModuleType("pathwaysutils")
    stand_in.initialize = lambda: calls.append("initialize")
    monkeypatch.setitem(sys.modules, "pathwaysutils", stand_in)
    line = initialize_runtime({"JAX_PLATFORMS": LAUNCHER_PLATFORMS}, 0)
    assert calls == ["initialize"]
    assert line == "runtime: pathways via pathwaysutils.initialize() (JAX_PLATFORMS=proxy,cpu)"


def test_the_plan_names_the_pathways_runtime_before_anything_runs(capsys):
    env = {
        "PLAN_ONLY": "1",
        "JAX_PLATFORMS": LAUNCHER_PLATFORMS,
        "JAX_BACKEND_TARGET": "grpc://localhost:29000",
    }
    assert entry.main([], env) == 0
    lines = capsys.readouterr().out.splitlines()
    runtime = [line for line in lines if line.startswith("plan: runtime:")]
    assert runtime == [
        "plan: runtime: pathways (JAX_PLATFORMS=proxy,cpu: pathwaysutils.initialize() before any"
        " device work; proxy at grpc://localhost:29000)"
    ]


def test_the_plan_of_a_single_process_says_so(capsys):
    assert entry.main([], {"PLAN_ONLY": "1", "PRESET": "qwen3-30b-a3b-cell"}) == 0
    assert "plan: runtime: single process" in capsys.readouterr().out.splitlines()


def test_the_plan_of_a_host_preset_says_it_runs_on_the_hosts_cpu(capsys):
    assert entry.main([], {"PLAN_ONLY": "1"}) == 0  # cpu-tiny, the default
    assert (
        "plan: runtime: single process (host CPU, 8 devices: JAX_PLATFORMS=cpu for a host preset;"
        " an accelerator of this host stays idle, a chip's own preset runs on it)"
    ) in capsys.readouterr().out.splitlines()
