"""The driver's refusals: made before any work where the knobs alone decide, never at the cost of
earlier results, always as one line and exit 2.

These run `bench_driver.py`'s entry (`entry.main`) in this process with the knobs as the pod's
environment would give them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rl_trainer_bench.bench import entry

EARLIER = '{"step": 0, "from": "an earlier run"}\n'


def earlier_results(tmp_path: Path) -> Path:
    """A RESULTS_DIR holding an earlier run's results.jsonl."""
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "results.jsonl").write_text(EARLIER)
    return folder


def one_line(err: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err


def test_fused_worker_staging_before_update_is_refused_before_the_runtime_starts(tmp_path, capsys):
    folder = earlier_results(tmp_path)
    env = {"WORKER": "fused", "STAGE_BEFORE_UPDATE": "on", "RESULTS_DIR": str(folder)}
    assert entry.main([], env) == 2
    out, err = capsys.readouterr()
    assert out == ""  # not even the runtime's line: nothing was started
    assert "WORKER=fused" in one_line(err) and "set WORKER=separate" in err
    assert os.listdir(folder) == ["results.jsonl"]
    assert (folder / "results.jsonl").read_text() == EARLIER


def test_a_run_refused_during_set_up_keeps_earlier_results(tmp_path, capsys):
    folder = earlier_results(tmp_path)
    env = {"ROUTING_PROFILE": str(tmp_path / "missing.json"), "RESULTS_DIR": str(folder)}
    assert entry.main([], env) == 2
    assert "missing.json" in one_line(capsys.readouterr().err)
    assert os.listdir(folder) == ["results.jsonl"]
    assert (folder / "results.jsonl").read_text() == EARLIER


def test_a_run_refused_during_set_up_creates_no_results_dir(tmp_path, capsys):
    folder = tmp_path / "fresh" / "results"
    env = {"ROUTING_PROFILE": str(tmp_path / "missing.json"), "RESULTS_DIR": str(folder)}
    assert entry.main([], env) == 2
    assert not (tmp_path / "fresh").exists()


def _unwritable(tmp_path: Path) -> Path:
    """A folder no file can be created in: read-only for a user; for root, sysfs refuses files."""
    if os.geteuid() == 0:
        return Path("/sys/rl-trainer-bench-results")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    return locked / "results"


@pytest.mark.parametrize(
    "case, expected",
    [
        ("file", "is a file; name a folder"),
        ("under_file", "lies under the file"),
        ("unwritable", "cannot write in"),
    ],
)
def test_results_dir_that_cannot_hold_results_is_refused_before_any_work(
    tmp_path, capsys, case, expected
):
    blocker = tmp_path / "blocker"
    blocker.write_text("keep me\n")
    folder = {
        "file": blocker,
        "under_file": blocker / "results",
        "unwritable": _unwritable(tmp_path),
    }[case]
    assert entry.main([], {"RESULTS_DIR": str(folder)}) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert one_line(err).startswith(f"bench_driver: RESULTS_DIR={folder}: ")
    assert expected in err
    assert blocker.read_text() == "keep me\n"
    assert not folder.exists() or case == "file"
