"""Output files: never a device node or a folder replaced, a full disk is the user's one line with
exit 2 and nothing half-written, and an earlier run's files are moved aside, never lost."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
from stand_in_engine import StandInEngine

from rl_trainer_bench import cli
from rl_trainer_bench.bench import driver, entry, results_file
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import (
    check_output_file,
    move_earlier_run_aside,
    write_atomically,
    write_text_atomically,
)

DEVICE = Path("/dev/null")  # a character device every POSIX machine has


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _one_line(text: str) -> str:
    lines = text.splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_a_device_node_a_pipe_or_a_folder_is_never_an_output_file(tmp_path):
    with pytest.raises(UserError, match=r"--out=/dev/null: /dev/null is a character device, not"):
        check_output_file(DEVICE, "--out")
    with pytest.raises(UserError, match="is a character device"):
        write_text_atomically(DEVICE, "x")
    assert DEVICE.is_char_device()
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(UserError, match="is a named pipe"):
        check_output_file(pipe, "--output")
    with pytest.raises(UserError, match="is a folder; name a file in it"):
        check_output_file(tmp_path, "--output")
    link = tmp_path / "link"
    link.symlink_to(DEVICE)
    with pytest.raises(UserError, match="is a character device"):
        check_output_file(link, "--output")
    with pytest.raises(UserError, match=r"the folder .*absent does not exist"):
        check_output_file(tmp_path / "absent" / "f.json", "--output")
    assert check_output_file(tmp_path / "new.json", "--output") == tmp_path / "new.json"


def test_a_full_disk_leaves_the_target_as_it_was_and_no_temporary_file(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("earlier")
    with pytest.raises(UserError) as refused:
        write_atomically(target, _full_disk)
    assert str(refused.value) == (
        f"cannot write {target} (No space left on device): free space there or write elsewhere;"
        " nothing was written"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
    assert target.read_text() == "earlier"


class Line:
    """What ResultsWriter reads of a step record: its JSON."""

    def __init__(self, step: int):
        self.step = step

    def to_json(self) -> dict:
        return {"step": self.step, "padding": "x" * 100}


def test_a_full_disk_mid_run_keeps_whole_lines_only(tmp_path, monkeypatch):
    path = tmp_path / "results.jsonl"
    writer = results_file.ResultsWriter(path)
    writer.write(Line(0))
    monkeypatch.setattr(os, "fsync", _full_disk)
    with pytest.raises(
        UserError, match=r"No space left on device.*the 1 step\(s\) before are kept"
    ):
        writer.write(Line(1))
    assert path.read_text() == '{"step": 0, "padding": "' + "x" * 100 + '"}\n'


def test_a_run_on_a_full_disk_exits_2_and_leaves_no_results_file(tmp_path, monkeypatch, capsys):
    class Engine(StandInEngine):
        def __init__(self, config):
            super().__init__()

    monkeypatch.setattr(driver, "engine_class", lambda spec: Engine)
    monkeypatch.setattr(os, "fsync", _full_disk)
    results = tmp_path / "r"
    env = {"STEPS": "1", "MICRO_STEPS": "1", "RESULTS_DIR": str(results)}
    assert entry.main([], env) == 2
    err = _one_line(capsys.readouterr().err)
    assert err == (
        f"bench_driver: cannot write {results / 'results.jsonl'} (No space left on device): free"
        " space there or set another RESULTS_DIR; none kept"
    )
    assert list(results.iterdir()) == []


def test_payload_and_profile_routing_on_a_full_disk_exit_2_with_one_line(
    tmp_path, monkeypatch, capsys
):
    dump = tmp_path / "dump.npy"
    np.save(dump, np.arange(8, dtype=np.int16).reshape(2, 4, 1, 1) % 4)
    monkeypatch.setattr(os, "fsync", _full_disk)
    profile = tmp_path / "profile.json"
    assert cli.main(["profile-routing", str(dump), "--out", str(profile)]) == 2
    assert _one_line(capsys.readouterr().err).startswith(
        f"rl-trainer-bench profile-routing: cannot write {profile} (No space left on device)"
    )
    out = tmp_path / "mb.npz"
    assert cli.main(["payload", "--out", str(out)]) == 2
    assert "rl-trainer-bench payload: cannot write" in _one_line(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dump.npy"]


# Each command that writes a file, and the function that would start its work (replaced by one
# that fails the test, so a refusal made after the work began is caught).
WRITERS = [
    (["payload", "--out", "DEVICE.npz"], "rl_trainer_bench.payload.command:build_calibrated"),
    (["profile-routing", "DUMP", "--out", "DEVICE"], "rl_trainer_bench.payload.command:np.load"),
    (["aot", "--output", "DEVICE"], "rl_trainer_bench.preflight.aot.check:run_check"),
    (["aot", "--output", "UNDER_A_FILE"], "rl_trainer_bench.preflight.aot.check:run_check"),
    (
        ["render", "--launch-render", "LAUNCH", "--output", "DEVICE"],
        "rl_trainer_bench.launch.render:_read_input",
    ),
]


@pytest.mark.parametrize(("argv", "work"), WRITERS)
def test_every_command_that_writes_refuses_a_bad_output_before_any_work(
    argv, work, tmp_path, monkeypatch, capsys
):
    module, _, attribute = work.partition(":")
    monkeypatch.setattr(f"{module}.{attribute}", _work_started)
    (tmp_path / "a-file").write_text("")
    device = tmp_path / "device.npz"
    device.symlink_to(DEVICE)  # payload writes only .npz names
    names = {
        "DUMP": str(tmp_path / "dump.npy"),
        "LAUNCH": str(tmp_path / "launch.yaml"),
        "DEVICE.npz": str(device),
        "DEVICE": str(DEVICE),
        "UNDER_A_FILE": str(tmp_path / "a-file" / "report.json"),
    }
    assert cli.main([names.get(a, a) for a in argv]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "is a character device, not a regular file" in err or "does not exist" in err
    assert DEVICE.is_char_device()


def _work_started(*args, **kwargs):
    raise AssertionError("the command started its work before checking where it writes")


def test_an_earlier_runs_files_move_aside_into_a_named_folder(tmp_path):
    for name in ("ab.json", "ab.log", "arm1-off.jsonl", "notes.txt"):
        (tmp_path / name).write_text(name)
    os.utime(tmp_path / "ab.json", (1_700_000_000, 1_700_000_000))
    aside = move_earlier_run_aside(tmp_path, ["ab.*", "arm*.jsonl"])
    assert aside is not None and aside.parent == tmp_path and aside.name.startswith("earlier-")
    assert sorted(p.name for p in aside.iterdir()) == ["ab.json", "ab.log", "arm1-off.jsonl"]
    assert (aside / "ab.json").read_text() == "ab.json"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["notes.txt"]
    assert move_earlier_run_aside(tmp_path, ["ab.*"]) is None


def test_run_and_ab_refuse_a_device_node_among_their_files_before_any_work(tmp_path, capsys):
    from rl_trainer_bench.ab import command as ab_command

    results = tmp_path / "r"
    results.mkdir()
    (results / "results.jsonl").symlink_to(DEVICE)
    env = {"RESULTS_DIR": str(results), "ENGINE": "no_such_module:Engine"}
    assert entry.main([], env) == 2  # refused before the engine is even imported
    assert "results.jsonl is a character device" in _one_line(capsys.readouterr().err)
    out = tmp_path / "ab"
    out.mkdir()
    (out / "arm2-off.jsonl").symlink_to(DEVICE)  # schedule seed 1 runs on, off, off', on', ...
    argv = ["ab", "--steps", "1", "--schedule-seed", "1", "--out", str(out)]
    args = cli.build_parser([argv[0]]).parse_args(argv)
    with pytest.raises(UserError, match=r"arm2-off\.jsonl is a character device"):
        ab_command.run(args, make_bench=lambda plan, log: _work_started())  # before any bench
    assert (out / "arm2-off.jsonl").is_symlink() and DEVICE.is_char_device()


@pytest.mark.parametrize("command", ["aot", "hlo-overlap"])
def test_an_empty_output_name_is_refused_not_ignored(command, capsys):
    """`--output "$UNSET"` would otherwise run minutes of compiles and write nothing."""
    from rl_trainer_bench import cli

    assert cli.main([command, "--output", ""]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"rl-trainer-bench {command}: --output: empty; name the file to write"
    )
