"""libtpu flags where compiling happens: the client, and under Pathways the proxy and the workers.

A flag in `LIBTPU_INIT_ARGS` changes the program only in a process that compiles or runs it. In a
plain JAX trainer that is the client; under Pathways the client hands its programs to the proxy,
which compiles them, and the workers run them on the TPUs; the public recipes give those two their
XLA flags as container arguments (xpk's `--custom-pathways-proxy-server-args` and
`--custom-pathways-worker-args`). So `LIBTPU_FLAGS` goes to every compiling container (the
client's environment, the proxy's and the workers' arguments), the render summary shows what each
container ends up with, and a launcher whose containers disagree (a flag on the client only, which
under Pathways never reaches the compiler) is named, because the bench copies that disagreement.

Containers are recognised as the launcher renders them: the client is the one python container
(`dry_run.client_container`); among the Pathways containers, the one started with
`--node_type=resource_manager` manages resources and compiles nothing, those asking for TPUs are
workers, and one whose name or image says `proxy` is the proxy.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Iterator, Mapping

from rl_trainer_bench.launch.client_command import merge_flags
from rl_trainer_bench.launch.dry_run import (
    TPU_RESOURCE,
    client_location,
    containers,
    is_pathways_container,
    literal_env,
    replicated_jobs,
)

CLIENT, PROXY, WORKER = "client", "proxy", "worker"
RESOURCE_MANAGER_ARG = "--node_type=resource_manager"
ENV_NAME = "LIBTPU_INIT_ARGS"


@dataclasses.dataclass(frozen=True)
class CompilingContainer:
    """One container that compiles or runs the trainer's programs, and the flags it has."""

    job: str  # the replicated job's name
    name: str
    role: str  # CLIENT, PROXY or WORKER
    flags: tuple[str, ...]  # its libtpu/XLA flags, `--name[=value]` words

    @property
    def carrier(self) -> str:
        """How it takes its flags: the client in its environment, Pathways servers as arguments."""
        return ENV_NAME if self.role == CLIENT else "args"

    def describe(self) -> str:
        shown = " ".join(self.flags) or "none"
        return f"{self.name} ({self.role}, {self.carrier}): {shown}"


def role(container: Mapping) -> str | None:
    """CLIENT is decided by the caller; a Pathways container's role, or None (compiles nothing)."""
    if not is_pathways_container(container):
        return None
    args = [str(arg) for arg in container.get("args") or []]
    if RESOURCE_MANAGER_ARG in args:
        return None
    resources = container.get("resources") or {}
    if any(TPU_RESOURCE in (resources.get(kind) or {}) for kind in ("limits", "requests")):
        return WORKER
    said = f"{container.get('name', '')} {container.get('image', '')}".lower()
    return PROXY if "proxy" in said else None


def _is_flag(word: str) -> bool:
    return word.startswith("--") and len(word) > 2


def flag_name(word: str) -> str:
    return word.split("=", 1)[0]


def _client_flags(container: Mapping, script_env: Mapping[str, str]) -> tuple[str, ...]:
    """The client's LIBTPU_INIT_ARGS (its script's, exported or before python, over its `env`),
    split at whitespace as libtpu splits it."""
    return tuple(script_env.get(ENV_NAME, literal_env(container).get(ENV_NAME, "")).split())


def _server_flags(container: Mapping, flag_names: set[str]) -> tuple[str, ...]:
    """A Pathways server's libtpu flags: its `--xla_*` arguments and any argument that names a
    flag another compiling container carries in LIBTPU_INIT_ARGS."""
    return tuple(
        str(arg)
        for arg in container.get("args") or []
        if _is_flag(str(arg))
        and (str(arg).startswith("--xla_") or flag_name(str(arg)) in flag_names)
    )


def compiling_containers(
    jobset: Mapping, script_env: Mapping[str, str], extra_names: frozenset[str] = frozenset()
) -> list[CompilingContainer]:
    """The client, then every proxy and worker container of `jobset`, each with its flags.

    `script_env` is the client script's environment (`client_command.read_client_command`);
    `extra_names` are flag names to read from the servers' arguments besides `--xla_*` ones (the
    names LIBTPU_FLAGS sets)."""
    where = client_location(jobset)
    client_job = replicated_jobs(jobset)[where.job_index]
    client = containers(client_job)[where.container_index]
    client_flags = _client_flags(client, script_env)
    names = {flag_name(word) for word in client_flags} | set(extra_names)
    found = [
        CompilingContainer(
            str(client_job.get("name")), str(client.get("name")), CLIENT, client_flags
        )
    ]
    found += [
        CompilingContainer(
            str(job.get("name")),
            str(container.get("name")),
            str(role(container)),
            _server_flags(container, names),
        )
        for job, container in _pathways_servers(jobset)
    ]
    return found


def _pathways_servers(jobset: Mapping) -> Iterator[tuple[dict, dict]]:
    for job in replicated_jobs(jobset):
        for container in containers(job):
            if role(container) in (PROXY, WORKER):
                yield job, container


def knob_words(flags: str, knob: str = "LIBTPU_FLAGS") -> list[str]:
    """The knob's `--flag[=value]` words, each checked (`merge_flags` refuses anything else)."""
    merge_flags("", flags, knob)
    return shlex.split(flags)


def apply_to_servers(jobset: dict, words: list[str]) -> None:
    """Set each `--flag[=value]` of `words` in the arguments of every proxy and worker container
    of `jobset`: a flag already there replaced in place, a new one appended, so the diff shows
    exactly the flags that moved. The client takes them in its environment
    (`render.driver_environment`)."""
    for _job, container in _pathways_servers(jobset):
        args = [str(arg) for arg in container.get("args") or []]
        for word in words:
            same = [
                i
                for i, arg in enumerate(args)
                if _is_flag(arg) and flag_name(arg) == flag_name(word)
            ]
            if same:
                args[same[0]] = word
                args = [arg for i, arg in enumerate(args) if i not in same[1:]]
            else:
                args.append(word)
        container["args"] = args


def disagreements(found: list[CompilingContainer]) -> list[str]:
    """The flags some compiling containers have and others lack (or set otherwise), grouped by
    the containers that have them: `main only: --xla_a=1 --xla_b=true`. Empty when all agree."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for word in dict.fromkeys(word for item in found for word in item.flags):
        holders = tuple(item.name for item in found if word in item.flags)
        if len(holders) < len(found):
            groups.setdefault(holders, []).append(word)
    return [f"{', '.join(holders)} only: {' '.join(words)}" for holders, words in groups.items()]
