"""MaxText's config, built and validated by MaxText itself, with no device and no engine.

The adapter builds its engine from this config; the plan builds the same config before launch
(`bench/maxtext_check.py`), so a key the trainer's image's MaxText refuses is one line before any
compile. MaxText is imported inside the functions, never when this module is, so a host without
MaxText can import the module (and the plan can say that the check runs in the pod).
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import importlib.util
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml

# How the adapter prefixes MaxText's message when it refuses a config (`refusal` takes it off).
REFUSED_PREFIX = "MaxText refused the config built for this cell: "
_MESSAGE = 160  # characters of MaxText's message kept (its unknown-key message lists every key)


class MaxTextRefused(ValueError):
    """MaxText's own validation refused the words; the message is MaxText's, on one line."""


def importable() -> bool:
    """Whether this environment has the maxtext package (found without importing it)."""
    return importlib.util.find_spec("maxtext") is not None


def installed_version() -> str:
    """The installed maxtext distribution's version (read from its metadata, no import)."""
    return importlib.metadata.version("maxtext")


def shipped_model_config(name: str) -> Mapping[str, Any]:
    """MaxText's model config `name` as shipped in the package ({} for `default`: base.yml's)."""
    if name == "default":
        return {}
    shipped = importlib.resources.files("maxtext.configs") / "models" / f"{name}.yml"
    return yaml.safe_load(shipped.read_text()) or {}


def build_config(words: Sequence[str]) -> Any:
    """MaxText's config from `key=value` words, as its command line (and Tunix) builds it.

    Through MaxText's private `_initialize_pydantic`: the public `initialize` reports a key it
    refuses as a banner of log lines and exits the process; here the refusal is MaxTextRefused.
    """
    from maxtext.configs import pyconfig  # optional: in MaxText's own environment alone

    try:
        return pyconfig.HyperParameters(pyconfig._initialize_pydantic(["", *words]))
    except (ValueError, TypeError) as error:
        raise MaxTextRefused(" ".join(str(error).split())) from error


def refusal(
    build: Callable[[Sequence[str]], Any], refused: type[Exception], words: Sequence[str]
) -> str | None:
    """MaxText's message for `words` on one line, cut short (None when `build` takes them)."""
    try:
        build(words)
    except refused as error:
        message = " ".join(str(error).split()).removeprefix(REFUSED_PREFIX)
        message = re.sub(r"\s*\[type=.*", "", message)
        return message if len(message) <= _MESSAGE else message[:_MESSAGE] + "..."
    return None


def refused_trainer_keys(
    build: Callable[[Sequence[str]], Any],
    refused: type[Exception],
    words: Sequence[str],
    trainer: Sequence[str],
) -> tuple[dict[str, str], str | None]:
    """{trainer word: MaxText's words for it} for each of the trainer's keys MaxText refuses, and
    its message for what is left (None once the rest builds).

    MaxText stops at the first key it does not know and names it, so a key it names is dropped
    and the config built again, until it builds or names no key of the trainer's; a refusal that
    names none (a rule two keys break together) is put on the trainer's keys whose removal alone
    lets the config build. None such: the bench's own keys are refused (the caller says so).
    """
    keys = {word.partition("=")[0]: word for word in trainer}
    found: dict[str, str] = {}
    remaining = list(words)
    message = refusal(build, refused, remaining)
    while message is not None:
        named = [key for key in keys if f"'{key}'" in message and keys[key] in remaining]
        if not named:
            break
        unknown = message.startswith(f"'{named[0]}' not in ")  # MaxText's list of every key
        found[keys[named[0]]] = "not a key of it" if unknown else message
        remaining.remove(keys[named[0]])
        message = refusal(build, refused, remaining)
    if message is not None:
        alone = [
            w
            for w in trainer
            if w in remaining and refusal(build, refused, [x for x in remaining if x != w]) is None
        ]
        found |= dict.fromkeys(alone, message)
        message = None if alone else message
    return found, message
