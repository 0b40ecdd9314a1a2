"""How a knob's text becomes a value: the grammars every entry point shares.

The renderer, the driver, the CLI flags and the engine keys all read numbers, switches, choices,
shell words and step windows through these functions, so a value one of them accepts means the
same thing to all of them. Numbers are ASCII only: Python's `int()` reads `٣` as 3, which would let
a value look different in a manifest than in the run; each parser raises `ConfigError` with one
line naming the knob, the value and the accepted form.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from rl_trainer_bench.errors import ConfigError

WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+", re.ASCII)
REAL_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_SWITCH = {"on": True, "off": False, "1": True, "0": False}
_STEP_WINDOW = re.compile(r"([0-9]+)(?:\s*[:-]\s*([0-9]+))?", re.ASCII)
STEP_WINDOW_FORMS = "N, A:B or A-B (one inclusive window of step indices)"
_SAFE_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+\Z")
# The words a boolean engine key or trainer flag takes, any case, as the trainer's own flags read
# them (argparse's usual str2bool: `--prefuse_moe_weights=yes` runs there, so it must here).
_BOOLEAN_WORDS = {
    **dict.fromkeys(("true", "t", "yes", "y", "1"), True),
    **dict.fromkeys(("false", "f", "no", "n", "0"), False),
}
# Longer digit strings are not numbers anyone means, and int() refuses past 4,300 digits with a
# ValueError of its own: refused here first, as the knob's one line.
MAX_DIGITS = 100


def whole_number(
    name: str, text: str, minimum: int | None = None, maximum: int | None = None
) -> int:
    """An integer written in ASCII digits, within [`minimum`, `maximum`] where they are given."""
    stripped = text.strip()
    if not WHOLE_NUMBER.fullmatch(stripped) or len(stripped) > MAX_DIGITS:
        raise ConfigError(f"{name}={text!r} is not an integer: write ASCII digits, e.g. {name}=4")
    value = int(stripped)
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name}={value} is too small: use an integer >= {minimum}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name}={value} is too large: use an integer <= {maximum:,}")
    return value


def switch(name: str, text: str) -> bool:
    """`on` or `off` (any case), or `1` or `0`: the one grammar of every on/off knob and flag."""
    value = _SWITCH.get(text.strip().lower())
    if value is None:
        raise ConfigError(f"{name}={text!r} is not allowed: use on or off (or 1 or 0)")
    return value


def boolean_word(text: str) -> bool | None:
    """The boolean `text` names (`_BOOLEAN_WORDS`), None for any other text."""
    return _BOOLEAN_WORDS.get(text.strip().lower())


def choice(name: str, text: str, choices: Sequence[str]) -> str:
    """One of `choices`, exactly."""
    value = text.strip()
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not allowed: use one of {', '.join(choices)}")
    return value


def shell_words(name: str, text: str) -> tuple[str, ...]:
    """Shell words, quoted as a POSIX shell would read them."""
    try:
        return tuple(shlex.split(text))
    except ValueError as error:
        raise ConfigError(
            f"{name}={text!r} does not parse as shell words ({error}); fix its quoting"
        ) from None


def shell_writable(name: str, text: str) -> str:
    """`text`, refused with ConfigError naming `name` when it holds a NUL byte.

    The kernel reads each argument and environment string of a process up to its first NUL
    (execve), so no quoting writes one into the pod's `bash -c` script or its environment: the
    pod would not start, or would get a shortened value. Refused here, at the knob, instead.
    """
    position = text.find("\0")
    if position >= 0:
        excerpt = text[max(0, position - 20) : position + 21]
        raise ConfigError(
            f"{name}: a NUL byte at character {position} ({excerpt!r}) cannot be carried by a"
            " command argument or an environment variable: remove it"
        )
    return text


def shell_quote(word: str) -> str:
    """`word` as one word that bash and `shell_words` both read back literally (a word without a
    NUL byte: `shell_writable` refuses those).

    Like `shlex.quote`, but a word holding single quotes is double-quoted with `\\` and `"`
    escaped, which reads far better than shlex's `'"'"'` chains in a manifest someone reviews;
    a word that also holds `$` or a backquote keeps shlex's form, since inside double quotes bash
    would expand those unless escaped and `shlex` keeps the escaping backslash.
    """
    if word and _SAFE_WORD.match(word):
        return word
    if "'" not in word:
        return f"'{word}'"
    if "$" in word or "`" in word:
        return shlex.quote(word)
    return '"' + re.sub(r'([\\"])', r"\\\1", word) + '"'


def shell_join(words: Sequence[str]) -> str:
    """The inverse of `shell_words`: shell_words(name, shell_join(w)) == tuple(w)."""
    return " ".join(shell_quote(word) for word in words)


def format_switch(value: bool) -> str:
    """The inverse of `switch`."""
    return "on" if value else "off"


def format_step_window(window: tuple[int, int]) -> str:
    """The inverse of `step_window`: `A:B`."""
    return "{}:{}".format(*window)


def step_window(name: str, text: str) -> tuple[int, int]:
    """One inclusive window of step indices: `N` (one step), `A:B` or `A-B` (A through B).

    The profiler traces one contiguous window, so a list of windows is refused rather than
    silently narrowed; a reversed window is named as reversed.
    """
    match = _STEP_WINDOW.fullmatch(text.strip())
    if match is None:
        raise ConfigError(f"{name}={text!r} is not a step window: write {STEP_WINDOW_FORMS}")
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else first
    if last < first:
        raise ConfigError(
            f"{name}={text!r} is reversed: write the first step first ({last}:{first})"
        )
    return first, last
