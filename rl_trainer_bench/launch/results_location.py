"""Where the trainer writes its outputs, so the bench's results can go there and outlive the pod.

A launcher gives its trainer an output location that survives the pod: a `gs://` folder in a flag
(Tunix's `--maxtext_output_directory`, MaxText's `base_output_directory` key) or a persistent
volume mounted in the client container. The renderer points RESULTS_URI under it
(`<location>/rl-trainer-bench/<bench name>`), unless the RESULTS_URI knob says otherwise; a
location that dies with the pod (an emptyDir, a path on the pod's own disk) is not one. A local
RESULTS_URI, whoever set it, must lie on such a durable mount of the client container
(`check_durable`): a path nothing durable is mounted on looks like a destination in the plan and
goes with the pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rl_trainer_bench.bench.results_copy import FOLLOW_SECONDS
from rl_trainer_bench.config.engine_keys import CommandLine
from rl_trainer_bench.config.knobs import GCS_PREFIX
from rl_trainer_bench.config.trainer_maxtext import maxtext_keys
from rl_trainer_bench.errors import UserError

# Trainer flags and MaxText keys that name the run's output folder, in the order they are trusted.
OUTPUT_FLAGS = ("maxtext_output_directory", "base_output_directory", "output_dir")
OUTPUT_KEYS = ("base_output_directory",)
# Pod volume kinds whose data outlive the pod.
DURABLE_VOLUMES = ("persistentVolumeClaim", "csi", "nfs", "gcePersistentDisk")
SUBFOLDER = "rl-trainer-bench"


def trainer_output(
    trainer: CommandLine, container: Mapping, volumes: Sequence[Mapping]
) -> tuple[str, str] | None:
    """(location, what named it) of the trainer's durable output folder, or None.

    `trainer` is its command as TRAINER_ARGV carries it, read; `container` the client container
    and `volumes` its pod's volumes."""
    flags = trainer.flags
    keys = dict(maxtext_keys(trainer.environment, flags))
    named = [(flags.get(flag), f"the trainer's --{flag}") for flag in OUTPUT_FLAGS]
    named += [(keys.get(key), f"the trainer's MaxText key {key}") for key in OUTPUT_KEYS]
    mounts = _durable_mounts(container, volumes)
    for value, source in named:
        if value and (value.startswith(GCS_PREFIX) or _under(value, mounts)):
            return value.rstrip("/"), source
    if mounts:
        path, name = mounts[0]
        return path.rstrip("/"), f"the client container's mount of volume {name}"
    return None


def check_durable(uri: str, container: Mapping, volumes: Sequence[Mapping]) -> None:
    """UserError unless RESULTS_URI `uri` outlives the pod: a gs:// folder, or a path under a
    writable mount of a durable volume in the client `container` (`volumes`: its pod's)."""
    mounts = _durable_mounts(container, volumes)
    if uri.startswith(GCS_PREFIX) or _under(uri, mounts):
        return
    held = ", ".join(f"{path} (volume {name})" for path, name in mounts)
    where = f"its durable mounts are {held}" if held else "it mounts no durable volume"
    raise UserError(
        f"RESULTS_URI={uri}: no durable volume of the client container {container.get('name')}"
        f" is mounted there ({where}; durable: {', '.join(DURABLE_VOLUMES)}), so the results"
        " would go with the pod: set RESULTS_URI to a gs:// folder or a path on a durable mount"
    )


def _durable_mounts(container: Mapping, volumes: Sequence[Mapping]) -> list[tuple[str, str]]:
    """(mountPath, volume name) of the client container's writable mounts of durable volumes."""
    durable = {
        str(v.get("name"))
        for v in volumes
        if isinstance(v, Mapping) and any(kind in v for kind in DURABLE_VOLUMES)
    }
    return [
        (str(m["mountPath"]), str(m["name"]))
        for m in container.get("volumeMounts") or []
        if isinstance(m, Mapping)
        and m.get("name") in durable
        and m.get("mountPath")
        and not m.get("readOnly")
    ]


def _under(path: str, mounts: list[tuple[str, str]]) -> bool:
    return any(path == mount or path.startswith(mount.rstrip("/") + "/") for mount, _ in mounts)


def results_uri(location: str, bench_name: str) -> str:
    return f"{location}/{SUBFOLDER}/{bench_name}"


# Kubernetes' terminationGracePeriodSeconds when a pod sets none.
DEFAULT_GRACE_SECONDS = 30


def preemption_line(pod: Mapping) -> str:
    """What a preemption of the client's pod (`pod`: its spec) keeps: SIGTERM reaches the run,
    which stops after the step in flight, and SIGKILL follows after the grace period."""
    grace = pod.get("terminationGracePeriodSeconds")
    said = (
        f"{grace} s (the trainer's)"
        if grace is not None
        else f"{DEFAULT_GRACE_SECONDS} s (Kubernetes' default: the trainer's pod sets none)"
    )
    return (
        f"on preemption, each step that ended is copied within {FOLLOW_SECONDS:g} s of ending,"
        f" also during the grace period; the pod's grace period is {said}: SIGTERM stops the run"
        " at the end of the step in flight, which is kept only if that step and the final copy"
        " end within it"
    )
