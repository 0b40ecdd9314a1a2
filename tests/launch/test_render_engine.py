"""The render's ENGINE knob: the pod times the named engine, and the render says what its image needs."""

from __future__ import annotations

import pytest
from render_helpers import exports, render_fixture

from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch import render
from rl_trainer_bench.launch.knobs import RenderKnobs

STAND_IN = "stand_in_engine:ConfiguredStandInEngine"


def test_render_puts_the_engine_in_the_pod_and_says_what_the_image_needs():
    assert exports(render_fixture(engine=STAND_IN))["ENGINE"] == STAND_IN
    assert "ENGINE" not in exports(render_fixture())
    assert "the trainer's image must have stand_in_engine" in render.engine_requirement(STAND_IN)


def test_render_refuses_a_malformed_engine_and_engine_in_driver_env():
    with pytest.raises(UserError, match="ENGINE='maxtext' is not module:Class"):
        RenderKnobs.from_strings({"engine": "maxtext"})
    with pytest.raises(UserError, match="DRIVER_ENV sets ENGINE"):
        RenderKnobs.from_strings({"driver_env": f"ENGINE={STAND_IN}"})
