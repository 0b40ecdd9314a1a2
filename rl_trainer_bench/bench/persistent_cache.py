"""JAX's persistent compilation cache where COMPILE_CACHE says, its hits counted
(docs/compile-cache.md)."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

import jax
from jax.experimental.compilation_cache import compilation_cache

# JAX's events (jax.monitoring): a compile that asked the cache, and one the cache answered.
ASKED = "/jax/compilation_cache/compile_requests_use_cache"
HIT = "/jax/compilation_cache/cache_hits"
PREFIX = "compile cache:"

_lock = threading.Lock()  # programs compile on several threads at once (engine/background.py)
_counts = {ASKED: 0, HIT: 0}
_listening: list[bool] = []  # one listener a process, however many runs it starts


def _count(event: str, **_metadata: object) -> None:
    if event in _counts:
        with _lock:
            _counts[event] += 1


def use(folder: Path | None, env: Mapping[str, str]) -> str:
    """Point JAX's cache at `folder` (None: off) before this process compiles, its counts from 0;
    the log's line saying where, or why it is off."""
    if not _listening:
        jax.monitoring.register_event_listener(_count)
        _listening.append(True)
    _counts.update(dict.fromkeys(_counts, 0))
    problem = "" if folder is None else unwritable(folder)
    if folder is None or problem:  # JAX would fail the first compile in an unwritable folder
        jax.config.update("jax_enable_compilation_cache", False)
        compilation_cache.reset_cache()  # JAX decides once per process whether it caches
        why = f"{folder} cannot be written ({problem})" if problem else "COMPILE_CACHE=off"
        return f"{PREFIX} off, {why}: every program compiles"
    if not env.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):  # quick programs kept too
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_enable_compilation_cache", True)
    compilation_cache.reset_cache()
    return f"{PREFIX} {folder} (COMPILE_CACHE=off turns it off)"


def unwritable(folder: Path) -> str:
    """Why no file can be made in `folder` (made if missing), or ''."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as error:
        return error.strerror or str(error)
    return ""


def summary() -> str | None:
    """The log's line after a compile: of the run's compiles so far, how many loaded their program
    from the cache and how many compiled it (and wrote it there); None where `use` was not called
    (a Bench built apart from a run, whose compiles nobody counted)."""
    if not _listening:
        return None
    if not jax.config.jax_enable_compilation_cache:
        return f"{PREFIX} off"
    with _lock:
        asked, hits = _counts[ASKED], _counts[HIT]
    folder = jax.config.jax_compilation_cache_dir
    return f"{PREFIX} hits={hits} misses={asked - hits} since the run began, in {folder}"
