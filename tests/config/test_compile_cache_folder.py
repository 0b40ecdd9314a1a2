"""COMPILE_CACHE's folder: the knob, else JAX's own variable, else the user's cache folder, as the
platform's convention places it; and the plan's line saying which."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_trainer_bench.bench.plan import resolve
from rl_trainer_bench.config import compile_cache
from rl_trainer_bench.config.knobs import BenchConfig
from rl_trainer_bench.errors import ConfigError

HOME = {"HOME": "/home/me"}


@pytest.mark.parametrize(
    ("setting", "env", "expected"),
    [
        ("", HOME, "/home/me/.cache/rl_trainer_bench/jax"),
        ("", {**HOME, "XDG_CACHE_HOME": "/var/cache/me"}, "/var/cache/me/rl_trainer_bench/jax"),
        # a relative XDG_CACHE_HOME is invalid by the convention: ignored
        ("", {**HOME, "XDG_CACHE_HOME": "cache"}, "/home/me/.cache/rl_trainer_bench/jax"),
        ("", {**HOME, "JAX_COMPILATION_CACHE_DIR": "/shared/xla"}, "/shared/xla"),
        (
            "/mnt/volume/xla",
            {**HOME, "JAX_COMPILATION_CACHE_DIR": "/shared/xla"},
            "/mnt/volume/xla",
        ),
        ("off", {**HOME, "JAX_COMPILATION_CACHE_DIR": "/shared/xla"}, None),
    ],
)
def test_the_folder_follows_the_knob_then_jaxs_variable_then_the_user_cache(setting, env, expected):
    found = compile_cache.folder(setting, env)
    assert (None if found is None else str(found)) == expected


@pytest.mark.parametrize(("text", "value"), [("OFF", "off"), (" /a b/c ", "/a b/c")])
def test_the_knob_reads_off_or_a_folder(text, value):
    assert BenchConfig.from_env({"COMPILE_CACHE": text}).compile_cache == value


def test_a_url_is_refused_naming_the_knob():
    with pytest.raises(ConfigError, match=r"^COMPILE_CACHE='gs://b/x': give a folder"):
        BenchConfig.from_env({"COMPILE_CACHE": "gs://b/x"})


def _plan_line(knobs: dict[str, str], env: dict[str, str] | None, rendering=False) -> str:
    plan = resolve(BenchConfig.from_env(knobs), env=env, rendering=rendering)
    (line,) = [line for line in plan.lines() if line.startswith("plan: compiled programs kept")]
    return line


def test_the_plan_names_the_folder_and_what_chose_it():
    assert _plan_line({}, HOME) == (
        "plan: compiled programs kept in: /home/me/.cache/rl_trainer_bench/jax"
        " (the user's cache folder)"
    )
    assert _plan_line({"COMPILE_CACHE": "off"}, HOME) == (
        "plan: compiled programs kept in: off (COMPILE_CACHE=off)"
    )
    # a rendered pod's plan: its own environment decides, and the pod prints the same line
    assert _plan_line({}, HOME, rendering=True) == (
        "plan: compiled programs kept in: COMPILE_CACHE unset: JAX_COMPILATION_CACHE_DIR, else"
        " the pod's user cache folder"
    )
    assert Path(compile_cache.folder("~/x", HOME)) == Path.home() / "x"


def test_the_plan_says_when_the_folder_is_a_file_on_this_host(tmp_path):
    """The run would turn the cache off there (one note, never a failure); the plan says so."""
    a_file = tmp_path / "cache"
    a_file.write_text("")
    assert compile_cache.describe(str(a_file), {}) == (
        f"none: {a_file} (COMPILE_CACHE) is not a folder, so every program compiles"
    )
    assert compile_cache.describe(str(tmp_path), {}) == f"{tmp_path} (COMPILE_CACHE)"
    assert compile_cache.describe(str(a_file), None) == f"{a_file} (COMPILE_CACHE)"  # a pod's
