"""Engine keys: the trainer argv as the launcher writes it, and `key=value` engine flags.

Everything is validated here, once, into a frozen `EngineConfig`; keys the built-in engine does
not apply are returned so the driver lists them, never dropped silently.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import shlex
from collections.abc import Mapping, Sequence

from rl_trainer_bench.config.presets import Preset
from rl_trainer_bench.engine.config import EngineConfig, LossConfig, MoeConfig, OptimizerConfig
from rl_trainer_bench.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class EngineKey:
    """One key the built-in engine applies: its default (as text), where it lands, how it parses."""

    default: str
    target: str  # dotted path into EngineConfig, e.g. "mesh.fsdp"
    kind: str  # int | positive_int | float | bool | choice:a|b | max_norm_kwargs | prompt_plus_response


_OPTIMIZER = OptimizerConfig()
_LOSS, _MOE = LossConfig(), MoeConfig()
_SEQ = "seq_len (max_prompt_length + max_response_length)"

ENGINE_KEYS: Mapping[str, EngineKey] = {
    # From the trainer argv as the launcher writes it (and accepted as engine flags too).
    "mesh_fsdp": EngineKey("1", "mesh.fsdp", "positive_int"),
    "mesh_context": EngineKey("1", "mesh.context", "positive_int"),
    "mesh_expert": EngineKey("1", "mesh.expert", "positive_int"),
    "train_micro_batch_size": EngineKey("8", "micro_batch_rows", "positive_int"),
    "max_prompt_length": EngineKey("0", _SEQ, "prompt_plus_response"),
    "max_response_length": EngineKey("128", _SEQ, "prompt_plus_response"),
    "compute_logps_chunk_size": EngineKey(
        str(_LOSS.compute_logps_chunk_size), "loss.compute_logps_chunk_size", "positive_int"
    ),
    "remat_policy": EngineKey("full", "model.remat_policy", "choice:full|minimal|none"),
    "optimizer_learning_rate": EngineKey(
        str(_OPTIMIZER.learning_rate), "optimizer.learning_rate", "float"
    ),
    "optimizer_schedule_type": EngineKey(
        _OPTIMIZER.schedule, "optimizer.schedule", "choice:constant|warmup_cosine_decay_schedule"
    ),
    "optimizer_init_value": EngineKey(str(_OPTIMIZER.init_value), "optimizer.init_value", "float"),
    "optimizer_peak_value": EngineKey(str(_OPTIMIZER.peak_value), "optimizer.peak_value", "float"),
    "optimizer_end_value": EngineKey(str(_OPTIMIZER.end_value), "optimizer.end_value", "float"),
    "optimizer_warmup_steps": EngineKey(
        str(_OPTIMIZER.warmup_steps), "optimizer.warmup_steps", "int"
    ),
    "optimizer_decay_steps": EngineKey(
        str(_OPTIMIZER.decay_steps), "optimizer.decay_steps", "positive_int"
    ),
    "optimizer_b1": EngineKey(str(_OPTIMIZER.b1), "optimizer.b1", "float"),
    "optimizer_b2": EngineKey(str(_OPTIMIZER.b2), "optimizer.b2", "float"),
    "optimizer_eps": EngineKey(str(_OPTIMIZER.eps), "optimizer.eps", "float"),
    "optimizer_weight_decay": EngineKey(
        str(_OPTIMIZER.weight_decay), "optimizer.weight_decay", "float"
    ),
    "optimizer_opt_chain_type": EngineKey(
        "clip_by_global_norm", "optimizer (chain)", "choice:clip_by_global_norm"
    ),
    "optimizer_chain_kwargs": EngineKey(
        "{'max_norm': 1.0}", "optimizer.max_grad_norm", "max_norm_kwargs"
    ),
    # Engine flags only (key=value).
    "max_grad_norm": EngineKey(str(_OPTIMIZER.max_grad_norm), "optimizer.max_grad_norm", "float"),
    "epsilon": EngineKey(str(_LOSS.epsilon), "loss.epsilon", "float"),
    "epsilon_high": EngineKey(str(_LOSS.epsilon_high), "loss.epsilon_high", "float"),
    "beta": EngineKey(str(_LOSS.beta), "loss.beta", "float"),
    "ragged_buffer_factor": EngineKey(
        str(_MOE.ragged_buffer_factor), "moe.ragged_buffer_factor", "float"
    ),
    "retry_when_tokens_dropped": EngineKey("true", "moe.retry_when_tokens_dropped", "bool"),
    "expert_compute": EngineKey("auto", "moe.expert_compute", "choice:auto|einsum|ragged_dot"),
    "dropless_compute": EngineKey(
        _MOE.dropless_compute, "moe.dropless_compute", "choice:auto|capacity|ragged_dot|gmm"
    ),
    "router_replay": EngineKey("true", "moe.router_replay", "bool"),
    "attention": EngineKey("auto", "model.attention", "choice:auto|xla|cudnn"),
    "attention_chunk_size": EngineKey("1024", "model.attention_chunk_size", "positive_int"),
    "linear_chunk_size": EngineKey("64", "model.linear_chunk_size", "positive_int"),
    "dtype": EngineKey("bfloat16", "model.dtype", "choice:bfloat16|float32"),
    "matmul_precision": EngineKey("default", "matmul_precision", "choice:default|high|highest"),
    "seed": EngineKey("0", "seed", "int"),
}

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
    tokens = shlex.split(argv) if isinstance(argv, str) else list(argv)
    start = next((i for i, token in enumerate(tokens) if token.startswith("--")), len(tokens))
    for token in tokens[:start]:
        if not (
            _ENV_ASSIGNMENT.match(token)
            or token in ("-m", "-u")
            or "python" in token
            or "." in token
        ):
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
    return flags


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
            rest = text[position:].split()[0]
            raise ConfigError(f"ENGINE_FLAGS: {rest!r} is not key=value; write e.g. beta=0.04")
        key, value = match.group(1), match.group(2)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        flags[key] = value
        position = match.end()
    return flags


def _parse_value(key: str, text: str, kind: str):
    """The typed value of one engine key; ConfigError naming key, value and the allowed form."""

    def fail(allowed: str):
        raise ConfigError(f"engine key {key}={text!r}: expected {allowed}")

    if kind in ("int", "positive_int", "prompt_plus_response"):
        try:
            value = int(text)
        except ValueError:
            fail("an integer")
        if kind == "positive_int" and value < 1:
            fail("a positive integer")
        if kind == "prompt_plus_response" and value < 0:
            fail("an integer >= 0")
        return value
    if kind == "float":
        try:
            return float(text)
        except ValueError:
            fail("a number")
    if kind == "bool":
        lowered = text.strip().lower()
        if lowered not in ("true", "false", "1", "0"):
            fail("true or false")
        return lowered in ("true", "1")
    if kind.startswith("choice:"):
        choices = kind.removeprefix("choice:").split("|")
        if text not in choices:
            fail(f"one of {', '.join(choices)}")
        return text
    if kind == "max_norm_kwargs":
        try:
            kwargs = ast.literal_eval(text)
            return float(kwargs["max_norm"])
        except (ValueError, SyntaxError, KeyError, TypeError):
            fail("a dict literal like {'max_norm': 0.125}")
    raise AssertionError(f"unknown kind {kind}")


def _replace_path(config, path: str, value):
    """A copy of the nested frozen dataclass `config` with `path` (a.b) set to `value`."""
    head, _, rest = path.partition(".")
    if not rest:
        return dataclasses.replace(config, **{head: value})
    return dataclasses.replace(config, **{head: _replace_path(getattr(config, head), rest, value)})


def engine_config_from(
    preset: Preset,
    trainer_argv: str | Sequence[str] = (),
    engine_flags: str | Sequence[str] = (),
) -> tuple[EngineConfig, list[str]]:
    """The preset's engine config with the trainer argv's keys, then the engine flags', applied.

    Returns the config and the sorted keys that were given but that the built-in engine does not
    apply (to be listed at start-up, never dropped silently).
    """
    flags = {**parse_trainer_argv(trainer_argv), **parse_engine_flags(engine_flags)}
    config = preset.engine
    unapplied = sorted(key for key in flags if key not in ENGINE_KEYS)
    sequence: dict[str, int] = {}
    for key, text in flags.items():
        spec = ENGINE_KEYS.get(key)
        if spec is None or spec.target == "optimizer (chain)":
            if spec is not None:
                _parse_value(key, text, spec.kind)
            continue
        value = _parse_value(key, text, spec.kind)
        if spec.kind == "prompt_plus_response":
            sequence[key] = value
        else:
            config = _replace_path(config, spec.target, value)
    if sequence:
        if len(sequence) == 1:
            (given,) = sequence
            other = "max_response_length" if given == "max_prompt_length" else "max_prompt_length"
            raise ConfigError(
                f"engine key {given}={sequence[given]} without {other}: seq_len is their sum; "
                "pass both"
            )
        config = dataclasses.replace(config, seq_len=sum(sequence.values()))
    return config, unapplied
