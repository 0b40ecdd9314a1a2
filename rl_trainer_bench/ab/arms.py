"""A/B arms: what each arm sets, parsed once from `--arms`.

An arm is a named setting of knobs run for the same steps as every other arm. `--arms` names the
settings; the run order (`order.py`) runs each many times, in balanced blocks by default
(`off,on,on',off'` then `on#3,off#3,off#4,on#4` ...), or as written when `--arms` spells out its
own repeats. Repeats of a setting measure the noise in the same process as the effect.
Knob names follow the bench's own edges:
an UPPER_CASE key is a driver knob (the DRIVER_ENV a pod would get), a lower_case key is an engine
key (it goes into ENGINE_FLAGS), so any arm a pod can run, an A/B can run. `maxtext.KEY` is one of
the trainer's MaxText keys: it goes into ENGINE_FLAGS as such and is applied after the trainer's
own keys (config/engine_keys.py); an engine with no equivalent refuses it when the arm is planned.

Parsing is strict because an arm that slips through is found only after a slice is scheduled: an
engine key's value is one entry of ENGINE_FLAGS (`maxtext.a=b;maxtext.c=d` is two knobs run
together, not a value), an engine key the config does not have and a MaxText key the bench holds
are refused here, and a start-up-bound variable is refused wherever an arm sets it, inside its
TRAINER_ARGV's leading `NAME=value` words too (the driver reads only MaxText keys there and would
drop it silently). Whether MaxText itself takes a `maxtext.KEY` only the MaxText that runs can
say: `maxtext_keys_checked_in_pod` names those keys for the render summary.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Mapping, Sequence

from rl_trainer_bench.ab import order as run_orders
from rl_trainer_bench.chips.local_chips import usable_tpu
from rl_trainer_bench.config import knobs
from rl_trainer_bench.config.engine_keys import (
    ENGINE_KEYS,
    parse_engine_flags,
    parse_trainer_argv,
    parse_trainer_command,
)
from rl_trainer_bench.config.knobs import DRIVER_KNOBS, STAGE_KNOBS
from rl_trainer_bench.config.presets import Preset, preset
from rl_trainer_bench.config.trainer_maxtext import (
    APPLICABLE,
    FLAG_KEYS,
    FLAG_PREFIX,
    VARIABLE_KEYS,
)
from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.maxtext.keys import HELD_KEYS, known_keys
from rl_trainer_bench.errors import UserError

# Knobs the A/B itself owns: every arm must run the same steps, or the exact checks mean nothing.
RESERVED_KNOBS = {
    "STEPS": "--steps",
    "WARMUP_STEPS": "--warmup-steps",
    "PRESET": "--preset",
    "RESULTS_DIR": "--out",
}

# Read once when the process starts (libtpu and XLA parse their flags when the backend starts; JAX
# picks its platforms and runtime then): an A/B in one process cannot vary them.
STARTUP_BOUND = frozenset({"LIBTPU_INIT_ARGS", "LIBTPU_FLAGS", "XLA_FLAGS", "TRAINER_SLICE"})
STARTUP_BOUND_PREFIXES = ("JAX_", "TPU_", "MEGASCALE_")

# Settings an arm may name without defining them.
BUILTIN_ARMS: Mapping[str, Mapping[str, str]] = {
    "off": {"STAGE_BEFORE_UPDATE": "off"},
    "on": {"STAGE_BEFORE_UPDATE": "on"},
    "after": {"STAGE_AFTER_UPDATE": "on"},
}

DEFAULT_ARMS = "off,on"

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.+]*")
_DRIVER_KNOB = re.compile(r"[A-Z][A-Z0-9_]*")
_ENGINE_KEY = re.compile(r"[a-z][a-z0-9_.]*")
_MAXTEXT_KEY = re.compile(rf"{FLAG_PREFIX}\.([a-z_][a-z0-9_]*)")
# An engine key's value is one entry of ENGINE_FLAGS; a `;`, or an `=` before any quote or brace,
# in it means another knob was written into it (`maxtext.a=b;maxtext.c=d`).
_RUN_TOGETHER = re.compile(r";|^[^'\"{]*=")


@dataclasses.dataclass(frozen=True)
class ArmSpec:
    """One arm in run order: its label (`off`, then `off'` for the repeat) and its setting."""

    label: str  # unique in the run: the setting's name, primed once per earlier occurrence
    setting: str  # the setting's name; arms with one setting are repeats of each other
    driver_knobs: Mapping[str, str]  # UPPER_CASE knobs, as DRIVER_ENV would pass them
    engine_keys: Mapping[str, str]  # lower_case engine keys, appended to ENGINE_FLAGS
    occurrence: int  # 0 for the first run of this setting, 1 for its first repeat, ...

    @property
    def program_knobs(self) -> tuple[tuple[str, str], ...]:
        """The knobs that can change a compiled program: equal tuples share one Bench."""
        # The STAGE_* knobs (the knob table's `stage` field) change what a step does but no
        # compiled program: arms that differ only in them share one Bench (one compile).
        driver = tuple(sorted((k, v) for k, v in self.driver_knobs.items() if k not in STAGE_KNOBS))
        return driver + tuple(sorted(self.engine_keys.items()))

    def describe(self) -> str:
        """`KNOB=V,key=v`, the way the arm was (or could have been) written."""
        pairs = [*self.driver_knobs.items(), *self.engine_keys.items()]
        return ",".join(f"{k}={v}" for k, v in pairs) or "(defaults)"


def parse_arms(
    text: str, order: str | None = None, blocks: int | None = None, seed: int = 0
) -> list[ArmSpec]:
    """Parse `--arms` into arms in run order (`order`: see order.py; None: its default_order;
    `blocks`: the BLOCKS order's count, refused with any other order; None: its default; `seed`:
    draws the BLOCKS order's turns).

    Grammar (comma-separated tokens): `NAME` runs a built-in or earlier-defined setting;
    `NAME:KEY=V` defines a setting and runs it, and each following `KEY=V` token adds to it.
    Example: `base:ragged_buffer_factor=1.25,wide:ragged_buffer_factor=2` (blocks: base, wide,
    wide', base', wide#3, base#3, ...).
    """
    definitions: dict[str, dict[str, str]] = {name: dict(k) for name, k in BUILTIN_ARMS.items()}
    defined_here: set[str] = set()
    written: list[str] = []
    current: str | None = None
    for token in (t.strip() for t in text.split(",")):
        if not token:
            raise UserError(f"--arms {text!r}: empty arm between commas; write e.g. {DEFAULT_ARMS}")
        if ":" in token.split("=", 1)[0]:  # NAME:KEY=V (a value may hold ':', as ENGINE's does)
            name, first_knob = token.split(":", 1)
            _check_name(name, text)
            if name in defined_here or name in BUILTIN_ARMS:
                raise UserError(
                    f"--arms: setting {name!r} is defined twice; define it once and repeat its bare name"
                )
            definitions[name] = {}
            defined_here.add(name)
            current = name
            written.append(name)
            _add_knob(definitions[name], first_knob, name)
        elif "=" in token:
            if current is None:
                raise UserError(
                    f"--arms: knob {token!r} has no arm; start the arm with NAME:{token}"
                )
            _add_knob(definitions[current], token, current)
        else:
            _check_name(token, text)
            if token not in definitions:
                raise UserError(
                    f"--arms: unknown arm {token!r}: use one of {', '.join(BUILTIN_ARMS)} "
                    f"or define it as {token}:KNOB=VALUE"
                )
            current = None
            written.append(token)
    if len(set(written)) < 2:
        raise UserError(f"--arms {text!r}: an A/B needs at least two different settings")
    chosen = run_orders.default_order(written) if order is None else order
    if blocks is not None and chosen != run_orders.BLOCKS:
        raise UserError(
            f"--blocks {blocks} sets the blocks of --order {run_orders.BLOCKS}, and this run's "
            f"order is {chosen}: drop --blocks, or use --order {run_orders.BLOCKS}"
        )
    return _number(
        run_orders.run_order(written, chosen, blocks or run_orders.DEFAULT_BLOCKS, seed),
        definitions,
    )


def _check_name(name: str, text: str) -> None:
    if not _NAME.fullmatch(name):
        raise UserError(
            f"--arms {text!r}: arm name {name!r} must start with a letter and use letters, digits, _ . +"
        )


def binds_at_start_up(key: str) -> bool:
    """Whether `key` is read once, when the process starts (libtpu's and XLA's flags, the JAX
    runtime's variables), so the arms of one process cannot differ in it."""
    return key in STARTUP_BOUND or key.startswith(STARTUP_BOUND_PREFIXES)


def check_key(key: str, where: str) -> None:
    """UserError when `key` (set by `where`: an arm, or --knob) is reserved for the A/B itself,
    binds when the process starts, is neither an UPPER_CASE driver knob nor a lower_case engine
    key, or names no driver knob; engine keys are checked against the engine config once the arms
    are planned."""
    if binds_at_start_up(key) and where.startswith("--arms"):
        raise UserError(
            f"{where} sets {key}, which binds when the process starts: the arms of one process"
            " cannot differ in it; render one pod per setting (LIBTPU_FLAGS, DRIVER_ENV) and"
            " score their logs with rl-trainer-bench ab --from-logs"
        )
    if key in RESERVED_KNOBS:
        raise UserError(
            f"{where} sets {key}; every arm runs the same {key}, set it with {RESERVED_KNOBS[key]}"
        )
    if not (_DRIVER_KNOB.fullmatch(key) or _ENGINE_KEY.fullmatch(key)):
        raise UserError(
            f"{where} has key {key!r}: use an UPPER_CASE driver knob or a lower_case engine key"
        )
    if _DRIVER_KNOB.fullmatch(key) and key not in DRIVER_KNOBS:
        raise UserError(
            f"{where} sets {key}, which is not a driver knob: use one of {', '.join(DRIVER_KNOBS)}"
        )
    if _ENGINE_KEY.fullmatch(key):
        _check_engine_key(key, where)


def chosen_preset(preset_name: str | None, knob_pairs: Sequence[str]) -> tuple[Preset, str]:
    """The preset every arm times, and what chose it: --preset, else the model a --knob
    TRAINER_ARGV names, else this host's default (`presets.default_preset`: its one TPU chip's
    preset, or the CPU's). A pod's A/B always names its preset (`same_pod.py`), so the chips
    read here are this host's only where `ab` runs on it."""
    if preset_name is not None:
        return preset(preset_name), "--preset"
    trainer = parse_trainer_argv(base_knobs(knob_pairs).get("TRAINER_ARGV", ""))
    return knobs.chosen_preset(None, trainer, usable_tpu(os.environ))


def base_knobs(pairs: Sequence[str]) -> dict[str, str]:
    """The knobs `--knob KEY=V` gives every arm, each key checked as an arm's own would be."""
    knobs: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            raise UserError(f"--knob {pair!r}: write KEY=VALUE, e.g. --knob MICRO_STEPS=4")
        check_key(key, "--knob")
        knobs[key] = value
    return knobs


def _check_engine_key(key: str, where: str) -> None:
    """An engine key must be one of ENGINE_KEYS, or `maxtext.KEY` naming one MaxText key the
    bench passes on (a held key would leave the arm a silent copy of the others)."""
    if key.startswith(f"{FLAG_PREFIX}."):
        found = _MAXTEXT_KEY.fullmatch(key)
        if found is None:
            raise UserError(f"{where} has key {key!r}: write {FLAG_PREFIX}.KEY, one MaxText key")
        if found.group(1) in HELD_KEYS:
            raise UserError(
                f"{where} sets {key}, which the bench holds whatever the trainer sets (held:"
                f" {', '.join(HELD_KEYS)}): the arm would run as the others; drop it"
            )
        return
    if key not in ENGINE_KEYS:
        raise UserError(
            f"{where} sets {key}, which is not an engine key{_did_you_mean(key, ENGINE_KEYS)}:"
            f" fix the key name (see `rl-trainer-bench ab --help`), or write {FLAG_PREFIX}.{key}"
            " for a MaxText key"
        )


def _did_you_mean(key: str, known: Sequence[str], before: str = " (", after: str = ")") -> str:
    """` (did you mean KNOWN?)` for the known name nearest `key`, or "" when none is near."""
    close = difflib.get_close_matches(key, list(known), n=1)
    return f"{before}did you mean {close[0]}?{after}" if close else ""


def _one_entry(key: str, value: str) -> bool:
    """Whether `key=value` reads as exactly one entry of ENGINE_FLAGS, the one for `key`."""
    try:
        return list(parse_engine_flags(f"{key}={value}")) == [key]
    except UserError:
        return False


def _check_value(key: str, value: str, where: str) -> None:
    """An engine key's value is one entry of ENGINE_FLAGS; an arm's TRAINER_ARGV sets no
    start-up-bound variable."""
    if _ENGINE_KEY.fullmatch(key) and (_RUN_TOGETHER.search(value) or not _one_entry(key, value)):
        raise UserError(
            f"{where} has {key}={value!r}: an engine key's value is one entry of ENGINE_FLAGS,"
            " with no ';' and no '=' outside quotes or {...}; separate an arm's knobs with commas"
            " (NAME:KEY=V,KEY=V)"
        )
    if key == "TRAINER_ARGV":
        variables = parse_trainer_command(value)[0]
        bound = [name for name in variables if binds_at_start_up(name)]
        if bound:
            raise UserError(
                f"{where} sets TRAINER_ARGV with {bound[0]}=..., which binds when the process"
                " starts (the driver reads only MaxText keys from TRAINER_ARGV's variables and"
                f" would drop it): drop {bound[0]} from the arm; to time it, render one pod per"
                " setting (LIBTPU_FLAGS, DRIVER_ENV) and score their logs with rl-trainer-bench"
                " ab --from-logs"
            )


def _add_knob(knobs: dict[str, str], token: str, arm: str) -> None:
    key, sep, value = token.partition("=")
    if not sep or not value:
        raise UserError(f"--arms: arm {arm!r} has {token!r}; write KEY=VALUE")
    check_key(key, f"--arms: arm {arm!r}")
    _check_value(key, value, f"--arms: arm {arm!r}")
    if key in knobs and knobs[key] != value:
        raise UserError(f"--arms: arm {arm!r} sets {key} twice ({knobs[key]!r}, {value!r})")
    knobs[key] = value


def _number(
    run_order: Sequence[str], definitions: Mapping[str, Mapping[str, str]]
) -> list[ArmSpec]:
    seen: dict[str, int] = {}
    arms = []
    for name in run_order:
        occurrence = seen.get(name, 0)
        seen[name] = occurrence + 1
        knobs = definitions[name]
        arms.append(
            ArmSpec(
                label=_label(name, occurrence),
                setting=name,
                driver_knobs={k: v for k, v in knobs.items() if _DRIVER_KNOB.fullmatch(k)},
                engine_keys={k: v for k, v in knobs.items() if not _DRIVER_KNOB.fullmatch(k)},
                occurrence=occurrence,
            )
        )
    return arms


def _label(name: str, occurrence: int) -> str:
    """The arm's label: the setting's name, `name'` for its first repeat, `name#3` for its third
    run and so on (`#` is no name character, so a label never reads as another setting's name)."""
    if occurrence < 2:
        return name + "'" * occurrence
    return f"{name}#{occurrence + 1}"


def maxtext_keys_checked_in_pod(arm: ArmSpec, engine_config: EngineConfig) -> str | None:
    """The render summary's line on `arm`'s MaxText keys, which only the MaxText that runs can
    check (the trainer's image's, in the pod, before the runtime starts), or None when it sets
    none. A key none of the bench's tables names is marked, with the nearest one it does name."""
    keys = [
        (found.group(1), value)
        for key, value in arm.engine_keys.items()
        if (found := _MAXTEXT_KEY.fullmatch(key))
    ]
    if not keys:
        return None
    known = sorted(
        {*known_keys(engine_config), *APPLICABLE, *VARIABLE_KEYS.values(), *FLAG_KEYS.values()}
    )
    named = [
        f"{key}={value}"
        + (
            ""
            if key in known
            else f" (in none of the bench's tables{_did_you_mean(key, known, '; ', '')})"
        )
        for key, value in keys
    ]
    return (
        f"arm {arm.setting}: MaxText keys {', '.join(named)}: checked in the pod, by the"
        " trainer's image's MaxText before the runtime starts (a key it refuses stops the pod"
        " there, in one line)"
    )
