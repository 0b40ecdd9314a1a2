"""Where each engine value the trainer did not set comes from: the preset, or the engine's default.

The bench times the trainer's cell: the trainer's flags, its MaxText keys and ENGINE_FLAGS set
engine keys, and every other key keeps the preset's value, which is either one the preset chose
(for the 397B cell: the measured run's MoE buffers, the public recipe's `mu_dtype`) or the
engine's own default (`retry_when_tokens_dropped=true`). A reader comparing the bench with the
trainer needs to see each of those values and its source, not only the keys the trainer set, so
the plan and `config-diff` list them. Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rl_trainer_bench.config import trainer_maxtext
from rl_trainer_bench.config.engine_keys import ENGINE_KEYS, command_line, engine_flags_of
from rl_trainer_bench.config.presets import Preset
from rl_trainer_bench.engine.config import EngineConfig, value_at

PRESET = "preset"
ENGINE_DEFAULT = "engine default"


@dataclasses.dataclass(frozen=True)
class ValueSource:
    """An engine key nobody set for this run, its value and where the value comes from."""

    key: str
    value: str
    source: str  # PRESET or ENGINE_DEFAULT
    why: str = ""  # the preset's reason, where it gives one

    def describe(self) -> str:
        return f"{self.key}={self.value}" + (f" ({self.why})" if self.why else "")


def shown(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def given_targets(trainer_argv: str | Sequence[str], engine_flags: str | Sequence[str]) -> set[str]:
    """The EngineConfig fields the trainer's command or ENGINE_FLAGS set (as `engine_config_from`
    applies them: a trainer that sets one mesh axis sets the whole mesh)."""
    trainer = command_line(trainer_argv)
    keys = set(trainer.flags) | set(engine_flags_of(engine_flags).given)
    for fate in trainer_maxtext.engine_assignments(
        trainer_maxtext.maxtext_keys(trainer.environment, trainer.flags)
    ):
        if fate.engine_key:
            keys.add(fate.engine_key)
    targets = {ENGINE_KEYS[key].target for key in keys if key in ENGINE_KEYS}
    if any(target.startswith("mesh.") for target in targets):
        targets |= {spec.target for spec in ENGINE_KEYS.values() if spec.target.startswith("mesh.")}
    return targets


def unset_values(
    preset: Preset,
    engine: EngineConfig,
    trainer_argv: str | Sequence[str] = (),
    engine_flags: str | Sequence[str] = (),
) -> list[ValueSource]:
    """Every engine key that neither the trainer's command nor ENGINE_FLAGS set, with the value
    `engine` runs and its source, in the order of the engine's keys."""
    given = given_targets(trainer_argv, engine_flags)
    reasons = dict(preset.value_reasons)
    found: dict[str, ValueSource] = {}
    for key, spec in ENGINE_KEYS.items():
        if spec.target in given or spec.target in found or " " in spec.target:
            continue  # set for this run, listed already, or not one field (seq_len's two keys)
        value = shown(value_at(engine, spec.target))
        source = ENGINE_DEFAULT if value == spec.default else PRESET
        why = reasons.get(key, "") if source == PRESET else ""  # a reason for the preset's value
        found[spec.target] = ValueSource(key, value, source, why)
    return list(found.values())
