"""Results outlive the pod: RESULTS_DIR is copied to RESULTS_URI when the run ends, with what the
pod's image has for gs://, and the log says where they went or that they did not."""

from __future__ import annotations

import datetime
import sys
import types

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
