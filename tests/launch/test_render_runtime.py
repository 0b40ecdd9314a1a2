"""The render's plan names the runtime the pod will start, from the pod's whole environment: the
container's literal `env` (where launchers set `JAX_PLATFORMS=proxy,cpu`) and the script's exports.
"""

from __future__ import annotations

from reference_data import launch_render
from render_helpers import FIXTURE

from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render_with_plan


def _runtime(path, **knobs: str) -> str:
    rendered = render_with_plan(path.read_text(), path.name, RenderKnobs.from_strings(knobs))
    return rendered.plan.runtime_line()


def test_the_fixtures_pathways_trainer_plans_pathways():
    # The fixture sets JAX_PLATFORMS=proxy,cpu in the client container's env, not on its python line.
    assert _runtime(FIXTURE) == (
        "pathways (JAX_PLATFORMS=proxy,cpu: pathwaysutils.initialize() before any device work;"
        " proxy at the default address (JAX_BACKEND_TARGET unset))"
    )


def test_driver_env_can_choose_another_platform():
    assert _runtime(FIXTURE, driver_env="JAX_PLATFORMS=cpu") == "single process"


def test_the_real_v5p_launcher_plans_pathways_at_its_proxy():
    path = launch_render("tunix-mlperf-397b-256-v5p-trainer.stdout.txt")
    assert _runtime(path).startswith("pathways (JAX_PLATFORMS=proxy,cpu:")
    assert _runtime(path).endswith("proxy at grpc://localhost:29000)")
