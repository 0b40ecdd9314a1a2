"""A launcher's DRY_RUN output: its JobSet documents, and which of them is the trainer.

Launchers print `kubectl` lines before the first `---`, licence comments, empty documents and
`annotations: {}` or null values; all of that is read as it is. The trainer is found by structure,
not by name: a replicated job with Pathways containers (`pathways-rm`, `pathways-proxy`) and a
client container running python, beside worker jobs whose containers ask for `google.com/tpu`.
Anything ambiguous is an error that lists what was found, because guessing would bench the wrong
program.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Iterator, Mapping

import yaml

from rl_trainer_bench.errors import UserError

TPU_RESOURCE = "google.com/tpu"
PATHWAYS_PREFIX = "pathways-"
_SEPARATOR = re.compile(r"^---(?:[ \t].*)?$", re.MULTILINE)
_INTERPRETER_WORD = re.compile(r"(?:^|[\s/;&|(])python[0-9.]*\s")


def read_documents(text: str, source: str) -> list[dict]:
    """The mapping documents of a multi-document YAML stream; noise before the first `---` is skipped."""
    if not text.strip():
        raise UserError(f"{source} is empty: pass the launcher's DRY_RUN output (a YAML stream)")
    starts = [match.start() for match in _SEPARATOR.finditer(text)]
    chunks = _chunks(text, starts)
    documents: list[dict] = []
    for number, (offset, chunk) in enumerate(chunks):
        try:
            document = yaml.safe_load(chunk)
        except yaml.YAMLError as error:
            if number == 0 and len(chunks) > 1:
                continue  # DRY_RUN noise such as `kubectl delete ...` before the first document
            line = text.count("\n", 0, offset) + _error_line(error)
            raise UserError(f"{source}: line {line} is not YAML ({_problem(error)})") from None
        if isinstance(document, dict):
            documents.append(document)
        elif document is not None and not (number == 0 and len(chunks) > 1):
            line = text.count("\n", 0, offset) + 1
            raise UserError(
                f"{source}: the document at line {line} is a {type(document).__name__}, not a "
                "Kubernetes object; pass the launcher's DRY_RUN output"
            )
    return documents


def _chunks(text: str, starts: list[int]) -> list[tuple[int, str]]:
    bounds = [0, *starts, len(text)]
    return [(start, text[start:end]) for start, end in itertools.pairwise(bounds)]


def _error_line(error: yaml.YAMLError) -> int:
    mark = getattr(error, "problem_mark", None)
    return mark.line + 1 if mark is not None else 1


def _problem(error: yaml.YAMLError) -> str:
    return str(getattr(error, "problem", None) or error).splitlines()[0]


def jobsets(documents: list[dict]) -> list[dict]:
    return [doc for doc in documents if doc.get("kind") == "JobSet"]


def jobset_name(jobset: Mapping) -> str:
    return str((jobset.get("metadata") or {}).get("name", "<unnamed>"))


# ----------------------------------------------------------------------------------------------
# JobSet structure
# ----------------------------------------------------------------------------------------------


def replicated_jobs(jobset: Mapping) -> list[dict]:
    return list((jobset.get("spec") or {}).get("replicatedJobs") or [])


def pod_spec(replicated_job: Mapping) -> dict:
    """The pod template's spec of a replicated job ({} when absent)."""
    job_spec = ((replicated_job.get("template") or {}).get("spec")) or {}
    return (job_spec.get("template") or {}).get("spec") or {}


def containers(replicated_job: Mapping) -> list[dict]:
    return list(pod_spec(replicated_job).get("containers") or [])


def asks_for_tpus(replicated_job: Mapping) -> bool:
    return any(TPU_RESOURCE in _resource_names(c) for c in containers(replicated_job))


def _resource_names(container: Mapping) -> set[str]:
    resources = container.get("resources") or {}
    return {*(resources.get("limits") or {}), *(resources.get("requests") or {})}


def is_pathways_container(container: Mapping) -> bool:
    return str(container.get("name", "")).startswith(PATHWAYS_PREFIX)


def runs_python(container: Mapping) -> bool:
    words = [str(w) for w in [*(container.get("command") or []), *(container.get("args") or [])]]
    return bool(_INTERPRETER_WORD.search(" " + " ".join(words) + " "))


@dataclasses.dataclass(frozen=True)
class ClientLocation:
    """Where the client container sits: replicated job index and container index."""

    job_index: int
    container_index: int


def client_locations(jobset: Mapping) -> list[ClientLocation]:
    """Every non-Pathways container that runs python: the trainer has exactly one."""
    return [
        ClientLocation(j, c)
        for j, job in enumerate(replicated_jobs(jobset))
        for c, container in enumerate(containers(job))
        if not is_pathways_container(container) and runs_python(container)
    ]


def client_location(jobset: Mapping) -> ClientLocation:
    """The single client container's location; UserError naming the JobSet when there is not one."""
    found = client_locations(jobset)
    if len(found) != 1:
        where = ", ".join(_describe(jobset, loc) for loc in found) or "none"
        raise UserError(
            f"JobSet {jobset_name(jobset)} has {len(found)} client containers running python "
            f"({where}); the trainer needs exactly one (its Pathways client)"
        )
    return found[0]


def client_container(jobset: Mapping) -> dict:
    location = client_location(jobset)
    return containers(replicated_jobs(jobset)[location.job_index])[location.container_index]


def _describe(jobset: Mapping, location: ClientLocation) -> str:
    job = replicated_jobs(jobset)[location.job_index]
    return f"{job.get('name')}/{containers(job)[location.container_index].get('name')}"


# ----------------------------------------------------------------------------------------------
# Which JobSet is the trainer
# ----------------------------------------------------------------------------------------------


def trainer_shortfalls(jobset: Mapping) -> list[str]:
    """Why a JobSet is not a Pathways trainer ([] when it is one)."""
    jobs = replicated_jobs(jobset)
    heads = [job for job in jobs if any(map(is_pathways_container, containers(job)))]
    missing = []
    if not heads:
        missing.append("no Pathways head")
    if not any(asks_for_tpus(job) for job in jobs):
        missing.append("no TPU workers")
    if heads and len(client_locations(jobset)) != 1:
        missing.append(f"{len(client_locations(jobset))} client containers")
    return missing


def find_trainer(documents: list[dict], source: str, name: str | None = None) -> dict:
    """The trainer JobSet: the one named `name`, else the only one shaped like a Pathways trainer."""
    candidates = jobsets(documents)
    if not candidates:
        kinds = sorted({str(doc.get("kind")) for doc in documents}) or ["nothing"]
        raise UserError(
            f"no JobSet in {source} (found {', '.join(kinds)}); pass the launcher's DRY_RUN output"
        )
    if name is not None:
        named = [js for js in candidates if jobset_name(js) == name]
        if len(named) != 1:
            found = ", ".join(jobset_name(js) for js in candidates)
            raise UserError(
                f"--trainer-jobset {name}: {len(named)} JobSets of that name in {source} "
                f"(found {found}); pass one of those names"
            )
        client_location(named[0])  # a named trainer still needs its one client container
        return named[0]
    trainers = [js for js in candidates if not trainer_shortfalls(js)]
    if len(trainers) == 1:
        return trainers[0]
    found = ", ".join(
        f"{jobset_name(js)} ({', '.join(trainer_shortfalls(js)) or 'trainer'})" for js in candidates
    )
    problem = "no trainer JobSet" if not trainers else f"{len(trainers)} trainer JobSets"
    raise UserError(f"{problem} in {source}: found {found}; pass --trainer-jobset NAME")


def walk_strings(node: object, path: tuple = ()) -> Iterator[tuple[tuple, str]]:
    """Every string leaf of a YAML tree with its path (keys and list indices)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk_strings(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk_strings(value, (*path, index))
    elif isinstance(node, str):
        yield path, node
