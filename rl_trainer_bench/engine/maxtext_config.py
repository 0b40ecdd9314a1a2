"""MaxText's config, built and validated by MaxText itself, with no device and no engine.

The adapter builds its engine from this config; the plan builds the same config before launch
(`bench/maxtext_check.py`), so a key the trainer's image's MaxText refuses is one line before any
compile. MaxText is imported inside the functions, never when this module is, so a host without
MaxText can import the module (and the plan can say that the check runs in the pod).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Mapping, Sequence
from typing import Any


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
    import importlib.resources

    import yaml

    if name == "default":
        return {}
    shipped = importlib.resources.files("maxtext.configs") / "models" / f"{name}.yml"
    return yaml.safe_load(shipped.read_text()) or {}


def build_config(words: Sequence[str]) -> Any:
    """MaxText's config from `key=value` words, as its command line (and Tunix) builds it.

    Through MaxText's private `_initialize_pydantic`: the public `initialize` reports a key it
    refuses as a banner of log lines and exits the process; here the refusal is MaxTextRefused.
    """
    from maxtext.configs import pyconfig

    try:
        return pyconfig.HyperParameters(pyconfig._initialize_pydantic(["", *words]))
    except (ValueError, TypeError) as error:
        raise MaxTextRefused(" ".join(str(error).split())) from error
