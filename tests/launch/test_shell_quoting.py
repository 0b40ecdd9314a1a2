"""Every value the bench writes into shell text reads back as written, judged by bash itself.

The functions that write a value into shell text, and how each is judged here:

- `config/values.shell_quote(word)`: one word. Every other site goes through it.
  `test_shell_quote_reads_back_in_bash_and_in_shell_words`.
- `config/values.shell_join(words)`: a command line of words (the TRAINER_ARGV and ORCH_ARGV
  knobs' formatter; `launch/client_command.client_argv`, the trainer command `config-diff`
  reads). `test_shell_join_reads_back_as_its_words_in_bash`.
- `launch/pod_script.bench_script`: the bench pod's `bash -c` script, which writes every value of
  the pod's environment as `export NAME=VALUE` and the trainer's interpreter (a path) twice; the
  AOT job's script (`launch/aot_job._container`) is the same function with `entry_module`.
  `test_the_pod_script_gives_the_driver_every_value_as_written`, run through the script itself.
- `launch/render.render` with `--aot-job`: both rendered client commands, run as the pods run
  them with every special character and construct (alone, after a `'`, and the mixtures) as
  DRIVER_ENV's values and in the TRAINER_ARGV knob's words (shell_join inside the export).
  `test_rendered_pods_receive_every_value_as_written`.
- `ab/memory.aot_ab_command`: the `aot --ab-arms ARMS` command the A/B's memory line names (arms
  hold any text an engine key's value may). `test_the_ab_compile_command_reads_back_in_bash`.

Sites that write shell text but no free value, left out: the script's variable names (a knob's,
or identifiers DRIVER_ENV's and the trainer script's readers accepted), the trainer JobSet's name
in the script's first comment (the JobSet schema makes it a DNS name), `bench/plan.py`'s `aot
--preset NAME --target SLICE` (a preset's and a slice's names, from the tables). Sites that
quote with `shlex.join` for `shlex` or a reader rather than for bash: the start-of-run config line
(`config/knobs._shown`), the libtpu-flags annotation and plan line (`launch/render.py`), and
`launch/client_command.script_of` (a container's command read as a script, never run). Flag
lists joined with spaces for libtpu's and XLA's own readers (`client_command.merge_flags`) reach
the script as one value, through `shell_quote`. The shell scripts `render_bench.sh` and
`aot_bench.sh` pass values as array elements, never re-read.

A value holding a NUL byte cannot be written into a script or an environment at all (execve ends
each string at one): it is refused in one line naming its knob or variable, before any output
(`shell_writable`; the last tests).

Values are drawn from an alphabet weighted to what a shell treats specially, whole substitutions
among them, so a word that mixes `'` with `$`, `$(` or a backquote is common, not rare (each
property also carries such words as explicit examples). Each example's values go to one bash
process: the cost is the processes, not the values.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fuzz_support import EXAMPLES
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from render_helpers import FIXTURE, load_manifest

from rl_trainer_bench import cli
from rl_trainer_bench.ab.memory import aot_ab_command
from rl_trainer_bench.config.values import shell_join, shell_quote, shell_words
from rl_trainer_bench.launch import aot_job
from rl_trainer_bench.launch.client_command import read_client_command, trainer_command_words
from rl_trainer_bench.launch.dry_run import client_container, read_documents
from rl_trainer_bench.launch.knobs import RENDER_KNOBS
from rl_trainer_bench.launch.pod_script import AB_ARMS, SCRIPT_NAME, bench_script
from rl_trainer_bench.launch.render import command_words

# What bash treats specially anywhere in a word, one character each.
SHELL_SPECIAL = [*"'\"$`\\!*?[]{}();&|<>#~=%^", " ", "\t", "\n", "\r"]
# Whole constructs a quoting slip would run or expand.
CONSTRUCTS = [
    "$(",
    "$(id)",
    "$((1+1))",
    "${HOME}",
    "$HOME",
    "$'",
    "$1",
    "$@",
    "`",
    "`id`",
    "'",
    "'\\''",
    '"',
    "\\'",
    '\\"',
    "\\$",
    "\\\n",
    "<<",
    "&&",
    "!!",
    "~/",
    "*",
    "-",
]
PLAIN = [*"aZ09_./,:@+-", "é", "中", "😀", "\u00a0", "\u2028", "\x01", "\x7f"]
TOKEN = st.one_of(
    st.sampled_from(SHELL_SPECIAL),
    st.sampled_from(CONSTRUCTS),
    st.sampled_from(PLAIN),
    st.characters(exclude_characters="\0", exclude_categories=("Cs",)),
)
TEXT = st.lists(TOKEN, max_size=6).map("".join)
QUOTES = st.sampled_from(["'", '"', "'\\''", "\\'", '\\"'])
EXPANSIONS = st.sampled_from(["$", "$(", "$(id)", "${HOME}", "$'", "$((1+1))", "`", "`id`", "\\$"])
# A word that mixes a quote with an expansion, in either order, amid drawn text: the words a
# quoting rule for one of them alone gets wrong.
MIXED = st.tuples(TEXT, QUOTES, EXPANSIONS, TEXT).flatmap(st.permutations).map("".join)
# A word of characters `shell_quote` leaves bare but for one special token at either end: the
# edge of the bare words, where a line break or a blank that a pattern lets through (`$` also
# matches before a final line break) splits the word.
NEAR_SAFE = st.builds(
    lambda safe, special, first: special + safe if first else safe + special,
    st.text(st.sampled_from("aZ09_@%+=:,./-"), min_size=1, max_size=8),
    st.one_of(st.sampled_from(["\n", " ", "\t"]), st.sampled_from(SHELL_SPECIAL + CONSTRUCTS)),
    st.booleans(),
)
# A word: drawn tokens, a mixture or a near-bare word, sometimes after a leading dash (an option
# to whatever reads it); the empty word is the shortest draw.
WORD = st.builds(
    lambda dash, text: ("-" if dash else "") + text,
    st.booleans(),
    st.one_of(st.lists(TOKEN, max_size=12).map("".join), MIXED, NEAR_SAFE),
)
MIXTURES = [
    "it's $(echo pwned)",
    "it's $HOME",
    "it's `id`",
    "'$'",
    "$'\\''",
    "a'b\"c$(d)`e`\\f",
    "",
    "-",
    "--x='$(id)'",
    "~",
    "a\nb'$c",
    "word\n",
]
# The properties draw more examples than the fuzz tests' default: each example is one bash run.
QUOTING = settings(
    max_examples=max(EXAMPLES, 60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """An empty folder for the shells to run in, and a `sleep` that waits 10 ms: the pod script's
    wrapper polls its child every `sleep 1`, which would make each run last a second."""
    folder = tmp_path_factory.mktemp("quoting")
    (folder / "bin").mkdir()
    short_sleep = folder / "bin" / "sleep"
    short_sleep.write_text(f"#!/bin/sh\nexec {shlex.quote(shutil.which('sleep'))} 0.01\n")
    short_sleep.chmod(0o755)
    (folder / "tmp").mkdir()
    (folder / "cwd").mkdir()
    return folder


def _bash_words(command_lines: list[str], cwd: Path) -> list[list[str]]:
    """The words bash reads from each command line's text, as arguments of `set --`: no command
    runs unless the quoting lets one run."""
    script = "".join(f'set -- {line}\nprintf \'%s\\0\' "$#" "$@"\n' for line in command_lines)
    result = subprocess.run(["bash", "-c", script], capture_output=True, cwd=cwd, timeout=60)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    fields = result.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]
    commands = []
    while fields:
        count = int(fields[0])
        commands.append(fields[1 : 1 + count])
        fields = fields[1 + count :]
    return commands


@QUOTING
@given(st.lists(WORD, min_size=4, max_size=24))
@example(MIXTURES)
def test_shell_quote_reads_back_in_bash_and_in_shell_words(scratch, words):
    quoted = [shell_quote(word) for word in words]
    assert _bash_words(quoted, scratch / "cwd") == [[word] for word in words]
    assert [shell_words("WORD", text) for text in quoted] == [(word,) for word in words]


@QUOTING
@given(st.lists(st.lists(WORD, max_size=6), min_size=2, max_size=8))
@example([MIXTURES, [], [""], ["--trainer_flag=it's $(id)", "NAME=`id`'$x'"]])
def test_shell_join_reads_back_as_its_words_in_bash(scratch, commands):
    lines = [shell_join(words) for words in commands]
    assert _bash_words(lines, scratch / "cwd") == commands
    assert [list(shell_words("ARGV", line)) for line in lines] == commands


@QUOTING
@given(st.lists(WORD, min_size=4, max_size=16))
@example(MIXTURES)
def test_the_ab_compile_command_reads_back_in_bash(scratch, arms):
    lines = [aot_ab_command("cpu-tiny", "v5p:2x2x2", text) for text in arms]
    command = ["rl-trainer-bench", "aot", "--preset", "cpu-tiny", "--target", "v5p:2x2x2"]
    expected = [[*command, "--ab-arms", text] for text in arms]
    assert _bash_words(lines, scratch / "cwd") == expected


# How the pod script runs its program: the bench driver as a script or a module, the same-pod
# A/B, the AOT job's entry.
SCRIPT_KINDS = {
    "driver script": {"has_driver_script": True},
    "driver module": {"has_driver_script": False},
    "same-pod A/B": {"has_driver_script": False, "ab": True},
    "AOT job": {"has_driver_script": False, "entry_module": aot_job.ENTRY_MODULE},
}
# The trainer's interpreter in the pod test: `python -c` (the unpacking) swallows the code it is
# given; as the driver it writes its environment to $QUOTING_DUMP.
ENV_DUMPING_INTERPRETER = """#!/bin/bash
if [ "$1" = -c ]; then cat > /dev/null; exit 0; fi
env -0 > "$QUOTING_DUMP"
"""


def _interpreter_at(scratch: Path, folder_word: str) -> Path:
    """A `python` that dumps its environment, in a folder named after a drawn word (a path
    holds any byte but `/` and NUL; `.` and `..` are not new folders, so every name gets a prefix; at most 255 bytes)."""
    name = ("d" + folder_word.replace("/", "|")).encode()[:200].decode(errors="ignore")
    folder = scratch / "interpreters" / name
    folder.mkdir(parents=True, exist_ok=True)
    interpreter = folder / "python"
    interpreter.write_text(ENV_DUMPING_INTERPRETER)
    interpreter.chmod(0o755)
    return interpreter


def _dumped_environment(dump: bytes) -> dict[str, str]:
    entries = dump.decode("utf-8", "surrogateescape").split("\0")
    return dict(entry.split("=", 1) for entry in entries if "=" in entry)


@QUOTING
@given(
    st.lists(WORD, min_size=4, max_size=12),
    WORD,
    st.sampled_from(sorted(SCRIPT_KINDS)),
)
@example(MIXTURES, "it's $(id) `id`", "AOT job")
@example(MIXTURES, "a b", "same-pod A/B")
def test_the_pod_script_gives_the_driver_every_value_as_written(scratch, values, folder_word, kind):
    options = dict(SCRIPT_KINDS[kind])
    environment = {f"QUOTED_{index}": value for index, value in enumerate(values)}
    if options.pop("ab", False):
        environment[AB_ARMS] = values[0]
    interpreter = _interpreter_at(scratch, folder_word)
    script = bench_script(
        interpreter=str(interpreter),
        environment=environment,
        trainer_jobset="quoting",
        **options,
    )
    dump = scratch / "dump"
    dump.unlink(missing_ok=True)
    result = subprocess.run(
        ["bash", "-c", script, SCRIPT_NAME],
        env={
            "PATH": f"{scratch / 'bin'}:{os.environ['PATH']}",
            "TMPDIR": str(scratch / "tmp"),
            "QUOTING_DUMP": str(dump),
        },
        cwd=scratch / "cwd",
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    seen = _dumped_environment(dump.read_bytes())
    assert {name: seen.get(name) for name in environment} == environment
    # `plan BENCH.yaml` reads the pod's environment out of the same script without bash; it
    # finds the interpreter as the renderer found it in the trainer's script, in a path without
    # a line break (`client_command._INTERPRETER`).
    if "\n" in folder_word:
        return
    assert {
        name: value
        for name, value in read_client_command(script).env.items()
        if name in environment
    } == environment


def _fixture_documents() -> list[dict]:
    return read_documents(FIXTURE.read_text(), FIXTURE.name)


# Every special character and construct alone and after a single quote, and the mixtures: the
# values one render carries into both pods (a render takes seconds; the properties above draw).
RENDERED_VALUES = [*MIXTURES, *SHELL_SPECIAL, *CONSTRUCTS, *(f"it's {c}" for c in CONSTRUCTS)]


@pytest.fixture(scope="module")
def rendered(scratch) -> dict[str, Path]:
    """The bench and its AOT job, rendered by the CLI with RENDERED_VALUES as DRIVER_ENV's values
    and as the values of flags added to the trainer's command (the TRAINER_ARGV knob)."""
    folder = scratch / "rendered"
    folder.mkdir()
    manifests = {"bench": folder / "bench.yaml", "AOT job": folder / "aot.yaml"}
    code = cli.main(
        [
            "render",
            f"--launch-render={FIXTURE}",
            f"--output={manifests['bench']}",
            f"--aot-job={manifests['AOT job']}",
            f"--driver-env={shell_join([f'{k}={v}' for k, v in RENDERED_DRIVER_ENV.items()])}",
            f"--trainer-argv={shell_join(_rendered_trainer_argv())}",
        ]
    )
    assert code == 0
    return manifests


RENDERED_DRIVER_ENV = {f"QUOTED_{index}": value for index, value in enumerate(RENDERED_VALUES)}


def _rendered_trainer_argv() -> list[str]:
    """The fixture trainer's command as the renderer passes it on, and a flag for each value."""
    (trainer,) = [d for d in _fixture_documents() if d["metadata"]["name"] == "fixture-train"]
    words = trainer_command_words(read_client_command(command_words(client_container(trainer))))
    return [*words, *(f"--quoted_{index}={value}" for index, value in enumerate(RENDERED_VALUES))]


@pytest.mark.parametrize("pod", ["bench", "AOT job"])
def test_rendered_pods_receive_every_value_as_written(rendered, scratch, pod, tmp_path):
    """The client command as the pod runs it; its `python` dumps the driver's environment, and
    `python -c` (the unpacking of the embedded code) is this interpreter."""
    env_dumper = tmp_path / "python"
    env_dumper.write_text(
        f'#!/bin/bash\nif [ "$1" = -c ]; then exec {shlex.quote(sys.executable)} "$@"; fi\n'
        f"env -0 > {shlex.quote(str(tmp_path / 'dump'))}\n"
    )
    env_dumper.chmod(0o755)
    environment = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "PATH": f"{tmp_path}:{scratch / 'bin'}:{os.environ['PATH']}",
        "TMPDIR": str(tmp_path),  # the unpacked code goes with the test's folder
    }
    command = client_container(load_manifest(rendered[pod].read_text()))["command"]
    result = subprocess.run(
        command, env=environment, cwd=tmp_path, capture_output=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    seen = _dumped_environment((tmp_path / "dump").read_bytes())
    assert {name: seen.get(name) for name in RENDERED_DRIVER_ENV} == RENDERED_DRIVER_ENV
    assert list(shell_words("TRAINER_ARGV", seen["TRAINER_ARGV"])) == _rendered_trainer_argv()


# ----------------------------------------------------------------------------------------------
# A value no shell text can hold
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("knob", [knob.env for knob in RENDER_KNOBS])
def test_a_nul_byte_in_any_render_knob_is_refused_naming_it_before_any_output(
    knob, tmp_path, capsys
):
    given = {"LAUNCH_RENDER": str(FIXTURE), "OUTPUT": str(tmp_path / "bench.yaml")}
    given[knob] = "QUOTED=a\0b" if knob == "DRIVER_ENV" else "a\0b"
    code = cli.main(["render", *(f"--{k.lower().replace('_', '-')}={v}" for k, v in given.items())])
    out, error = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert error.count("\n") == 1
    assert error.startswith(f"rl-trainer-bench render: {knob}: a NUL byte at character ")
    assert list(tmp_path.iterdir()) == []


def test_a_nul_byte_in_the_trainers_exported_value_is_refused_naming_it(tmp_path, capsys):
    documents = _fixture_documents()
    (trainer,) = [d for d in documents if d["metadata"]["name"] == "fixture-train"]
    command = client_container(trainer)["command"]
    command[2] = command[2].replace("PYTHONUNBUFFERED=1", "PYTHONUNBUFFERED=1 QUOTED=a\0b")
    launch = tmp_path / "launch.yaml"
    launch.write_text(yaml.safe_dump_all(documents))
    output = tmp_path / "bench.yaml"
    code = cli.main(["render", f"--launch-render={launch}", f"--output={output}"])
    error = capsys.readouterr().err
    assert code == 2
    assert error.count("\n") == 1
    assert error.startswith("rl-trainer-bench render: QUOTED: a NUL byte at character 1 ")
    assert not output.exists()


@pytest.mark.parametrize(
    ("where", "named"),
    [
        ("script", "JobSet fixture-train-bench's client command: "),
        ("code part", "JobSet fixture-train-bench's client command: "),
        ("container env", "JobSet fixture-train-bench's QUOTED: "),
    ],
)
def test_plan_refuses_a_manifest_holding_a_nul_byte_in_one_line(
    rendered, where, named, tmp_path, capsys
):
    """A manifest edited after rendering: its pod could not start, and `plan` says so in one line
    instead of failing to start the plan's own process."""
    bench = load_manifest(rendered["bench"].read_text())
    container = client_container(bench)
    if where == "script":
        container["command"][2] = container["command"][2].replace("export ", "export Q=\0 ", 1)
    elif where == "code part":
        container["command"][4] = "\0" + container["command"][4]
    else:
        container.setdefault("env", []).append({"name": "QUOTED", "value": "a\0b"})
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(bench))
    code = cli.main(["plan", str(path)])
    out, error = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert error.count("\n") == 1
    assert error.startswith(f"rl-trainer-bench plan: {named}a NUL byte at character ")
