"""The one error boundary: every way a command can end is one line and a documented exit code."""

import subprocess
import sys

import pytest

from rl_trainer_bench.errors import (
    EXIT_BUG,
    EXIT_INTERRUPTED,
    EXIT_USER_ERROR,
    TRACEBACK_VARIABLE,
    UserError,
    run_guarded,
)
from rl_trainer_bench.io import read_user_text


def _raise(error: BaseException):
    def body():
        raise error

    return body


def _one_line(text: str) -> str:
    lines = text.splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_user_error_is_its_line_and_exit_2(capsys):
    assert run_guarded("cmd", _raise(UserError("KNOB=x: use y"))) == EXIT_USER_ERROR
    assert _one_line(capsys.readouterr().err) == "cmd: KNOB=x: use y"


def test_a_type_the_caller_names_counts_as_the_users(capsys):
    class ContractLike(ValueError):
        pass

    assert run_guarded("cmd", _raise(ContractLike("field f")), (ContractLike,)) == 2
    assert _one_line(capsys.readouterr().err) == "cmd: field f"


def test_a_file_error_names_the_path_and_exits_2(capsys, tmp_path):
    missing = tmp_path / "missing.yaml"
    assert run_guarded("cmd", missing.read_text) == EXIT_USER_ERROR
    assert _one_line(capsys.readouterr().err) == f"cmd: {missing}: No such file or directory"


def test_anything_else_is_a_named_bug_without_a_traceback(capsys, monkeypatch):
    monkeypatch.delenv(TRACEBACK_VARIABLE, raising=False)
    assert run_guarded("cmd", _raise(KeyError("x\ny"))) == EXIT_BUG
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("cmd: internal error, a bug in rl_trainer_bench: KeyError: ")
    assert TRACEBACK_VARIABLE in line


def test_an_os_error_without_a_path_is_a_bug_not_the_users(capsys, monkeypatch):
    monkeypatch.delenv(TRACEBACK_VARIABLE, raising=False)
    assert run_guarded("cmd", _raise(OSError("no path"))) == EXIT_BUG


def test_the_traceback_variable_lets_a_bug_through_for_its_report(monkeypatch):
    monkeypatch.setenv(TRACEBACK_VARIABLE, "1")
    with pytest.raises(KeyError):
        run_guarded("cmd", _raise(KeyError("x")))


def test_ctrl_c_is_one_line_and_130(capsys):
    assert run_guarded("cmd", _raise(KeyboardInterrupt())) == EXIT_INTERRUPTED
    assert _one_line(capsys.readouterr().err) == "cmd: interrupted"


@pytest.mark.parametrize(("code", "expected"), [(0, 0), (2, 2), (None, 0), ("message", 1)])
def test_system_exit_keeps_its_code(code, expected):
    assert run_guarded("cmd", _raise(SystemExit(code))) == expected


def test_returned_code_passes_through():
    assert run_guarded("cmd", lambda: 1) == 1
    assert run_guarded("cmd", lambda: None) == 0


def test_a_reader_that_stops_reading_ends_the_command_quietly():
    """`rl-trainer-bench ... | head`: no traceback, no 'Exception ignored' at exit, exit 0."""
    program = (
        "import sys\n"
        "from rl_trainer_bench.errors import run_guarded\n"
        "def body():\n"
        "    for _ in range(20000):\n"
        "        print('x' * 200)\n"
        "sys.exit(run_guarded('cmd', body))\n"
    )
    producer = subprocess.Popen(
        [sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    producer.stdout.read(10)
    producer.stdout.close()
    stderr = producer.stderr.read().decode()
    assert producer.wait(timeout=60) == 0
    assert stderr == ""


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("missing.txt", None, "No such file or directory"),
        ("folder", "dir", "Is a directory"),
        ("binary.bin", bytes(range(256)), "not UTF-8 text (byte 128)"),
        ("flags.gz", b"\x1f\x8b\x08\x00\xff", "gzip data (byte 1)"),
        ("nul\x00name", None, "embedded null byte"),
    ],
)
def test_user_files_that_are_not_text_are_one_line_errors(tmp_path, name, content, reason):
    path = tmp_path / name if "\x00" not in name else f"{tmp_path}/{name}"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(UserError) as refused:
        read_user_text(path, "--flag")
    message = str(refused.value)
    assert message.startswith("--flag ") and reason in message and "\n" not in message


def test_a_full_disk_without_a_path_is_the_users_machine_not_a_bug(capsys):
    import errno
    import os

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert run_guarded("cmd", _raise(full)) == EXIT_USER_ERROR
    assert _one_line(capsys.readouterr().err) == (
        "cmd: No space left on device: free space on that disk or write somewhere else"
    )


@pytest.mark.parametrize(
    ("missing", "install"),
    [
        ("libtpu", "pip install -e '.[tpu]'"),
        ("yaml.cyaml", "pip install -e . (the base install"),
        ("somepkg", "install the package that provides 'somepkg'"),
    ],
)
def test_a_missing_third_party_package_is_named_with_its_install(
    missing, install, capsys, monkeypatch
):
    monkeypatch.delenv(TRACEBACK_VARIABLE, raising=False)
    error = ModuleNotFoundError(f"No module named {missing!r}", name=missing)
    assert run_guarded("cmd", _raise(error)) == EXIT_USER_ERROR
    line = _one_line(capsys.readouterr().err)
    assert f"needs the Python package {missing.partition('.')[0]!r}" in line
    assert install in line and "internal error" not in line


def test_a_missing_module_of_the_bench_itself_is_a_bug(capsys, monkeypatch):
    monkeypatch.delenv(TRACEBACK_VARIABLE, raising=False)
    error = ModuleNotFoundError(
        "No module named 'rl_trainer_bench.gone'", name="rl_trainer_bench.gone"
    )
    assert run_guarded("cmd", _raise(error)) == EXIT_BUG
    assert "internal error, a bug in rl_trainer_bench" in capsys.readouterr().err
