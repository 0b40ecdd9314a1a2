"""Results outlive the pod: RESULTS_DIR is copied to RESULTS_URI as the run goes (a separate
process, each file a few seconds after it changed) and when it ends, with what the pod's image has
for gs://, and the log says where they went or that they did not."""

from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from rl_trainer_bench.bench import entry, results_copy

STAND_IN = "stand_in_engine:ConfiguredStandInEngine"


def _folder(tmp_path):
    folder = tmp_path / "results"
    (folder / "profile").mkdir(parents=True)
    (folder / "results.jsonl").write_text('{"step": 0}\n')
    (folder / "profile" / "trace.pb").write_bytes(b"\x00\x01")
    return folder


def test_each_run_gets_its_own_folder_under_the_uri():
    when = datetime.datetime(2026, 12, 3, 14, 5, 9, tzinfo=datetime.UTC)
    assert results_copy.destination("gs://b/runs/", when) == "gs://b/runs/20261203-140509"


def test_a_mounted_volume_gets_every_file(tmp_path):
    lines = []
    assert results_copy.copy_results(_folder(tmp_path), str(tmp_path / "volume"), lines.append)
    (copied,) = (tmp_path / "volume").iterdir()
    assert (copied / "results.jsonl").read_text() == '{"step": 0}\n'
    assert (copied / "profile" / "trace.pb").read_bytes() == b"\x00\x01"
    assert lines == [f"results: copied 2 files to {copied}"]


def test_gs_without_any_tool_says_the_files_stay_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(results_copy, "_module", lambda name: None)
    monkeypatch.setattr(results_copy.shutil, "which", lambda name: None)
    lines = []
    assert not results_copy.copy_results(_folder(tmp_path), "gs://bucket/x", lines.append)
    assert lines[-1].startswith("results: NOT copied to gs://bucket/x/")
    assert "gcsfs, tensorflow.io.gfile, gcloud storage, gsutil" in lines[-1]


def test_gs_uses_the_first_library_the_image_has(tmp_path, monkeypatch):
    # gcsfs needs Cloud Storage; a module of that name records the uploads the copy asks for.
    uploads = []

    class FileSystem:
        def put_file(self, local, remote):
            uploads.append((local, remote))

    monkeypatch.setitem(sys.modules, "gcsfs", types.SimpleNamespace(GCSFileSystem=FileSystem))
    lines = []
    folder = _folder(tmp_path)
    assert results_copy.copy_results(folder, "gs://bucket/x", lines.append)
    target = lines[-1].split(" to ")[1].split(" with ")[0]
    assert sorted(uploads) == [
        (str(folder / "profile" / "trace.pb"), f"{target}/profile/trace.pb"),
        (str(folder / "results.jsonl"), f"{target}/results.jsonl"),
    ]
    assert lines[-1].endswith(" with gcsfs")


def test_the_driver_copies_its_results_when_the_run_ends(tmp_path, capsys):
    env = {
        "ENGINE": STAND_IN,
        "STEPS": "1",
        "MICRO_STEPS": "1",
        "RESULTS_DIR": str(tmp_path / "r"),
        "RESULTS_URI": str(tmp_path / "kept"),
    }
    assert entry.main([], env) == 0
    (copied,) = (tmp_path / "kept").iterdir()
    assert len((copied / "results.jsonl").read_text().splitlines()) == 2
    assert f"results: copied 1 files to {copied}" in capsys.readouterr().out.splitlines()


def test_the_plan_says_where_results_will_be(capsys):
    assert entry.main([], {"PLAN_ONLY": "1"}) == 0
    out = capsys.readouterr().out
    assert "plan: results: bench_results on the pod's disk, lost with the pod" in out


@pytest.mark.parametrize("uri", ["s3://bucket/x", "ftp://host/x", "gs://", "gs:///x"])
def test_a_results_uri_the_bench_cannot_write_is_refused_before_anything_runs(uri, capsys):
    """Another scheme would be copied into a local folder of that name and lost with the pod."""
    assert entry.main([], {"PLAN_ONLY": "1", "RESULTS_URI": uri}) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(
        f"RESULTS_URI={uri!r}: give a gs://BUCKET/folder or a folder on a mounted volume"
    )


def test_a_volume_that_cannot_take_the_files_is_logged_not_raised(tmp_path):
    """The copy runs as the run ends: a full or read-only volume must not replace its exit code."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the volume's folder should be")
    lines: list[str] = []
    assert not results_copy.copy_results(_folder(tmp_path), str(blocker / "out"), lines.append)
    (line,) = lines
    assert line.startswith(f"results: NOT copied to {blocker / 'out'}/")


def _wait_for(condition, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def _copied(uri: Path, name: str = "results.jsonl") -> str:
    found = list(uri.glob(f"*/{name}"))
    return found[0].read_text() if found else ""


def test_each_step_is_copied_while_the_run_goes_on(tmp_path):
    folder, uri, lines = tmp_path / "results", tmp_path / "volume", []
    folder.mkdir()
    with results_copy.copying(folder, str(uri), lines.append, interval=0.05):
        (folder / "results.jsonl").write_text('{"step": 0}\n')
        assert _wait_for(lambda: _copied(uri) == '{"step": 0}\n')
        with (folder / "results.jsonl").open("a") as file:
            file.write('{"step": 1}\n')
        assert _wait_for(lambda: _copied(uri) == '{"step": 0}\n{"step": 1}\n')
    (target,) = uri.iterdir()
    assert lines[0].startswith(f"results: copying {folder} to {target} as the run goes (pid ")
    assert lines[-1] == f"results: copied 1 files to {target}"


_KILLED_RUN = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from rl_trainer_bench.bench import results_copy
    folder = Path(sys.argv[1])
    folder.mkdir()
    with results_copy.copying(folder, sys.argv[2], lambda line: print(line, flush=True), 0.05):
        (folder / "results.jsonl").write_text('{"step": 0}\\n')
        time.sleep(60)  # the next step, which SIGKILL ends
    """
)


def test_a_run_killed_without_warning_keeps_the_steps_that_ended(tmp_path):
    """What a preempted pod does once its grace period is over: SIGKILL, no code of the run's
    runs again, and the copier, its parent gone, ends too."""
    uri = tmp_path / "volume"
    run = subprocess.Popen(
        [sys.executable, "-c", _KILLED_RUN, str(tmp_path / "results"), str(uri)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )
    try:
        copier = int(re.search(r"\(pid (\d+),", run.stdout.readline()).group(1))
        assert _wait_for(lambda: _copied(uri) == '{"step": 0}\n')
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
        run.stdout.close()
    assert _wait_for(lambda: not Path(f"/proc/{copier}").exists() or _zombie(copier))


def _zombie(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"


def test_a_local_uri_the_render_checked_is_not_called_a_mounted_volume_here(capsys):
    assert entry.main([], {"PLAN_ONLY": "1", "RESULTS_URI": "/mnt/runs"}) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "results:" in line)
    assert "by a separate process within 5 s of changing" in line
    assert "(a local folder: it outlives the pod only on a mounted durable volume" in line
