"""COMPILE_CACHE's folder, resolved with no JAX so the plan names it (docs/compile-cache.md)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rl_trainer_bench.errors import ConfigError

OFF = "off"
KNOB = "COMPILE_CACHE"
JAX_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
SUBFOLDER = "rl_trainer_bench/jax"  # the bench's own folder in the user's cache folder
UNSET_HELP = f"{JAX_VARIABLE}, else $XDG_CACHE_HOME/{SUBFOLDER}, else ~/.cache/{SUBFOLDER}"


def parse(name: str, text: str) -> str:
    """`off` (any case), or a folder on this machine: a URL is refused, as the bench checks the
    folder as a local one."""
    if text.strip().lower() == OFF:
        return OFF
    if "://" in text:
        raise ConfigError(
            f"{name}={text!r}: give a folder on this machine (or a mounted volume), or off"
        )
    return text.strip()


def folder(setting: str, env: Mapping[str, str]) -> Path | None:
    """The folder of COMPILE_CACHE=`setting` ("": unset) in a process with environment `env`;
    None when off. XDG_CACHE_HOME counts only when absolute, as the XDG convention says."""
    if setting == OFF:
        return None
    chosen = setting or env.get(JAX_VARIABLE)
    if chosen:
        return Path(chosen).expanduser()
    xdg = env.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg.startswith("/") else Path(env.get("HOME") or Path.home()) / ".cache"
    return base / SUBFOLDER


def describe(setting: str, env: Mapping[str, str] | None) -> str:
    """The plan's line; `env` None: the process that runs is a rendered pod, not this one."""
    if setting == OFF:
        return f"off ({KNOB}=off)"
    if env is None and not setting:
        return f"{KNOB} unset: {JAX_VARIABLE}, else the pod's user cache folder"
    source = (
        KNOB if setting else JAX_VARIABLE if env.get(JAX_VARIABLE) else "the user's cache folder"
    )
    where = folder(setting, env or {})
    if env is not None and where.exists() and not where.is_dir():  # this host's run: say so now
        return f"none: {where} ({source}) is not a folder, so every program compiles"
    return f"{where} ({source})"
