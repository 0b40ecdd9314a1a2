"""Configuration at the edge: presets, engine keys from a trainer argv or `key=value` flags, driver knobs.

Everything is validated here, once, into frozen objects; no module past this one reads the
environment or re-validates. Errors are `ConfigError`s whose one-line message names the knob, the
value and what is allowed, because a pod's log is often the only place a user sees them.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from rl_trainer_bench.engine.engine_config import (
    EngineConfig,
    LossConfig,
    MeshConfig,
    ModelConfig,
    MoeConfig,
    OptimizerConfig,
)
from rl_trainer_bench.errors import UserError


class ConfigError(UserError):
    """Invalid configuration; the message is one line naming the knob, the value and the fix."""


# ----------------------------------------------------------------------------------------------
# Presets
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named cell: the engine's shapes and mesh, and the bench's default step shape."""

    name: str
    engine: EngineConfig
    micro_steps: int  # micro-batches per step
    host_devices: int  # CPU devices to force when running on the host platform (0: leave alone)
    purpose: str


# Qwen3.5's repeating block (full_attention_interval=4): three Gated DeltaNet layers, then one
# gated full-attention layer.
_QWEN35_BLOCK = ("linear_attention",) * 3 + ("full_attention",)

PRESETS: Mapping[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset(
            name="cpu-tiny",
            engine=EngineConfig(
                model=ModelConfig(
                    vocab_size=512,
                    d_model=64,
                    num_layers=2,
                    num_heads=4,
                    num_kv_heads=2,
                    head_dim=16,
                    num_experts=8,
                    top_k=2,
                    expert_ffn_dim=64,
                    shared_expert_ffn_dim=64,
                    dtype="float32",
                    attention_output_gate=True,
                    layer_types=("linear_attention", "full_attention"),
                    linear_num_key_heads=2,
                    linear_num_value_heads=4,
                    linear_key_head_dim=16,
                    linear_value_head_dim=16,
                    linear_chunk_size=32,
                ),
                mesh=MeshConfig(fsdp=2, context=2, expert=2),
                # Expert groups here hold only 64 tokens, so the synthetic profile's skew overflows
                # a 1.25 buffer on almost every micro-batch; 2.0 keeps replays occasional, as in
                # production, where groups hold thousands of tokens.
                moe=MoeConfig(ragged_buffer_factor=2.0),
                micro_batch_rows=4,
                seq_len=128,
            ),
            micro_steps=2,
            host_devices=8,
            purpose="tests and the default main job: seconds on 2 CPU cores, 8 host devices as 2x2x2",
        ),
        Preset(
            name="gpu-small",
            engine=EngineConfig(
                model=ModelConfig(
                    vocab_size=32_768,
                    d_model=2048,
                    num_layers=12,
                    num_heads=16,
                    num_kv_heads=4,
                    head_dim=128,
                    num_experts=64,
                    top_k=4,
                    expert_ffn_dim=1024,
                    shared_expert_ffn_dim=0,
                    attention_output_gate=True,
                    layer_types=_QWEN35_BLOCK,
                    linear_num_key_heads=8,
                    linear_num_value_heads=16,
                    linear_key_head_dim=128,
                    linear_value_head_dim=128,
                ),
                mesh=MeshConfig(),
                micro_batch_rows=8,
                seq_len=8192,
            ),
            micro_steps=4,
            host_devices=0,
            purpose="fills one H200 for about a second per micro-batch",
        ),
        Preset(
            # Qwen3.5-397B-A17B's public shapes (model card of Qwen/Qwen3.5-397B-A17B on Hugging
            # Face): 60 layers as 15 x (3 Gated DeltaNet + 1 gated full attention), hidden 4096;
            # full attention 32 query / 2 KV heads of 256; linear attention 16 QK / 64 V heads of
            # 128; 512 experts, 10 routed + 1 shared, of 1024; vocabulary 248,320. The 4-tap
            # convolution and the attention output gate (linear_conv_kernel_dim=4,
            # attn_output_gate=true) are from the public config.json files of the Qwen3.5 family
            # (qwen3_5 model type), which this model shares.
            name="qwen3.5-397b-cell",
            engine=EngineConfig(
                model=ModelConfig(
                    vocab_size=248_320,
                    d_model=4096,
                    num_layers=60,
                    num_heads=32,
                    num_kv_heads=2,
                    head_dim=256,
                    num_experts=512,
                    top_k=10,
                    expert_ffn_dim=1024,
                    shared_expert_ffn_dim=1024,
                    attention_output_gate=True,
                    layer_types=_QWEN35_BLOCK,
                    linear_num_key_heads=16,
                    linear_num_value_heads=64,
                    linear_key_head_dim=128,
                    linear_value_head_dim=128,
                    linear_conv_kernel_dim=4,
                ),
                mesh=MeshConfig(fsdp=32, context=4, expert=2),
                micro_batch_rows=64,
                seq_len=65_536,
            ),
            micro_steps=9,
            host_devices=0,
            purpose="the production cell's shapes on 256 devices: for AOT and payload building, not for running here",
        ),
    )
}


def preset(name: str) -> Preset:
    """The preset called `name`; an unknown name raises ConfigError listing the known ones."""
    if name not in PRESETS:
        raise ConfigError(f"PRESET={name!r} is unknown: choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


# ----------------------------------------------------------------------------------------------
# Engine keys: trainer argv and key=value engine flags
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# Driver knobs (BenchConfig)
# ----------------------------------------------------------------------------------------------

# Every driver knob, its default, and what it accepts; read from the environment (DRIVER_ENV in a pod)
# and from flags of the same names (`--micro-steps` for MICRO_STEPS). Unset means the default.
DRIVER_KNOBS: Mapping[str, str] = {
    "PRESET": "preset name (default cpu-tiny)",
    "STEPS": "scored steps, >= 1 (default 5)",
    "WARMUP_STEPS": "warm-up steps before the scored ones, >= 1 (default 1)",
    "MICRO_STEPS": "fwd_bwd calls per step, >= 1 (default: the preset's)",
    "DISTINCT_MICRO_BATCHES": "micro-batches in the pool, >= 1 (default MICRO_STEPS + 1)",
    "STAGE_BEFORE_UPDATE": "on|off (default off)",
    "STAGE_AFTER_UPDATE": "on|off (default off; exclusive with STAGE_BEFORE_UPDATE)",
    "STAGE_ISSUE": "auto|before_last|after_last: where in the step the stage's copy is issued",
    "PROFILE_STEPS": "a:b, steps to trace with jax.profiler (default: none)",
    "RESULTS_DIR": "folder for results.jsonl and profile/ (default bench_results)",
    "ROUTING_PROFILE": "routing profile JSON path (default: the shipped one)",
    "SEED": "integer seed of the micro-batch pool (default 0)",
    "TRAINER_ARGV": "the trainer's argv, shell-quoted (engine keys)",
    "ENGINE_FLAGS": "key=value engine keys, space-separated",
    "ORCH_ARGV": "the orchestrator's argv, shell-quoted (micro-batch rows and lengths)",
    "WORKER": "separate|fused (default separate)",
}


def add_driver_knob_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per driver knob, named after it (`--micro-steps` for MICRO_STEPS)."""
    for knob, meaning in DRIVER_KNOBS.items():
        parser.add_argument(
            "--" + knob.lower().replace("_", "-"), dest=knob, metavar="VALUE", help=meaning
        )


def driver_knobs(env: Mapping[str, str], flags: argparse.Namespace) -> dict[str, str]:
    """The driver knobs: the environment's, overridden by any flag given."""
    knobs = {k: env[k] for k in DRIVER_KNOBS if k in env}
    knobs.update({k: v for k, v in vars(flags).items() if k in DRIVER_KNOBS and v is not None})
    return knobs


_SWITCH_VALUES = {"on": True, "off": False}
STAGE_ISSUE_CHOICES = ("auto", "before_last", "after_last")
WORKER_CHOICES = ("separate", "fused")


def _switch(env: Mapping[str, str], knob: str) -> bool:
    value = env.get(knob, "off").strip().lower()
    if value not in _SWITCH_VALUES:
        raise ConfigError(f"{knob}={env[knob]!r} is not allowed: use on or off")
    return _SWITCH_VALUES[value]


def _choice(env: Mapping[str, str], knob: str, choices: tuple[str, ...], default: str) -> str:
    value = env.get(knob, default).strip()
    if value not in choices:
        raise ConfigError(f"{knob}={value!r} is not allowed: use one of {', '.join(choices)}")
    return value


def _integer(env: Mapping[str, str], knob: str, default: int, minimum: int | None) -> int:
    text = env.get(knob, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{knob}={text!r} is not an integer: {DRIVER_KNOBS[knob]}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{knob}={value} is too small: {DRIVER_KNOBS[knob]}")
    return value


def _argv(env: Mapping[str, str], knob: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(env.get(knob, "")))
    except ValueError as error:
        raise ConfigError(f"{knob}={env[knob]!r} does not parse as shell words: {error}") from None


@dataclasses.dataclass(frozen=True)
class StageConfig:
    """When the next step's first micro-batch is staged, if at all.

    `before_update` stages it at the boundary, before `update()`; `after_update` stages it right
    after `update()` is dispatched (the order the seeds replaced, kept for A/B). `issue` places the
    before-update copy relative to the step's last `fwd_bwd`: on a GPU a copy issued after a
    dispatched computation queues behind it (../shared/reference/h200-facts.md), so `auto` issues it
    before the last dispatch there and after it elsewhere.
    """

    before_update: bool = False
    after_update: bool = False
    issue: str = "auto"

    @property
    def enabled(self) -> bool:
        return self.before_update or self.after_update

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StageConfig:
        before = _switch(env, "STAGE_BEFORE_UPDATE")
        after = _switch(env, "STAGE_AFTER_UPDATE")
        if before and after:
            raise ConfigError("STAGE_BEFORE_UPDATE and STAGE_AFTER_UPDATE are exclusive: set one")
        return cls(before, after, _choice(env, "STAGE_ISSUE", STAGE_ISSUE_CHOICES, "auto"))

    def issue_before_last(self, platform: str) -> bool:
        """Whether the before-update copy goes out before the step's last fwd_bwd on `platform`."""
        if self.issue == "auto":
            return platform in ("gpu", "cuda", "rocm")
        return self.issue == "before_last"

    def describe(self) -> str:
        if self.before_update:
            return f"before_update(issue={self.issue})"
        return "after_update" if self.after_update else "off"


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """The driver's knobs, validated. Steps are numbered from 0; warm-up steps come first."""

    preset: Preset
    steps: int = 5
    warmup_steps: int = 1
    micro_steps: int = 2
    distinct_micro_batches: int = 3
    stage: StageConfig = StageConfig()
    profile_steps: tuple[int, int] | None = None  # inclusive step range
    results_dir: Path = Path("bench_results")
    routing_profile: str | None = None
    seed: int = 0
    trainer_argv: tuple[str, ...] = ()
    engine_flags: tuple[str, ...] = ()
    orch_argv: tuple[str, ...] = ()
    worker: str = "separate"

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.steps

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> BenchConfig:
        """Validate every knob in `env` (host work only: nothing here touches a device)."""
        unknown = sorted(k for k in env if k in _KNOB_TYPOS)
        if unknown:
            raise ConfigError(
                f"{unknown[0]} is not a knob: did you mean {_KNOB_TYPOS[unknown[0]]}?"
            )
        chosen = preset(env.get("PRESET", "cpu-tiny").strip() or "cpu-tiny")
        micro_steps = _integer(env, "MICRO_STEPS", chosen.micro_steps, 1)
        steps = _integer(env, "STEPS", 5, 1)
        warmup = _integer(env, "WARMUP_STEPS", 1, 1)
        return cls(
            preset=chosen,
            steps=steps,
            warmup_steps=warmup,
            micro_steps=micro_steps,
            distinct_micro_batches=_integer(env, "DISTINCT_MICRO_BATCHES", micro_steps + 1, 1),
            stage=StageConfig.from_env(env),
            profile_steps=_profile_steps(env, warmup + steps),
            results_dir=Path(env.get("RESULTS_DIR", "").strip() or "bench_results"),
            routing_profile=env.get("ROUTING_PROFILE", "").strip() or None,
            seed=_integer(env, "SEED", 0, None),
            trainer_argv=_argv(env, "TRAINER_ARGV"),
            engine_flags=_argv(env, "ENGINE_FLAGS"),
            orch_argv=_argv(env, "ORCH_ARGV"),
            worker=_choice(env, "WORKER", WORKER_CHOICES, "separate"),
        )

    def describe(self) -> dict[str, str]:
        """The configuration as the driver logs it at start: knob -> value."""
        profile = "-" if self.profile_steps is None else "{}:{}".format(*self.profile_steps)
        return {
            "PRESET": self.preset.name,
            "STEPS": str(self.steps),
            "WARMUP_STEPS": str(self.warmup_steps),
            "MICRO_STEPS": str(self.micro_steps),
            "DISTINCT_MICRO_BATCHES": str(self.distinct_micro_batches),
            "STAGE": self.stage.describe(),
            "PROFILE_STEPS": profile,
            "RESULTS_DIR": str(self.results_dir),
            "ROUTING_PROFILE": self.routing_profile or "-",
            "SEED": str(self.seed),
            "TRAINER_ARGV": shlex.join(self.trainer_argv) or "-",
            "ENGINE_FLAGS": shlex.join(self.engine_flags) or "-",
            "ORCH_ARGV": shlex.join(self.orch_argv) or "-",
            "WORKER": self.worker,
        }


# Near-miss spellings users type for knobs; a typo that silently does nothing costs a pod run.
_KNOB_TYPOS: Mapping[str, str] = {
    "STAGE_BEFORE_UPDATES": "STAGE_BEFORE_UPDATE",
    "STAGE_AFTER_UPDATES": "STAGE_AFTER_UPDATE",
    "MICROSTEPS": "MICRO_STEPS",
    "PROFILE_STEP": "PROFILE_STEPS",
    "RESULT_DIR": "RESULTS_DIR",
}


def _profile_steps(env: Mapping[str, str], total_steps: int) -> tuple[int, int] | None:
    text = env.get("PROFILE_STEPS", "").strip()
    if not text:
        return None
    first, sep, last = text.partition(":")
    try:
        window = (int(first), int(last if sep else first))
    except ValueError:
        raise ConfigError(f"PROFILE_STEPS={text!r} is not a:b: e.g. PROFILE_STEPS=2:3") from None
    if not 0 <= window[0] <= window[1] < total_steps:
        raise ConfigError(
            f"PROFILE_STEPS={text!r} is outside the run: steps are 0..{total_steps - 1}"
            " (warm-up first)"
        )
    return window
