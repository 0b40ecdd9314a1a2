"""The client container's command: read the trainer's env prefix and argv out of its bash script.

Launchers start the trainer from a PID-1 wrapper script (`bash -c '...'`) in which one line runs
`NAME=value ... python -m module --flag ...`. The renderer needs that line's environment (so the
bench runs under the same `LIBTPU_INIT_ARGS`) and its flags (so the bench builds the same engine),
and the config diff needs the flags of a launched or rendered JobSet. This module is a small,
quote-aware reader of such scripts: it splits the script into simple commands the way bash does
(quotes, `$(...)`, backticks, comments and here-documents are respected), then reads words with
`shlex`. It never runs anything.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence

from rl_trainer_bench.config.trainer_maxtext import CARRYING_VARIABLES
from rl_trainer_bench.config.values import shell_join
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch.dry_run import client_container

_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_INTERPRETER = re.compile(r"^(?:.*/)?python[0-9.]*\Z")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
_COMMAND_SEPARATORS = ";&|()"
_REDIRECTION = re.compile(r"^(?:\d*(?:>>?|<)|&>>?)(?:&\d+|&-)?\S*\Z")
_KEYWORDS = frozenset({"then", "do", "else", "{", "!", "time", "exec"})


@dataclasses.dataclass(frozen=True)
class ClientCommand:
    """What the client script runs: exported and prefix environment, the interpreter, its flags."""

    env: dict[str, str]  # `export K=V` lines, then the python line's `K=V` prefix (later wins)
    program: list[str]  # ["python", "-m", "module"] or ["python", "script.py"]
    argv: list[str]  # the program's own arguments (its flags)


def script_of(command: Sequence[str]) -> str:
    """The shell script inside a container's `command` + `args` (`bash -c SCRIPT` or `sh -c`)."""
    words = list(command)
    for index, word in enumerate(words[:-1]):
        if word.startswith("-") and "c" in word.lstrip("-") and not word.startswith("--"):
            return words[index + 1]
    return shlex.join(words)


def read_client_command(command: Sequence[str] | str) -> ClientCommand:
    """Find the first python invocation that runs a program (a script or `-m` module) in a client
    command; UserError when there is none. A `python -c` snippet is not the trainer (a bench's
    script unpacks its code with one before it runs its driver) and is passed over."""
    script = command if isinstance(command, str) else script_of(command)
    exported: dict[str, str] = {}
    for words in simple_commands(script):
        if words[:1] == ["export"]:
            exported.update(_assignments(words[1:]))
            continue
        while words and words[0] in _KEYWORDS:
            words = words[1:]
        prefix, rest = _split_prefix(_without_redirections(words))
        if rest and _INTERPRETER.match(rest[0]) and rest[1:2] != ["-c"]:
            program_length = 3 if rest[1:2] == ["-m"] else 2
            return ClientCommand(
                env={**exported, **prefix},
                program=rest[:program_length],
                argv=rest[program_length:],
            )
    raise UserError("the client container's command runs no python program: nothing to bench")


def trainer_command_words(launch: ClientCommand) -> list[str]:
    """The trainer's command as the bench reads it: the `NAME=value` words of its environment
    (exported or before python) that carry MaxText keys, then its flags.

    Tunix reads `MAXTEXT_EXTRA_FLAGS` and a few other variables from the trainer's environment
    and applies them to MaxText's config; so they travel with the flags, in TRAINER_ARGV, and
    every tool that reads a trainer argv sees the keys the trainer runs with.
    """
    carried = [f"{name}={launch.env[name]}" for name in CARRYING_VARIABLES if name in launch.env]
    return [*carried, *launch.argv]


def client_argv(jobset: Mapping) -> str:
    """The trainer command of a launched or rendered JobSet, as one shell-quoted string.

    A bench JobSet carries it in its `TRAINER_ARGV` export; a launched trainer on its python line
    (its flags, after the variables that carry MaxText keys: `trainer_command_words`).
    """
    container = client_container(jobset)
    parsed = read_client_command([*container.get("command", []), *container.get("args", [])])
    if "TRAINER_ARGV" in parsed.env:
        return parsed.env["TRAINER_ARGV"]
    return shell_join(trainer_command_words(parsed))


def merge_flags(existing: str, overrides: str, knob: str) -> str:
    """`--flag[=value]` words of `existing` with `overrides` applied: same flag replaced in place, new
    ones appended. Used for LIBTPU_INIT_ARGS and XLA_FLAGS, where the last occurrence would win
    anyway but a duplicate hides which value the run used.
    """
    merged: dict[str, str] = {}
    for word in shlex.split(existing):
        merged[word.split("=", 1)[0]] = word
    for word in _split_knob(overrides, knob):
        if not re.match(r"^--?[A-Za-z0-9_][A-Za-z0-9_.-]*(=.*)?$", word, re.DOTALL):
            raise UserError(f"{knob}: {word!r} is not a --flag or --flag=value; fix the value")
        merged[word.split("=", 1)[0]] = word
    return " ".join(merged.values())


def _split_knob(text: str, knob: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as error:
        raise UserError(f"{knob}: {text!r} is not a list of shell words ({error})") from None


def _is_redirection(line: str, position: int) -> bool:
    """`&` in `2>&1`, `>&2` or `&>file` belongs to a redirection, not a command separator."""
    return line[position] == "&" and (
        line[position - 1 : position] in (">", "<") or line[position + 1 : position + 2] == ">"
    )


def _without_redirections(words: list[str]) -> list[str]:
    """Drop redirection words (`2>&1`, `> log`, `>>log`) that bash would not pass to the program."""
    kept: list[str] = []
    skip_next = False
    for word in words:
        if skip_next:
            skip_next = False
        elif _REDIRECTION.match(word):
            skip_next = re.fullmatch(r"\d*(?:>>?|<)|&>>?", word) is not None
        else:
            kept.append(word)
    return kept


def _assignments(words: Sequence[str]) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in map(_ASSIGNMENT.match, words) if m}


def _split_prefix(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """Leading `NAME=value` words (the command's own environment) and the words after them."""
    index = 0
    while index < len(words) and _ASSIGNMENT.match(words[index]):
        index += 1
    return _assignments(words[:index]), words[index:]


def simple_commands(script: str) -> Iterator[list[str]]:
    """The words of each simple command of a bash script, in order; unparsable pieces are skipped."""
    for text in _command_texts(script):
        try:
            words = shlex.split(text, comments=False)
        except ValueError:
            continue
        if words:
            yield words


@dataclasses.dataclass
class _ScriptScan:
    """Where a script's split stands at a line's end: quotes, `$(...)` and heredocs span lines."""

    current: list[str] = dataclasses.field(default_factory=list)  # the command read so far
    quote: str = ""  # "'", '"' or "" while scanning across lines
    depth: int = 0  # nesting of $( ... ) and backticks
    heredocs: list[str] = dataclasses.field(default_factory=list)  # delimiters opened on the line

    def take(self) -> str:
        """The command read so far, and a fresh start for the next one."""
        text = "".join(self.current)
        self.current = []
        return text


def _command_texts(script: str) -> Iterator[str]:
    """Split at unquoted newlines and `; & | ( )`, skipping comments and here-document bodies."""
    scan = _ScriptScan()
    lines = script.split("\n")
    line_index = 0
    while line_index < len(lines):
        line = lines[line_index]
        line_index += 1
        yield from _split_line(line, scan)
        if scan.current and scan.current[-1] == "\\" and scan.quote != "'":
            scan.current.pop()  # a backslash-newline joins the next line
            continue
        if scan.quote or scan.depth:
            scan.current.append("\n")
            continue
        yield scan.take()
        line_index = _past_heredoc_bodies(lines, line_index, scan.heredocs)
        scan.heredocs = []
    if scan.current:
        yield scan.take()


def _split_line(line: str, scan: _ScriptScan) -> Iterator[str]:
    """The commands one line ends, left of a comment; what stays open is carried in `scan`."""
    position = 0
    while position < len(line):
        char = line[position]
        if scan.quote == "'":
            scan.current.append(char)
            scan.quote = "" if char == "'" else scan.quote
        elif char == "\\" and scan.quote != "'":
            scan.current.append(line[position : position + 2])
            position += 1
        elif scan.quote == '"':
            scan.current.append(char)
            if char == '"' and scan.depth == 0:
                scan.quote = ""
            elif line.startswith("$(", position):
                scan.depth += 1
            elif char == ")" and scan.depth:
                scan.depth -= 1
        elif char in "'\"":
            scan.quote = char
            scan.current.append(char)
        elif line.startswith("$(", position) or char == "`":
            scan.depth += 1 if char != "`" or scan.depth == 0 else -1
            scan.current.append(char)
        elif scan.depth:
            scan.depth -= 1 if char == ")" else 0
            scan.current.append(char)
        elif char == "#" and (not scan.current or scan.current[-1] in " \t"):
            return
        elif char in _COMMAND_SEPARATORS and not _is_redirection(line, position):
            yield scan.take()
        else:
            if line.startswith("<<", position):
                match = _HEREDOC.match(line, position)
                if match:
                    scan.heredocs.append(match.group(2))
            scan.current.append(char)
        position += 1


def _past_heredoc_bodies(lines: list[str], line_index: int, delimiters: list[str]) -> int:
    """The index of the first line after the bodies of the here-documents a line opened."""
    for delimiter in delimiters:
        while line_index < len(lines) and lines[line_index].strip() != delimiter:
            line_index += 1
        line_index += 1
    return line_index
