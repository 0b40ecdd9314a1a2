"""The trainer's MaxText keys checked before launch, by the MaxText that will run them.

MaxText validates its config when it builds it, which in a run is after the pod has started and
the runtime has come up; a key the image's MaxText refuses (maxtext 0.2.5 has no
`retry_when_tokens_dropped`) would then cost a pod start and end in a banner of log lines. The
plan builds the same config the adapter builds (`engine/maxtext/keys.py`: the table's keys, the
platform's, the held ones, then the trainer's keys last) through MaxText's own validation, with
no device, wherever MaxText is importable: in the pod (its plan runs before the runtime starts)
and in `run --plan` on a host with MaxText. A refusal is one line naming the key and MaxText's
version. The renderer's host is not the trainer's image, so there the plan says the check runs
in the pod. A refusal names the MaxText that refused as this host's (in the pod, the image's) and
whose keys it refused: the trainer's (its MAXTEXT_EXTRA_FLAGS and variables) or the `maxtext.KEY`
words of ENGINE_FLAGS, where an A/B arm's keys go.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rl_trainer_bench.config.trainer_maxtext import EXTRA_FLAGS_VARIABLE
from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.maxtext import config as maxtext_config
from rl_trainer_bench.engine.maxtext import keys as maxtext_keys
from rl_trainer_bench.errors import ConfigError

_ACCEPTED, _REFUSED = "accepted", "refused"  # the child's verdict, first word of its last line
IN_THE_POD = (
    "checked in the pod, before the runtime starts: the trainer's image's MaxText builds its"
    " config from the trainer's keys with its own validation"
)


@dataclasses.dataclass(frozen=True)
class ConfigBuilder:
    """How a MaxText builds its config: the installed one, or a stand-in in tests."""

    version: str
    model_config: Callable[[str], Mapping[str, Any]]
    build: Callable[[Sequence[str]], Any]
    refused: type[Exception]  # what `build` raises for words MaxText refuses


def installed_builder() -> ConfigBuilder | None:
    """The MaxText of this environment, or None where it is not importable."""
    if not maxtext_config.importable():
        return None
    return ConfigBuilder(
        maxtext_config.installed_version(),
        maxtext_config.shipped_model_config,
        maxtext_config.build_config,
        maxtext_config.MaxTextRefused,
    )


def check_apart(engine: EngineConfig, platform: str, flag_keys: int = 0) -> str:
    """`check_trainer_keys` with the installed MaxText, in a child process on the CPU.

    MaxText's config reads the JAX devices, and the first read starts JAX's backend: in the
    plan's own process that would start it before the run's runtime does (before
    `jax.distributed`, before the small presets' forced CPU device count), so the check runs in
    a child that shows MaxText as many CPU devices as the mesh has and writes only into a
    temporary folder. Its refusal comes back as the ConfigError it raised there. `flag_keys`:
    how many of the engine's last `trainer_maxtext_keys` ENGINE_FLAGS set (`check_trainer_keys`).
    """
    environment = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={engine.mesh.size}",
        "PYTHONPATH": os.pathsep.join(path for path in sys.path if path),
    }
    child = subprocess.run(
        [sys.executable, "-m", __name__],
        input=pickle.dumps((engine, platform, flag_keys)),
        env=environment,
        capture_output=True,
        check=False,
    )
    lines = child.stdout.decode(errors="replace").splitlines()
    if child.returncode != 0 or not lines:
        tail = " ".join(child.stderr.decode(errors="replace").split()[-40:])
        raise ConfigError(
            f"the check of MaxText's config did not finish (exit {child.returncode}): {tail}"
        )
    verdict, _, text = lines[-1].partition(" ")
    if verdict != _ACCEPTED:
        raise ConfigError(text)
    return text


def _check_here() -> None:
    """The child's side of `check_apart`: (engine, platform, flag_keys) pickled on stdin, one
    line out."""
    engine, platform, flag_keys = pickle.loads(sys.stdin.buffer.read())
    builder = installed_builder()
    if builder is None:
        print(f"{_REFUSED} MaxText is not importable in the check's process")
        return
    with tempfile.TemporaryDirectory(prefix="rl-trainer-bench-maxtext-check-") as folder:
        try:
            checked = check_trainer_keys(engine, platform, folder, builder, flag_keys)
            print(f"{_ACCEPTED} {checked}")
        except ConfigError as error:
            print(f"{_REFUSED} {error}")


def check_trainer_keys(
    engine: EngineConfig,
    platform: str,
    output_dir: str,
    builder: ConfigBuilder,
    flag_keys: int = 0,
) -> str:
    """MaxText's config for `engine` built by `builder`; what was checked, or ConfigError naming
    every trainer key MaxText refuses (or the bench's own translation, when that is refused).

    The last `flag_keys` of `engine.trainer_maxtext_keys` are ENGINE_FLAGS' `maxtext.KEY` words
    (an A/B arm's among them), not the trainer's: a refusal names them apart, since the trainer's
    own command is not what set them."""
    try:
        model = maxtext_keys.maxtext_model(engine)
        args = maxtext_keys.maxtext_args(
            engine,
            builder.model_config(model.name),
            output_dir,
            maxtext_keys.platform_keys(engine, platform),
        )
    except maxtext_keys.NotTaken as why:
        raise ConfigError(f"ENGINE=...maxtext.adapter:MaxTextEngine: {why}") from None
    if maxtext_config.refusal(builder.build, builder.refused, args.words) is None:
        return (
            f"maxtext {builder.version} built its config from {len(args.words)} keys (the trainer's"
            f" {len(args.trainer_words)} last) with its own validation, on no device: accepted"
        )
    refused, message = maxtext_config.refused_trainer_keys(
        builder.build, builder.refused, args.words, args.trainer_words
    )
    keys = engine.trainer_maxtext_keys
    set_by_flags = {f"{key}={text}" for key, text in keys[len(keys) - flag_keys :]}
    trainers = {w: why for w, why in refused.items() if w not in set_by_flags}
    flags = {w: why for w, why in refused.items() if w not in trainers}
    problems = []
    if trainers:
        problems.append(
            f"{len(trainers)} of the trainer's MaxText keys: {_reasons(trainers)} (a trainer on"
            f" this maxtext would refuse {EXTRA_FLAGS_VARIABLE} as written too: drop them, or run"
            " the MaxText that takes them)"
        )
    if flags:
        problems.append(
            f"{len(flags)} of the MaxText keys set as maxtext.KEY in ENGINE_FLAGS (where an A/B"
            f" arm's keys go), not the trainer's: {_reasons(flags)} (drop them, or plan where the"
            " MaxText that takes them is installed; the pod checks them with the trainer's"
            " image's MaxText)"
        )
    if message is not None:
        problems.append(
            f"the config the bench builds for this cell, whichever trainer key is left out"
            f" ({message}: set the engine keys it names through ENGINE_FLAGS, or another PRESET)"
        )
    raise ConfigError(f"this host's maxtext {builder.version} refuses {'; and '.join(problems)}")


def _reasons(refused: Mapping[str, str]) -> str:
    return "; ".join(f"{word} ({why})" for word, why in refused.items())


if __name__ == "__main__":
    _check_here()
