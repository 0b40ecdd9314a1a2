"""The trainer's environment variables, each with its fate in the bench.

Launchers steer the trainer through environment variables as much as through flags: some carry
MaxText keys (`trainer_maxtext`), some set libtpu or XLA flags, some change the trainer's program
in ways only its own code knows (`TUNIX_LOGPS_SHARDED_HEAD`), and many only concern the parts of
the RL run the bench leaves out (weight transfer to the rollout engines, checkpoints, metrics).
The renderer names the variables the trainer's launcher set (`TRAINER_ENV_VARIABLE`), and the plan
gives each one a fate from the table below; a variable the table does not know is listed as such,
so none changes the trainer's program without a word. Plumbing (Kubernetes, the JAX runtime's
addresses, Python's own) is counted, not listed. Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from rl_trainer_bench.config.trainer_maxtext import CARRYING_VARIABLES

# Set by the renderer: the names of the variables the trainer's launcher set (its script's and its
# client container's literal `env`), space-separated.
TRAINER_ENV_VARIABLE = "BENCH_TRAINER_ENV"
_SHOWN = 64  # characters of a value a plan line shows (LIBTPU_INIT_ARGS runs to a thousand)

CARRIES_KEYS = "carries MaxText keys"
IN_ENVIRONMENT = "applied"
IN_TUNIX = "checked in the pod"
MATCHES = "matches the engine"
NOT_REPRODUCED = "not reproduced"
OFF_THE_STEP = "outside the timed step"
PLUMBING = "runtime plumbing"
UNKNOWN = "not known to the bench"
ENV_FATES = (
    CARRIES_KEYS,
    IN_ENVIRONMENT,
    IN_TUNIX,
    MATCHES,
    NOT_REPRODUCED,
    OFF_THE_STEP,
    UNKNOWN,
    PLUMBING,
)

_ROLLOUT = "the rollout engines' settings: the bench runs no rollout"
_WEIGHT_SYNC = "weight transfer to the rollout engines, after the step the bench times"
_CHECKPOINT = "checkpointing, which the bench does not do"

# Variables the trainer's Tunix reads inside the loss, where MaxText's engine runs under Tunix's
# driver (the pod exports them, and the image's Tunix decides): why, for the IN_TUNIX fate.
READ_BY_TUNIX: Mapping[str, str] = {
    "TUNIX_LOGPS_SHARDED_HEAD": (
        "the output head of Tunix's chunked log-prob pass: the pod exports it, and the image's"
        " Tunix runs that pass in the loss and reads it where it has that head; the engine's info"
        " says whether it does (logps_sharded_head) and whether the pass ran (chunked_logps)"
    ),
}

# Variables by name: (fate, why). Engine-key equivalents are in ENGINE_EQUIVALENTS.
KNOWN: Mapping[str, tuple[str, str]] = {
    "LIBTPU_INIT_ARGS": (
        IN_ENVIRONMENT,
        "the pod exports it; the render's libtpu lines show each compiling container's flags",
    ),
    "XLA_FLAGS": (IN_ENVIRONMENT, "the pod exports it"),
    "TUNIX_LOGPS_SHARDED_HEAD": (
        NOT_REPRODUCED,
        "chooses the output head of Tunix's chunked log-prob pass; this engine has no such pass:"
        " the built-in engine computes log-probs on each device's own tokens with the head"
        " gathered once per device (engine/builtin/loss.py), and MaxText's engine scores with MaxText's"
        " own loss under MAXTEXT_DRIVER=maxtext",
    ),
    "PREFUSE_MOE_WEIGHTS": (
        NOT_REPRODUCED,
        "MaxText's prefuse_moe_weights fuses the experts' gate and up kernels into one, which"
        " changes the expert matmuls; the trainer's --prefuse_moe_weights flag sets it for"
        " either engine (a trainer MaxText key), this variable for neither",
    ),
    "TRAINER_PREFUSE_MOE_WEIGHTS": (
        NOT_REPRODUCED,
        "the trainer's prefuse_moe_weights (see PREFUSE_MOE_WEIGHTS)",
    ),
    "USE_WEIGHT_CONVERTER": (OFF_THE_STEP, _WEIGHT_SYNC),
    "VERIFY_WEIGHTS": (OFF_THE_STEP, _WEIGHT_SYNC),
    "WEIGHT_SYNC_DISABLE_TIMEOUTS": (OFF_THE_STEP, _WEIGHT_SYNC),
    "WEIGHT_SYNC_MODE": (OFF_THE_STEP, _WEIGHT_SYNC),
    "ENABLE_PATHWAYS_PERSISTENCE": (OFF_THE_STEP, _CHECKPOINT),
    "PATHWAYS_CHECKPOINTING_IMPL": (OFF_THE_STEP, _CHECKPOINT),
    "CHECKPOINT_ASYNC": (OFF_THE_STEP, _CHECKPOINT),
    "ENABLE_PREFIX_CACHING": (OFF_THE_STEP, _ROLLOUT),
    "RETURN_ROUTED_EXPERTS": (
        OFF_THE_STEP,
        "the rollout returns its routing for router replay; the bench's micro-batches carry"
        " synthetic routed experts instead",
    ),
    "TUNIX_IS_INTERNAL_ENV": (OFF_THE_STEP, "where Tunix loads its dependencies from"),
    "SKIP_JAX_PRECOMPILE": (OFF_THE_STEP, _ROLLOUT),
}
# Prefixes of families of variables: (prefix, fate, why).
KNOWN_PREFIXES: tuple[tuple[str, str, str], ...] = (
    ("RAIDEN_", OFF_THE_STEP, _WEIGHT_SYNC),
    ("CKPT_", OFF_THE_STEP, _CHECKPOINT),
    ("ROLLOUT_", OFF_THE_STEP, _ROLLOUT),
    ("VLLM_", OFF_THE_STEP, _ROLLOUT),
    ("WANDB_", OFF_THE_STEP, "metrics logging"),
)
# Variables whose value the built-in engine has as a key: variable -> engine key.
ENGINE_EQUIVALENTS: Mapping[str, str] = {"MAX_GRAD_NORM": "max_grad_norm"}
_PLUMBING = re.compile(
    r"^(?:JAX_|TPU_|MEGASCALE_|KUBERNETES_|PYTHON|LC_|GRPC_|TF_CPP_)"
    r"|^(?:PATH|HOME|HOSTNAME|LANG|TERM|SHLVL|PWD|OLDPWD|USER|JOBSET_NAME|REPLICATED_JOB_NAME"
    r"|JOB_INDEX|POD_INDEX|JOB_COMPLETION_INDEX|HOST_ADDRESS|PATHWAYS_HEAD)$"
    r"|_SERVICE_(?:HOST|PORT.*)$|_PORT(?:_\d+_(?:TCP|UDP)(?:_\w+)?)?$"
)


@dataclasses.dataclass(frozen=True)
class EnvFate:
    """One variable of the trainer's environment and what the bench makes of it."""

    name: str
    value: str
    fate: str
    why: str = ""

    def describe(self) -> str:
        value = self.value if len(self.value) <= _SHOWN else self.value[: _SHOWN - 3] + "..."
        return f"{self.name}={value}: {self.fate}" + (f" ({self.why})" if self.why else "")


def trainer_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The variables the renderer named as the trainer's, with their values in `env`."""
    names = env.get(TRAINER_ENV_VARIABLE, "").split()
    return {name: env.get(name, "") for name in names}


def fate_of(
    name: str, value: str, engine_values: Mapping[str, str], tunix_loss: bool = False
) -> EnvFate:
    """`name`'s fate; `engine_values` are the resolved engine's values of ENGINE_EQUIVALENTS' keys
    as text, so a variable the engine has as a key is compared with what the engine runs;
    `tunix_loss`: the engine may run Tunix's loss in the pod (READ_BY_TUNIX)."""
    if tunix_loss and name in READ_BY_TUNIX:
        return EnvFate(name, value, IN_TUNIX, READ_BY_TUNIX[name])
    if name in CARRYING_VARIABLES:
        return EnvFate(name, value, CARRIES_KEYS, "each key's fate is on its trainer key line")
    if name in ENGINE_EQUIVALENTS:
        return _equivalent_fate(name, value, ENGINE_EQUIVALENTS[name], engine_values)
    if name in KNOWN:
        return EnvFate(name, value, *KNOWN[name])
    for prefix, fate, why in KNOWN_PREFIXES:
        if name.startswith(prefix):
            return EnvFate(name, value, fate, why)
    if _PLUMBING.search(name):
        return EnvFate(name, value, PLUMBING)
    return EnvFate(name, value, UNKNOWN, "the bench cannot say whether it changes the program")


def _equivalent_fate(name: str, value: str, key: str, engine_values: Mapping[str, str]) -> EnvFate:
    runs = engine_values.get(key, "")
    try:
        same = float(runs) == float(value)
    except ValueError:
        same = runs == value
    if same:
        return EnvFate(name, value, MATCHES, f"the engine runs {key}={runs}")
    return EnvFate(
        name,
        value,
        NOT_REPRODUCED,
        f"the engine runs {key}={runs}; {key}={value} in ENGINE_FLAGS would match it",
    )


def environment_fates(
    env: Mapping[str, str], engine_values: Mapping[str, str], tunix_loss: bool = False
) -> list[EnvFate]:
    """The fate of every variable the renderer named as the trainer's, in the launcher's order."""
    return [
        fate_of(name, value, engine_values, tunix_loss)
        for name, value in trainer_variables(env).items()
    ]
