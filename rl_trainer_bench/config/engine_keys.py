"""Engine keys: the trainer argv as the launcher writes it, and `key=value` engine flags.

Everything is validated here, once, into a frozen `EngineConfig`; keys the built-in engine does
not apply are returned so the driver lists them, never dropped silently.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from rl_trainer_bench.config import trainer_maxtext, values
from rl_trainer_bench.config.presets import Preset
from rl_trainer_bench.engine.config import (
    EngineConfig,
    MeshConfig,
    choices,
    leaf_fields,
    with_value_at,
)
from rl_trainer_bench.engine.factory import BUILT_IN, MAXTEXT
from rl_trainer_bench.engine.maxtext.keys import DEFAULTED_IN_MAXTEXT
from rl_trainer_bench.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class EngineKey:
    """One key the built-in engine applies: its default (as text), where it lands, how it parses."""

    default: str
    target: str  # dotted path into EngineConfig, e.g. "mesh.fsdp"
    kind: str  # int | float | bool | choice:a|b | max_norm_kwargs | prompt_plus_response
    help: str = ""
    minimum: int | None = None  # for int kinds


def _kind(annotation: object) -> str:
    allowed = choices(annotation)
    if allowed is not None:
        return "choice:" + "|".join(allowed)
    return {int: "int", float: "float", bool: "bool"}[annotation]


def _keys_from_fields() -> dict[str, EngineKey]:
    """A key per EngineConfig field marked `engine_key`, named as the trainer argv spells it."""
    keys = {}
    for path, field, annotation in leaf_fields():
        if "help" not in field.metadata:
            continue
        name = field.metadata["key"] or path.rpartition(".")[2]
        kind = _kind(annotation)
        default = str(field.default).lower() if kind == "bool" else str(field.default)
        keys[name] = EngineKey(
            default, path, kind, field.metadata["help"], field.metadata["minimum"]
        )
    return keys


def _top_level_default(name: str) -> object:
    return next(f.default for f in dataclasses.fields(EngineConfig) if f.name == name)


def _trainer_spellings(keys: Mapping[str, EngineKey]) -> dict[str, EngineKey]:
    """Trainer-argv keys that do not map one-to-one onto a field."""
    seq = "seq_len (max_prompt_length + max_response_length)"
    max_norm = keys["max_grad_norm"]
    return {
        "train_micro_batch_size": EngineKey(
            str(_top_level_default("micro_batch_rows")),
            "micro_batch_rows",
            "int",
            "rows per micro-batch",
            1,
        ),
        "max_prompt_length": EngineKey("0", seq, "prompt_plus_response", "prompt tokens", 0),
        "max_response_length": EngineKey(
            str(_top_level_default("seq_len")), seq, "prompt_plus_response", "response tokens", 0
        ),
        "optimizer_opt_chain_type": EngineKey(
            "clip_by_global_norm",
            "optimizer (chain)",
            "choice:clip_by_global_norm",
            "gradient chain",
        ),
        "optimizer_chain_kwargs": EngineKey(
            f"{{'max_norm': {max_norm.default}}}", max_norm.target, "max_norm_kwargs", max_norm.help
        ),
    }


_FIELD_KEYS = _keys_from_fields()
ENGINE_KEYS: Mapping[str, EngineKey] = {**_FIELD_KEYS, **_trainer_spellings(_FIELD_KEYS)}

_SEPARATOR = re.compile(r"[\s,]")
_BRACE_LITERAL = re.compile(r"\{[^}]*\}")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_FLAG_TOKEN = re.compile(
    r"""\s*([A-Za-z_][\w.-]*)=("[^"]*"|'[^']*'|\{[^}]*\}|[^\s,]*)\s*(?:,|\s|$)"""
)


def parse_trainer_argv(argv: str | Sequence[str]) -> dict[str, str]:
    """Flags of a trainer command line: {name without dashes: value}.

    Accepts the launcher's client command as it stands: leading `NAME=value` environment
    assignments and the python command (`python -m module`) are skipped; `--k=v`, `--k v` and a
    bare `--flag` (value "true") are read; quoted values lose their quotes. Last one wins.
    """
    return parse_trainer_command(argv)[1]


def parse_trainer_command(argv: str | Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The `NAME=value` words before a trainer command's first flag, and its flags (as
    `parse_trainer_argv` reads them): the words carry its MaxText keys (`MAXTEXT_EXTRA_FLAGS`)."""
    tokens = values.shell_words("TRAINER_ARGV", argv) if isinstance(argv, str) else list(argv)
    start = next((i for i, token in enumerate(tokens) if token.startswith("--")), len(tokens))
    environment: dict[str, str] = {}
    for token in tokens[:start]:
        if _ENV_ASSIGNMENT.match(token):
            name, _, value = token.partition("=")
            environment[name] = value
        elif not (token in ("-m", "-u") or "python" in token or "." in token):
            raise ConfigError(
                f"TRAINER_ARGV: unexpected {token!r} before the first --flag; expected env "
                "assignments and a python command, then --key=value flags"
            )
    flags: dict[str, str] = {}
    index = start
    while index < len(tokens):
        token = tokens[index]
        if not token.startswith("--") or token == "--":
            raise ConfigError(f"TRAINER_ARGV: {token!r} is not a --flag; write --key=value")
        name, has_value, value = token[2:].partition("=")
        if not has_value:
            following = tokens[index + 1] if index + 1 < len(tokens) else None
            if following is not None and not following.startswith("--"):
                value, index = following, index + 1
            else:
                value = "true"
        flags[name] = value
        index += 1
    return environment, flags


def parse_engine_flags(text: str | Sequence[str]) -> dict[str, str]:
    """`key=value` pairs separated by whitespace or commas (quotes and {...} kept whole); last wins."""
    text = " ".join(text) if not isinstance(text, str) else text
    flags: dict[str, str] = {}
    position = 0
    while position < len(text):
        if text[position] in " \t\n,":
            position += 1
            continue
        match = _FLAG_TOKEN.match(text, position)
        if match is None:
            rest = (text[position:].split() or [text[position:]])[0]
            raise ConfigError(f"ENGINE_FLAGS: {rest!r} is not key=value; write e.g. beta=0.04")
        key, value = match.group(1), match.group(2)
        if value[:1] in ("'", '"', "{") and not _closed(value):
            raise ConfigError(
                f"ENGINE_FLAGS: {key}={value} opens a quote or brace it does not close; close it"
            )
        if value[:1] in ("'", '"'):
            value = value[1:-1]
        flags.pop(key, None)  # the last occurrence wins and takes the last place
        flags[key] = value
        position = match.end()
    return flags


class CommandLine(tuple):
    """A trainer's or orchestrator's command as shell words (a tuple of them, as TRAINER_ARGV and
    ORCH_ARGV have always been), read once, when it is made: it carries the `NAME=value` words
    before its python command (`environment`) and its flags (`flags`), as `parse_trainer_command`
    reads them, so that every later stage takes them from here and none reads the words again.
    A string is split as shell words first (naming TRAINER_ARGV where it does not split)."""

    environment: Mapping[str, str]
    flags: Mapping[str, str]

    def __new__(cls, words: str | Sequence[str] = ()) -> CommandLine:
        if isinstance(words, str):
            words = values.shell_words("TRAINER_ARGV", words)
        environment, flags = parse_trainer_command(list(words))
        return cls._made(words, environment, flags)

    @classmethod
    def _made(
        cls, words: Sequence[str], environment: Mapping[str, str], flags: Mapping[str, str]
    ) -> CommandLine:
        line = super().__new__(cls, words)
        line.environment = MappingProxyType(dict(environment))
        line.flags = MappingProxyType(dict(flags))
        return line

    def __reduce__(self):  # pickled and copied as read, not read again
        return CommandLine._made, (tuple(self), dict(self.environment), dict(self.flags))

    def with_flags(self, added: Mapping[str, str]) -> CommandLine:
        """This command with `--key=value` words appended for `added` (keys it lacks), read as
        such words read: each a flag of its own."""
        words = (*self, *(f"--{key}={value}" for key, value in added.items()))
        return CommandLine._made(words, self.environment, {**self.flags, **added})


def command_line(words: str | Sequence[str]) -> CommandLine:
    """`words` as a CommandLine: itself where it was read already, else read now (a caller that
    holds the raw words: a test, a command's own flag)."""
    return words if isinstance(words, CommandLine) else CommandLine(words)


class EngineFlags(str):
    """ENGINE_FLAGS' text, read once, when it is made: its `key=value` words (`given`, as
    `parse_engine_flags` reads them, last wins) and those split into the engine's keys (`engine`)
    and MaxText's `maxtext.KEY` words (`maxtext`, as `split_maxtext_flags` splits them). The text
    stays the knob's value (what is printed and passed to a pod); every later stage reads the
    keys from here."""

    given: Mapping[str, str]
    engine: Mapping[str, str]
    maxtext: tuple[tuple[str, str], ...]

    def __new__(cls, text: str | Sequence[str] = "") -> EngineFlags:
        text = " ".join(text) if not isinstance(text, str) else text
        given = parse_engine_flags(text)
        return cls._made(text, given, *split_maxtext_flags(given))

    @classmethod
    def _made(
        cls,
        text: str,
        given: Mapping[str, str],
        engine: Mapping[str, str],
        maxtext: tuple[tuple[str, str], ...],
    ) -> EngineFlags:
        flags = super().__new__(cls, text)
        flags.given = MappingProxyType(dict(given))
        flags.engine = MappingProxyType(dict(engine))
        flags.maxtext = maxtext
        return flags

    def __reduce__(self):  # pickled and copied as read, not read again
        return EngineFlags._made, (str(self), dict(self.given), dict(self.engine), self.maxtext)


def engine_flags_of(text: str | Sequence[str]) -> EngineFlags:
    """`text` as EngineFlags: itself where it was read already, else read now."""
    return text if isinstance(text, EngineFlags) else EngineFlags(text)


@dataclasses.dataclass(frozen=True)
class ResolvedEngine:
    """A run's engine config as `engine_config_from` resolved it, with the inputs it was resolved
    from: made once, where the knobs are read (the step's shape needs its rows), and carried on
    to the plan, which takes it while those inputs are still the run's."""

    preset: Preset
    engine: str
    trainer: CommandLine
    flags: EngineFlags
    config: EngineConfig
    unapplied: tuple[str, ...]

    def resolved_from(
        self, preset: Preset, engine: str, trainer: CommandLine, flags: EngineFlags
    ) -> bool:
        return (self.preset, self.engine, self.trainer, self.flags) == (
            preset,
            engine,
            trainer,
            flags,
        )


def _closed(value: str) -> bool:
    """Whether a value that opens with a quote or brace is exactly one quoted or braced literal."""
    if value[0] == "{":
        return _BRACE_LITERAL.fullmatch(value) is not None
    return len(value) >= 2 and value[-1] == value[0] and value[0] not in value[1:-1]


def format_engine_flags(flags: Iterable[tuple[str, str]]) -> str:
    """ENGINE_FLAGS text that `parse_engine_flags` reads back as exactly `flags`.

    Every value is written in a form that ends where it should whatever follows it: bare when it
    has no separator and does not open with a quote or a brace, a `{...}` literal as it is, else
    between the quote character it lacks. A value with both quote characters that needs quoting
    has no such form and is refused by name.
    """
    words = []
    for key, value in flags:
        form = _self_delimiting_form(value)
        if form is None:
            raise ConfigError(
                f"ENGINE_FLAGS: the value of {key} ({value!r}) needs quoting but holds both quote"
                " characters; no ENGINE_FLAGS form carries it"
            )
        words.append(f"{key}={form}")
    return " ".join(words)


def _self_delimiting_form(value: str) -> str | None:
    if value and not _SEPARATOR.search(value) and value[0] not in "\"'{":
        return value
    if _BRACE_LITERAL.fullmatch(value):
        return value
    return next((f"{q}{value}{q}" for q in "\"'" if q not in value), None)


def _parse_value(key: str, text: str, spec: EngineKey):
    """The typed value of one engine key; ConfigError naming key, value and the allowed form."""

    def fail(allowed: str):
        raise ConfigError(f"engine key {key}={text!r}: expected {allowed}")

    kind = spec.kind
    if kind in ("int", "prompt_plus_response"):
        if not values.WHOLE_NUMBER.fullmatch(text.strip()):
            fail("an integer (ASCII digits)")
        value = int(text)
        if spec.minimum is not None and value < spec.minimum:
            fail("a positive integer" if spec.minimum == 1 else f"an integer >= {spec.minimum}")
        return value
    if kind == "float":
        if not values.REAL_NUMBER.fullmatch(text.strip()):
            fail("a number")
        return float(text)
    if kind == "bool":
        value = values.boolean_word(text)
        if value is None:
            fail("true or false")
        return value
    if kind.startswith("choice:"):
        allowed = kind.removeprefix("choice:").split("|")
        if text not in allowed:
            fail(f"one of {', '.join(allowed)}")
        return text
    if kind == "max_norm_kwargs":
        try:
            kwargs = ast.literal_eval(text)
            return real_number_of(kwargs["max_norm"])
        except (ValueError, SyntaxError, KeyError, TypeError, MemoryError, RecursionError):
            fail("a dict literal like {'max_norm': 0.125}")
    raise AssertionError(f"unknown kind {kind}")


def real_number_of(value: object) -> float:
    """A literal's number (int or float, not bool), finite; ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(value)
    return float(value)


def split_maxtext_flags(
    flags: Mapping[str, str],
) -> tuple[dict[str, str], tuple[tuple[str, str], ...]]:
    """ENGINE_FLAGS as (engine keys, MaxText keys): `maxtext.KEY=VALUE` sets MaxText key KEY,
    applied after the trainer's own keys, as one more word of its MAXTEXT_EXTRA_FLAGS would be
    (how an A/B arm sets a MaxText key). ConfigError for `maxtext.` with no key."""
    engine: dict[str, str] = {}
    maxtext: list[tuple[str, str]] = []
    for key, value in flags.items():
        prefix, dot, name = key.partition(".")
        if prefix != trainer_maxtext.FLAG_PREFIX or not dot:
            engine[key] = value
        elif not name or "." in name:
            raise ConfigError(
                f"ENGINE_FLAGS: {key}={value}: write maxtext.KEY=VALUE, one MaxText key"
            )
        else:
            maxtext.append((name, value))
    return engine, tuple(maxtext)


def engine_config_from(
    preset: Preset,
    trainer_argv: str | Sequence[str] = (),
    engine_flags: str | Sequence[str] = (),
    engine: str = BUILT_IN,
) -> tuple[EngineConfig, list[str]]:
    """The preset's engine config for the engine `engine` names (`Preset.engine_for`) with the
    trainer command's keys, then the engine flags', applied.

    The trainer command's keys are its flags, then its MaxText keys (`trainer_maxtext`: the
    `MAXTEXT_EXTRA_FLAGS` words and variables before its python command, applied after its flags
    as Tunix does), each mapped onto the engine key of the same meaning; the config keeps them all
    in `trainer_maxtext_keys`. A trainer argv that sets any mesh axis sets the whole mesh, as the
    trainer reads it: an axis it leaves out is 1, not the preset's. Returns the config and the
    sorted flags that were given but that the built-in engine does not apply (to be listed at
    start-up, never dropped silently); `trainer_key_fates` says what became of each MaxText key.
    """
    trainer, flags_given = command_line(trainer_argv), engine_flags_of(engine_flags)
    environment, given, flag_keys = trainer.environment, flags_given.engine, flags_given.maxtext
    trainer_keys = (*trainer_maxtext.maxtext_keys(environment, trainer.flags), *flag_keys)
    argv_flags = {k: v for k, v in trainer.flags.items() if k not in trainer_maxtext.FLAG_KEYS}
    mapped = _mapped_trainer_keys(trainer_keys)
    flags = {**argv_flags, **mapped, **given}
    config = dataclasses.replace(preset.engine_for(engine), trainer_maxtext_keys=trainer_keys)
    if any(ENGINE_KEYS[key].target.startswith("mesh.") for key in argv_flags if key in ENGINE_KEYS):
        config = dataclasses.replace(config, mesh=MeshConfig())
    unapplied = sorted(key for key in flags if key not in ENGINE_KEYS)
    sequence: dict[str, int] = {}
    for key, text in flags.items():
        spec = ENGINE_KEYS.get(key)
        if spec is None or spec.target == "optimizer (chain)":
            if spec is not None:
                _parse_value(key, text, spec)
            continue
        value = _parse_value(key, text, spec)
        if spec.kind == "prompt_plus_response":
            sequence[key] = value
        else:
            config = with_value_at(config, spec.target, value)
    if sequence:
        if len(sequence) == 1:
            (given,) = sequence
            other = "max_response_length" if given == "max_prompt_length" else "max_prompt_length"
            raise ConfigError(
                f"engine key {given}={sequence[given]} without {other}: seq_len is their sum; "
                "pass both"
            )
        config = dataclasses.replace(config, seq_len=sum(sequence.values()))
    if engine == MAXTEXT and (environment or argv_flags):  # a trainer's program to be true to
        given_fields = {ENGINE_KEYS[key].target for key in flags if key in ENGINE_KEYS}
        defaulted = tuple(f for f in DEFAULTED_IN_MAXTEXT if f not in given_fields)
        config = dataclasses.replace(config, maxtext_defaults=defaulted)
    return config, unapplied


def _mapped_trainer_keys(trainer_keys: Sequence[tuple[str, str]]) -> dict[str, str]:
    """{engine key: value text} of the trainer's MaxText keys the engine applies, each checked
    here so a bad value names the trainer key it came from."""
    mapped = {}
    for fate in trainer_maxtext.engine_assignments(trainer_keys):
        if fate.fate != trainer_maxtext.APPLIED or not fate.engine_key:
            continue
        try:
            _parse_value(fate.engine_key, fate.engine_value, ENGINE_KEYS[fate.engine_key])
        except ConfigError as error:
            raise ConfigError(
                f"the trainer's MaxText key {fate.key}={fate.value!r} ({error}): fix it in the"
                f" trainer's command (its {trainer_maxtext.EXTRA_FLAGS_VARIABLE}, variables or"
                " flags)"
            ) from None
        mapped[fate.engine_key] = fate.engine_value
    return mapped


def trainer_key_fates(
    trainer_argv: str | Sequence[str] = (), engine_flags: str | Sequence[str] = ()
) -> list[trainer_maxtext.TrainerKey]:
    """What became of each MaxText key of the trainer's command, ENGINE_FLAGS included (its
    `maxtext.KEY` words follow the trainer's keys, marked as set by ENGINE_FLAGS)."""
    trainer, flags = command_line(trainer_argv), engine_flags_of(engine_flags)
    given, flag_keys = flags.engine, flags.maxtext
    keys = (*trainer_maxtext.maxtext_keys(trainer.environment, trainer.flags), *flag_keys)
    fates = [
        dataclasses.replace(fate, fate=trainer_maxtext.OVERRIDDEN_BY_FLAGS)
        if fate.fate == trainer_maxtext.APPLIED and fate.engine_key in given
        else fate
        for fate in trainer_maxtext.engine_assignments(keys)
    ]
    return trainer_maxtext.marked_from_flags(fates, len(flag_keys))
