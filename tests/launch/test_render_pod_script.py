"""The rendered client script, run for real: bash syntax, literal values, the embedded code, SIGTERM."""

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from render_helpers import client_command, client_script, render_fixture

from rl_trainer_bench.code_digest import code_sha256

ADVERSARIAL = {
    "SPACES": "a  b\tc",
    "QUOTES": """it's "quoted" \\ back""",
    "SUBSTITUTION": "$(touch /tmp/rl_bench_pwned)",
    "BACKTICKS": "`touch /tmp/rl_bench_pwned`",
    "VARIABLE": "${HOME} $PATH",
    "NEWLINE": "line1\nline2",
}


def _driver_env() -> str:
    from rl_trainer_bench.config.values import shell_join

    return shell_join([f"{key}={value}" for key, value in ADVERSARIAL.items()])


def _stub_python(folder: Path, body: str) -> dict[str, str]:
    """A `python` that runs `body` as the driver; `python -c` (the script's unpacking of the
    embedded code) goes to the real interpreter."""
    stub = folder / "python"
    stub.write_text(
        f'#!/bin/bash\nif [ "$1" = -c ]; then exec {shlex.quote(sys.executable)} "$@"; fi\n{body}\n'
    )
    stub.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}


def _environment_dump(output: str) -> dict[str, str]:
    entries = output.split("\0")
    return dict(entry.split("=", 1) for entry in entries if "=" in entry)


def test_rendered_script_passes_bash_syntax_check():
    script = client_script(render_fixture(driver_env=_driver_env(), steps="2"))
    subprocess.run(["bash", "-n", "-c", script], check=True)


def test_every_argument_of_the_client_command_fits_the_kernels_limits():
    """The kernel refuses any single exec argument over 128 KiB (MAX_ARG_STRLEN) and all of them
    with the environment over ARG_MAX (2 MiB at the default stack limit): a command past either
    would never start in the pod. The code needs more than one argument, so it is cut into parts."""
    command = client_command(render_fixture(driver_env=_driver_env(), steps="2"))
    sizes = [len(word.encode()) + 1 for word in command]
    assert max(sizes) < 128 * 1024
    assert sum(sizes) < 1024 * 1024


def test_stub_python_receives_driver_env_literally_and_the_rendered_code(tmp_path):
    bench = render_fixture(driver_env=_driver_env(), steps="2", engine_flags="a=1")
    env = _stub_python(tmp_path, f'env -0 > {tmp_path}/env.dump; echo "$@" > {tmp_path}/argv')
    result = subprocess.run(
        client_command(bench), env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "EXIT_CODE=0" in result.stdout
    seen = _environment_dump((tmp_path / "env.dump").read_text())
    for key, value in ADVERSARIAL.items():
        assert seen[key] == value
    assert not Path("/tmp/rl_bench_pwned").exists()
    assert (seen["STEPS"], seen["ENGINE_FLAGS"]) == ("2", "a=1")
    code_dir = Path(seen["BENCH_CODE_DIR"])
    try:
        assert seen["PYTHONPATH"].split(":")[0] == str(code_dir)
        assert code_sha256(code_dir) == seen["BENCH_CODE_SHA256"] == code_sha256()
        assert (
            seen["BENCH_CODE_SHA256"]
            == bench["metadata"]["annotations"]["rl-trainer-bench/code-sha256"]
        )
    finally:
        subprocess.run(["rm", "-rf", str(code_dir)], check=True)


def test_wrapper_forwards_sigterm_and_returns_the_driver_exit_code(tmp_path):
    body = (
        f"trap 'echo got-term > {tmp_path}/term; exit 7' TERM\n"
        f"echo $$ > {tmp_path}/pid\n"
        f'echo "$BENCH_CODE_DIR" > {tmp_path}/ready\n'
        "while true; do sleep 0.1; done"
    )
    env = _stub_python(tmp_path, body)
    process = subprocess.Popen(
        client_command(render_fixture()), env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists():
            assert time.monotonic() < deadline, "the stub driver never started"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    finally:
        process.kill()
        if (tmp_path / "pid").exists():  # the stub outlives bash when SIGTERM is not forwarded
            with contextlib.suppress(ProcessLookupError):
                os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
        subprocess.run(["rm", "-rf", (tmp_path / "ready").read_text().strip()], check=False)
    assert (tmp_path / "term").read_text().strip() == "got-term"
    assert process.returncode == 7
    assert "EXIT_CODE=7" in output


def test_libtpu_flag_values_stay_literal_in_the_script():
    script = client_script(render_fixture(libtpu_flags="--x='$(id)'"))
    subprocess.run(["bash", "-n", "-c", script], check=True)
    assert "--x=$(id)" in script.replace("\\$", "$")
