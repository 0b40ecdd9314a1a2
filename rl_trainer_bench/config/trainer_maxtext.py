"""The trainer's MaxText keys: read from its command, mapped onto the built-in engine's keys.

A Tunix trainer on the MaxText backend builds MaxText's config from its flags, then applies the
space-separated `key=value` words of `MAXTEXT_EXTRA_FLAGS` from its environment last (last wins).
Launchers set that variable, and a few others Tunix reads, as `NAME=value` words before the
trainer's `python` command. Those keys shape the cell the bench must time (expert buffer factor,
token chunks, remat, Adam's moment dtype), so every one is read here, in the order Tunix applies
it, and each gets a fate: applied (as which engine key), no equivalent in the built-in engine, or
overridden (by a later trainer key or by ENGINE_FLAGS). Nothing the trainer sets is dropped
without a word. Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

from rl_trainer_bench.config import values
from rl_trainer_bench.errors import ConfigError

EXTRA_FLAGS_VARIABLE = "MAXTEXT_EXTRA_FLAGS"

# Trainer-command variables that set one MaxText key each (Tunix reads TRAINER_MAXTEXT_ATTENTION
# and FLOAT32_*; REMAT_POLICY and NUM_MOE_TOKEN_CHUNKS are the launchers' names for theirs).
VARIABLE_KEYS: Mapping[str, str] = {
    "TRAINER_MAXTEXT_ATTENTION": "attention",
    "REMAT_POLICY": "remat_policy",
    "NUM_MOE_TOKEN_CHUNKS": "num_moe_token_chunks",
    "FLOAT32_GATE_LOGITS": "float32_gate_logits",
    "FLOAT32_LOGITS": "float32_logits",
}
CARRYING_VARIABLES = (*VARIABLE_KEYS, EXTRA_FLAGS_VARIABLE)
# An ENGINE_FLAGS key `maxtext.KEY` sets MaxText key KEY after the trainer's (config/engine_keys.py).
FLAG_PREFIX = "maxtext"
FROM_FLAGS = "set by ENGINE_FLAGS"

# Trainer flags Tunix hands to MaxText as a MaxText key (a flag wins over its variable).
FLAG_KEYS: Mapping[str, str] = {
    "maxtext_attention": "attention",
    "remat_policy": "remat_policy",
    "prefuse_moe_weights": "prefuse_moe_weights",
}
# Of those, the boolean flags: Tunix's argparse reads `yes` or `1` and hands MaxText the boolean.
BOOLEAN_FLAGS = frozenset({"prefuse_moe_weights"})

# MaxText keys the built-in engine applies under the same meaning: MaxText key -> engine key.
SAME_MEANING: Mapping[str, str] = {
    "ragged_buffer_factor": "ragged_buffer_factor",
    "num_moe_token_chunks": "num_moe_token_chunks",
    "retry_when_tokens_dropped": "retry_when_tokens_dropped",
    "mu_dtype": "mu_dtype",
    "optimizer_memory_host_offload": "optimizer_memory_host_offload",
    "prefuse_moe_weights": "prefuse_moe_weights",
    "scan_layers": "scan_layers",
}
# MaxText keys the built-in engine applies by name, not by meaning: what each does in the built-in
# engine against what it does in MaxText (MaxText's layers/moe.py; docs/maxtext.md, MaxText's
# buffer).
OTHER_MEANING: Mapping[str, str] = {
    "ragged_buffer_factor": (
        "built-in engine: ceil(factor x tokens x top_k / experts) slots per expert per group of"
        " tokens; MaxText: one buffer of factor x a device's tokens x top_k rows per"
        " expert-parallel shard, shared by its experts"
    ),
    "num_moe_token_chunks": (
        "built-in engine: each device's tokens in this many groups, each with its own buffers;"
        " MaxText: chunks only on its ring of experts (use_ring_of_experts=true)"
    ),
}
_RING_KEY = "use_ring_of_experts"
# The MaxText keys the built-in engine can apply (remat_policy: full, minimal, or a custom policy
# that keeps nothing but the layer input).
APPLICABLE = (*SAME_MEANING, "remat_policy")
# Remat policies the engine has by the same name (MaxText's full and minimal; none for a trainer
# argv written for the engine).
_REMAT_POLICIES = ("full", "minimal", "none")
# MaxText's per-tensor remat choices under remat_policy=custom.
_TENSOR_POLICIES = ("remat", "device", "offload")
_LAYER_INPUT = "decoder_layer_input"

APPLIED = "applied"
NO_EQUIVALENT = "no equivalent"
OVERRIDDEN_LATER = "overridden by a later trainer key"
OVERRIDDEN_BY_FLAGS = "overridden by ENGINE_FLAGS"
# On MaxText's engine the keys go to MaxText itself, last, except the ones the bench holds.
PASSED = "passed to MaxText"
HELD = "held by the bench"
FATES = (APPLIED, PASSED, NO_EQUIVALENT, OVERRIDDEN_LATER, OVERRIDDEN_BY_FLAGS, HELD)


@dataclasses.dataclass(frozen=True)
class TrainerKey:
    """One MaxText key of the trainer's command, what the engine makes of it, and why."""

    key: str
    value: str
    fate: str  # APPLIED | NO_EQUIVALENT | OVERRIDDEN_LATER | OVERRIDDEN_BY_FLAGS
    engine_key: str = ""  # the engine key it sets (empty when none)
    engine_value: str = ""
    note: str = ""
    # How the engine's meaning of an applied key differs from MaxText's ('' when it is the same).
    other_meaning: str = ""

    def describe(self) -> str:
        """`ragged_buffer_factor=2.0: applied (ragged_buffer_factor=2.0)`, or `applied with
        another meaning (...)` where the engine applies the key under a meaning of its own."""
        target = f"{self.engine_key}={self.engine_value}" if self.engine_key else ""
        meaning = self.other_meaning if self.fate == APPLIED else ""
        detail = "; ".join(part for part in (target, meaning, self.note) if part)
        fate = f"{self.fate} with another meaning" if meaning else self.fate
        return f"{self.key}={self.value}: {fate}" + (f" ({detail})" if detail else "")


def maxtext_keys(
    environment: Mapping[str, str], flags: Mapping[str, str]
) -> tuple[tuple[str, str], ...]:
    """The trainer's MaxText keys in the order Tunix applies them: its flags' and variables' keys,
    then MAXTEXT_EXTRA_FLAGS' words; ((key, value text), ...). ConfigError for a word without `=`.
    """
    keys: list[tuple[str, str]] = []
    from_flags = {
        FLAG_KEYS[flag]: _as_tunix_reads(flag, flags[flag]) for flag in FLAG_KEYS if flag in flags
    }
    for variable, key in VARIABLE_KEYS.items():
        if key in from_flags:
            continue
        if environment.get(variable, "").strip():
            keys.append((key, environment[variable].strip()))
    keys += list(from_flags.items())
    for word in environment.get(EXTRA_FLAGS_VARIABLE, "").split():
        key, has_value, value = word.partition("=")
        if not has_value or not key:
            raise ConfigError(
                f"{EXTRA_FLAGS_VARIABLE}: {word!r} is not key=value; Tunix refuses it too: write"
                f" each MaxText key as key=value{_without_dashes(key)}"
            )
        keys.append((key, value))
    return tuple(keys)


def _as_tunix_reads(flag: str, value: str) -> str:
    """A flag's value as Tunix hands it to MaxText: a boolean flag's `yes` as `true` (text no
    boolean word names stays as written, for its fate to refuse)."""
    boolean = values.boolean_word(value) if flag in BOOLEAN_FLAGS else None
    return value if boolean is None else str(boolean).lower()


def engine_assignments(keys: Sequence[tuple[str, str]]) -> list[TrainerKey]:
    """Each trainer key's fate before ENGINE_FLAGS: applied (as which engine key) or not, a key
    that a later one sets again being overridden, as in MaxText, where the last one wins."""
    fates = [_fate(key, value, keys) for key, value in keys]
    last = {fate.engine_key: index for index, fate in enumerate(fates) if fate.engine_key}
    return [
        dataclasses.replace(fate, fate=OVERRIDDEN_LATER)
        if fate.engine_key and last[fate.engine_key] != index
        else fate
        for index, fate in enumerate(fates)
    ]


def _fate(key: str, value: str, keys: Sequence[tuple[str, str]]) -> TrainerKey:
    if key in SAME_MEANING:
        meaning = other_meaning(key, value, keys)
        return TrainerKey(key, value, APPLIED, SAME_MEANING[key], value, other_meaning=meaning)
    if key == "remat_policy":
        return _remat_fate(value, keys)
    if value.lower() in _TENSOR_POLICIES and _custom_remat(keys):
        held = _held_tensors(keys)
        note = "part of remat_policy=custom" + ("" if held else ", which the engine runs as full")
        return TrainerKey(key, value, NO_EQUIVALENT if held else APPLIED, note=note)
    return TrainerKey(key, value, NO_EQUIVALENT, note=_without_dashes(key, value).lstrip("; "))


def other_meaning(key: str, value: str, keys: Sequence[tuple[str, str]]) -> str:
    """How the built-in engine's meaning of `key=value` differs from MaxText's, the trainer's
    MaxText keys being `keys` ('' when it does not: a dropless factor, one chunk); chunks say
    whether the trainer's MaxText runs its ring. Also for a preset's value the engine applies."""
    if key not in OTHER_MEANING or _number(value) is None:
        return ""
    if key == "ragged_buffer_factor":  # at or below 0, dropless in both engines
        return OTHER_MEANING[key] if _number(value) > 0 else ""
    if _number(value) <= 1:
        return ""
    chunks_there = (
        "on in the trainer's keys: each chunk fills the shards' buffers alone"
        if _ring(keys)
        else "off in the trainer's keys: there the key does nothing"
    )
    return f"{OTHER_MEANING[key]}, {chunks_there}"


def idle_in_maxtext(key: str, value: str, keys: Sequence[tuple[str, str]]) -> str:
    """Why MaxText does nothing with `key=value` under these trainer keys ('' when it acts on
    it): token chunks without its ring of experts."""
    number = _number(value)
    if key != "num_moe_token_chunks" or number is None or number <= 1 or _ring(keys):
        return ""
    return (
        f"maxtext 0.2.5 chunks tokens only in its ring of experts ({_RING_KEY}=true) and refuses"
        " the key without it; other releases differ: the image's MaxText decides, and its own"
        " validation of the config runs in the pod before the runtime starts"
    )


def _ring(keys: Sequence[tuple[str, str]]) -> bool:
    return [value.lower() for name, value in keys if name == _RING_KEY][-1:] == ["true"]


def _number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None  # the engine refuses it with its own message


def _without_dashes(key: str, value: str = "") -> str:
    """A hint for a key written as a flag (`--remat_policy=full`): MaxText's keys are bare
    `key=value` words, so the dashes make it a key no one reads."""
    if not key.startswith("-") or not key.lstrip("-"):
        return ""
    bare = key.lstrip("-") + (f"={value}" if value else "=...")
    return f"; MaxText keys are written without '--': did you mean {bare}?"


def _remat_fate(value: str, keys: Sequence[tuple[str, str]]) -> TrainerKey:
    if value in _REMAT_POLICIES:
        return TrainerKey("remat_policy", value, APPLIED, "remat_policy", value)
    if value != "custom":
        return TrainerKey(
            "remat_policy", value, NO_EQUIVALENT, note="the engine has full, minimal, none"
        )
    held = _held_tensors(keys)
    if held:
        return TrainerKey(
            "remat_policy",
            value,
            NO_EQUIVALENT,
            note=f"keeps {', '.join(held)} for the backward pass, which no engine policy does",
        )
    return TrainerKey(
        "remat_policy",
        value,
        APPLIED,
        "remat_policy",
        "full",
        "every tensor rematerialized and the layer input kept on the device: the engine's full",
    )


def _custom_remat(keys: Sequence[tuple[str, str]]) -> bool:
    return [value for key, value in keys if key == "remat_policy"][-1:] == ["custom"]


def _held_tensors(keys: Sequence[tuple[str, str]]) -> list[str]:
    """Tensors a custom policy keeps (on the device or offloaded) beyond the engine's full: all
    but the layer input on the device, which full keeps too."""
    policies = {key: value.lower() for key, value in keys if value.lower() in _TENSOR_POLICIES}
    return [
        f"{key}={policy}"
        for key, policy in policies.items()
        if policy != "remat" and (key, policy) != (_LAYER_INPUT, "device")
    ]


def maxtext_fates(keys: Sequence[tuple[str, str]], held: Collection[str]) -> list[TrainerKey]:
    """Each trainer key's fate on MaxText's engine: passed to MaxText unchanged, in order (a key
    set again later is overridden, as MaxText keeps the last), or held by the bench (`held`:
    where MaxText writes, loads and traces; `engine/maxtext/keys.py`)."""
    last = {key: index for index, (key, _) in enumerate(keys)}
    return [
        TrainerKey(
            key, value, HELD if key in held else PASSED, note=idle_in_maxtext(key, value, keys)
        )
        if last[key] == index
        else TrainerKey(key, value, OVERRIDDEN_LATER)
        for index, (key, value) in enumerate(keys)
    ]


def marked_from_flags(fates: Sequence[TrainerKey], count: int) -> list[TrainerKey]:
    """`fates` with the last `count` (the ENGINE_FLAGS `maxtext.KEY` words) noted as set there."""
    first = len(fates) - count
    return [
        dataclasses.replace(f, note="; ".join(p for p in (f.note, FROM_FLAGS) if p))
        if index >= first
        else f
        for index, f in enumerate(fates)
    ]
