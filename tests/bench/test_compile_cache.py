"""Compiled programs kept between runs: a second `run` of the same cell loads every program it
compiles from COMPILE_CACHE's folder, as its own log says; a folder that cannot be written is
one line and the cache off, never a failure."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rl_trainer_bench.ab import command as ab_command
from rl_trainer_bench.ab import parser as ab_parser
from rl_trainer_bench.bench import persistent_cache

STAND_IN = "stand_in_engine:ConfiguredStandInEngine"

_SMALLEST = ("--steps", "1", "--warmup-steps", "1", "--micro-steps", "1")
_SMALLEST += ("--distinct-micro-batches", "1")
# No dropless retry: the programs the other cpu-tiny runs of the suite compile (the A/B and driver
# tests'), so the first run may load them too; the dropless program would be a third of its compile.
_SMALLEST += ("--engine-flags", "retry_when_tokens_dropped=false")
_COUNTS = re.compile(r"^\[TrainerBench\] compile cache: hits=(\d+) misses=(\d+) ", re.M)


def _run(cache: Path, results: Path) -> tuple[int, int]:
    """One smallest cpu-tiny `run` in a fresh process: (hits, misses) as its log says."""
    done = subprocess.run(
        [sys.executable, "-m", "rl_trainer_bench.cli", "run", *_SMALLEST],
        env={**os.environ, "COMPILE_CACHE": str(cache), "RESULTS_DIR": str(results)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"[TrainerBench] compile cache: {cache} (COMPILE_CACHE=off" in done.stdout
    (counts,) = _COUNTS.findall(done.stdout)
    return int(counts[0]), int(counts[1])


def test_a_second_run_loads_every_program_the_first_compiled(tmp_path):
    """In the session's cache (tests/conftest.py), where another test may have put the cell's
    programs already: the first run loads or compiles each, the second loads them all."""
    cache = Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    hits, misses = _run(cache, tmp_path / "first")
    # the engine's two step programs, its initial state and its digest, at least
    assert hits + misses >= 4
    assert _run(cache, tmp_path / "second") == (hits + misses, 0)


def test_a_folder_that_cannot_be_written_turns_the_cache_off_in_one_line(tmp_path):
    (tmp_path / "a-file").write_text("")
    folder = tmp_path / "a-file" / "cache"
    kept = Path(os.environ["JAX_COMPILATION_CACHE_DIR"])  # the session's (tests/conftest.py)
    try:
        line = persistent_cache.use(folder, os.environ)
        assert line == (
            f"compile cache: off, {folder} cannot be written (Not a directory): every program"
            " compiles"
        )
        assert persistent_cache.summary() == "compile cache: off"
        assert persistent_cache.use(None, os.environ) == (
            "compile cache: off, COMPILE_CACHE=off: every program compiles"
        )
    finally:
        persistent_cache.use(kept, os.environ)
    assert (
        persistent_cache.summary()
        == f"compile cache: hits=0 misses=0 since the run began, in {kept}"
    )


@pytest.mark.parametrize(
    "given", [["--compile-cache", "{folder}"], ["--knob", "COMPILE_CACHE=off"]]
)
def test_ab_keeps_its_programs_where_its_flag_or_knob_says(tmp_path, given):
    """The stand-in engine's A/B in this process: its log's cache line, and the folder it filled;
    the session's cache restored after, as the other tests use it."""
    folder = tmp_path / "ab-cache"
    parser = argparse.ArgumentParser()
    ab_parser.add_arguments(parser)
    argv = ["--arms", "off,on", "--steps", "1", "--out", str(tmp_path / "ab"), "--engine", STAND_IN]
    args = parser.parse_args([*argv, *(word.format(folder=folder) for word in given)])
    kept = Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    try:
        assert ab_command.run(args) == 0
    finally:
        persistent_cache.use(kept, os.environ)
    log = (tmp_path / "ab" / "ab.log").read_text()
    if "--compile-cache" in given:
        assert f"compile cache: {folder} (COMPILE_CACHE=off turns it off)" in log
        # the stand-in's few programs compiled in this process already: none asks the cache
        assert f"compile cache: hits=0 misses=0 since the run began, in {folder}\n" in log
        assert folder.is_dir()
    else:
        assert "compile cache: off, COMPILE_CACHE=off: every program compiles" in log
        assert "compile cache: off\n" in log
        assert not folder.exists()
