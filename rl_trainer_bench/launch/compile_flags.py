"""libtpu flags where compiling happens: the client, and under Pathways the proxy and the workers.

A flag in `LIBTPU_INIT_ARGS` changes the program only in a process that compiles or runs it. In a
plain JAX trainer that is the client; under Pathways the client hands its programs to the proxy,
which compiles them, and the workers run them on the TPUs. A process reads its flags from every
place it has them: a Pathways server from its arguments (the public recipes' carrier: xpk's
`--custom-pathways-proxy-server-args` and `--custom-pathways-worker-args`) and from
`LIBTPU_INIT_ARGS` in its environment, the client from `LIBTPU_INIT_ARGS` (its script's, exported
or before python, over its container's `env`). So each container's flags are read from all of
them, each with the place it came from; one flag given two values in one container is a
conflict (which value libtpu takes is then unknown) and is reported; `LIBTPU_FLAGS` is set in
every place a container has (`apply_everywhere`), so no stale value is left beside the new one;
and a launcher whose containers disagree (a flag on the client only, which under Pathways never
reaches the compiler) is named, because the bench copies that disagreement.

Containers are recognised as the launcher renders them: the client is the one python container
(`dry_run.client_container`); among the Pathways containers, the one started with
`--node_type=resource_manager` manages resources and compiles nothing, those asking for TPUs are
workers, and one whose name or image says `proxy` is the proxy.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Iterator, Mapping

from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch.client_command import merge_flags
from rl_trainer_bench.launch.dry_run import (
    TPU_RESOURCE,
    client_location,
    containers,
    is_pathways_container,
    replicated_jobs,
)

CLIENT, PROXY, WORKER = "client", "proxy", "worker"
RESOURCE_MANAGER_ARG = "--node_type=resource_manager"
ENV_NAME = "LIBTPU_INIT_ARGS"
ARGS = "args"  # the place: a Pathways server's container arguments


@dataclasses.dataclass(frozen=True)
class CompilingContainer:
    """One container that compiles or runs the trainer's programs, and its flags by place."""

    job: str  # the replicated job's name
    name: str
    role: str  # CLIENT, PROXY or WORKER
    # Its libtpu/XLA flags, `--name[=value]` words, each with the place it was read from (ARGS
    # or ENV_NAME), in the order they were read.
    settings: tuple[tuple[str, str], ...]
    # A place that holds flags the render cannot read ("" when none): LIBTPU_INIT_ARGS from
    # valueFrom (a ConfigMap, a Secret) is known only in the pod.
    unread: str = ""

    @property
    def flags(self) -> tuple[str, ...]:
        """Every distinct flag word it has, whatever the place."""
        return tuple(dict.fromkeys(word for word, _ in self.settings))

    def conflicts(self) -> dict[str, list[tuple[str, str]]]:
        """{flag name: [(word, place), ...]} for each flag given more than one value here."""
        by_name: dict[str, dict[str, str]] = {}
        for word, place in self.settings:
            by_name.setdefault(flag_name(word), {}).setdefault(word, place)
        return {name: list(words.items()) for name, words in by_name.items() if len(words) > 1}

    def describe(self) -> str:
        """`pathways-worker (worker, args and LIBTPU_INIT_ARGS): --xla_a=1`: each word with the
        places it is set in, grouped by place (`none` when it has no flags)."""
        places: dict[str, list[str]] = {}
        for word in self.flags:
            where = [place for setting, place in self.settings if setting == word]
            places.setdefault(" and ".join(dict.fromkeys(where)), []).append(word)
        unread = [f"{self.unread}, known only in the pod"] if self.unread else []
        if len(places) == 1 and not unread:
            ((where, words),) = places.items()
            return f"{self.name} ({self.role}, {where}): {' '.join(words)}"
        groups = [f"{where}: {' '.join(words)}" for where, words in places.items()] + unread
        return f"{self.name} ({self.role}): {'; '.join(groups) or 'none'}"


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


def _env_entry(container: Mapping) -> dict | None:
    """The container's `env` entry for LIBTPU_INIT_ARGS (the last, as Kubernetes keeps it)."""
    found = [
        item
        for item in container.get("env") or []
        if isinstance(item, Mapping) and item.get("name") == ENV_NAME
    ]
    return found[-1] if found else None


def _unread(container: Mapping) -> str:
    entry = _env_entry(container)
    return f"{ENV_NAME} from valueFrom" if entry is not None and "value" not in entry else ""


def _env_words(container: Mapping) -> tuple[str, ...]:
    """The words of the container's literal LIBTPU_INIT_ARGS, split at whitespace as libtpu
    splits it."""
    entry = _env_entry(container)
    return tuple(str(entry.get("value", "")).split()) if entry is not None else ()


def _client_settings(
    container: Mapping, script_env: Mapping[str, str]
) -> tuple[tuple[str, str], ...]:
    """The client's LIBTPU_INIT_ARGS: its script's (exported or before python) replaces its
    container's `env` value in the process."""
    words = script_env[ENV_NAME].split() if ENV_NAME in script_env else _env_words(container)
    return tuple((word, ENV_NAME) for word in words)


def _server_settings(container: Mapping, flag_names: set[str]) -> tuple[tuple[str, str], ...]:
    """A Pathways server's libtpu flags: its `--xla_*` arguments and any argument that names a
    flag some compiling container carries in LIBTPU_INIT_ARGS, then its own LIBTPU_INIT_ARGS."""
    args = [
        (str(arg), ARGS)
        for arg in container.get("args") or []
        if _is_flag(str(arg))
        and (str(arg).startswith("--xla_") or flag_name(str(arg)) in flag_names)
    ]
    return (*args, *((word, ENV_NAME) for word in _env_words(container)))


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
    client_settings = _client_settings(client, script_env)
    servers = list(_pathways_servers(jobset))
    names = {flag_name(word) for word, _ in client_settings} | set(extra_names)
    names |= {flag_name(word) for _, container in servers for word in _env_words(container)}
    unread = "" if ENV_NAME in script_env else _unread(client)
    found = [
        CompilingContainer(
            str(client_job.get("name")), str(client.get("name")), CLIENT, client_settings, unread
        )
    ]
    found += [
        CompilingContainer(
            str(job.get("name")),
            str(container.get("name")),
            str(role(container)),
            _server_settings(container, names),
            _unread(container),
        )
        for job, container in servers
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


def apply_everywhere(jobset: dict, words: list[str]) -> None:
    """Set each `--flag[=value]` of `words` in every place a compiling container of `jobset`
    reads it, so no stale value is left beside the new one: the arguments of every proxy and
    worker (a flag already there replaced in place, a new one appended, so the diff shows exactly
    the flags that moved) and the literal LIBTPU_INIT_ARGS in the `env` of any compiling
    container that has one (the client's script exports them too, `render.driver_environment`,
    which replaces whatever its container's `env` says). UserError when a Pathways server takes
    LIBTPU_INIT_ARGS from valueFrom, which the render can neither read nor change."""
    if not words:
        return
    where = client_location(jobset)
    client = containers(replicated_jobs(jobset)[where.job_index])[where.container_index]
    servers = [container for _, container in _pathways_servers(jobset)]
    for container in servers:
        if _unread(container):
            raise UserError(
                f"LIBTPU_FLAGS: container {container.get('name')} takes {ENV_NAME} from"
                " valueFrom, which the render can neither read nor change, so the flags would"
                f" reach it twice with unknown values: give it a literal {ENV_NAME} value, or"
                " render without LIBTPU_FLAGS"
            )
    for container in [client, *servers]:
        entry = _env_entry(container)
        if entry is not None:
            entry["value"] = " ".join(_with_words(str(entry.get("value", "")).split(), words))
    for _job, container in _pathways_servers(jobset):
        container["args"] = _with_words([str(arg) for arg in container.get("args") or []], words)


def _with_words(existing: list[str], words: list[str]) -> list[str]:
    """`existing` with each flag of `words` set: its first occurrence replaced in place and any
    later one dropped, or the word appended; every other word left as it was."""
    result = list(existing)
    for word in words:
        same = [
            i for i, old in enumerate(result) if _is_flag(old) and flag_name(old) == flag_name(word)
        ]
        if same:
            result[same[0]] = word
            result = [old for i, old in enumerate(result) if i not in same[1:]]
        else:
            result.append(word)
    return result


def disagreements(found: list[CompilingContainer]) -> list[str]:
    """The flags some compiling containers have and others lack (or set otherwise), grouped by
    the containers that have them: `main only: --xla_a=1 --xla_b=true`. Empty when all agree."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for word in dict.fromkeys(word for item in found for word in item.flags):
        holders = tuple(item.name for item in found if word in item.flags)
        if len(holders) < len(found):
            groups.setdefault(holders, []).append(word)
    return [f"{', '.join(holders)} only: {' '.join(words)}" for holders, words in groups.items()]


def conflict_warnings(
    trainer: list[CompilingContainer], bench: list[CompilingContainer]
) -> list[str]:
    """One warning per flag a trainer's container gives several values (in its arguments and its
    LIBTPU_INIT_ARGS, or twice in one place): which one libtpu takes is then not known. Each says
    what the bench's container of that name has instead, as one value or as the same conflict."""
    by_name = {item.name: item for item in bench}
    warnings = []
    for item in trainer:
        for name, words in item.conflicts().items():
            values = ", ".join(f"{word.partition('=')[2]} ({place})" for word, place in words)
            kept = [w for w in by_name[item.name].flags if flag_name(w) == name]
            bench_has = (
                f"the bench's has {kept[0]}" if len(kept) == 1 else "the bench keeps them all"
            )
            warnings.append(
                f"WARNING: the trainer's {item.name} ({item.role}) sets {name} to several values:"
                f" {values}; which one libtpu takes is not known, and {bench_has}: set it once,"
                " or with LIBTPU_FLAGS, which the render writes in every place a container reads"
                " it"
            )
    return warnings
