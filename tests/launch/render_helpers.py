"""Shared test helpers for the renderer tests: the fixture, the real renders, the client script."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rl_trainer_bench.launch.dry_run import client_container
from rl_trainer_bench.launch.knobs import RenderKnobs
from rl_trainer_bench.launch.render import render

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "testdata" / "launch_dryrun_fixture.yaml"
# ../shared beside the repository root (a checkout's parent, or further up for nested checkouts).
SHARED = next(
    (folder / "shared" for folder in REPO.parents if (folder / "shared" / "reference").is_dir()),
    REPO.parent / "shared",
)
LAUNCH_RENDERS = SHARED / "reference" / "launch-renders"


def real_render(name: str) -> Path:
    path = LAUNCH_RENDERS / name
    if not path.is_file():
        pytest.skip(f"reference launch renders absent ({path})")
    return path


def render_fixture(**knobs: str) -> dict:
    text = render(FIXTURE.read_text(), FIXTURE.name, RenderKnobs.from_strings(knobs))
    return yaml.safe_load(text)


def client_script(bench: dict) -> str:
    command = client_container(bench)["command"]
    assert command[:2] == ["bash", "-c"]
    return command[2]


def exports(bench: dict) -> dict[str, str]:
    from rl_trainer_bench.launch.client_command import read_client_command

    return read_client_command(client_script(bench)).env
