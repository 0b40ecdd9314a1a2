"""A launcher's DRY_RUN output: its JobSet documents, and which of them is the trainer.

Launchers print `kubectl` lines before the first `---`, licence comments, empty documents and
`annotations: {}` or null values; all of that is read as it is. The trainer is found by structure,
not by name: a replicated job with Pathways containers (`pathways-rm`, `pathways-proxy`) and a
client container running python, beside worker jobs whose containers ask for `google.com/tpu`.
Anything ambiguous is an error that lists what was found, because guessing would bench the wrong
program. The text is read as `yaml_reader` reads it: CRLF or CR line ends and a byte-order mark as
the LF file, a key repeated in a mapping refused.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Iterator, Mapping

import yaml

from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch import yaml_reader

TPU_RESOURCE = "google.com/tpu"
PATHWAYS_PREFIX = "pathways-"
_SEPARATOR = re.compile(r"^---(?:[ \t].*)?$", re.MULTILINE)
_INTERPRETER_WORD = re.compile(r"(?:^|[\s/;&|(])python[0-9.]*\s")


DRY_RUN_OUTPUT = "the launcher's DRY_RUN output"


def read_documents(text: str, source: str, expected: str = DRY_RUN_OUTPUT) -> list[dict]:
    """The mapping documents of a multi-document YAML stream; noise before the first `---` is
    skipped. `expected` names what the user should pass instead, in the refusals."""
    text = yaml_reader.normalise(text)
    if not text.strip():
        raise UserError(f"{source} is empty: pass {expected} (a YAML stream)")
    starts = [match.start() for match in _SEPARATOR.finditer(text)]
    chunks = _chunks(text, starts)
    documents: list[dict] = []
    for number, (offset, chunk) in enumerate(chunks):
        try:
            document = yaml_reader.load(chunk, kubernetes=True)
        except yaml_reader.KeyProblem as error:
            first_line = text.count("\n", 0, offset) + 1
            raise UserError(f"{source}: {yaml_reader.describe(error, first_line)}") from None
        except yaml.YAMLError as error:
            if number == 0 and len(chunks) > 1:
                continue  # DRY_RUN noise such as `kubectl delete ...` before the first document
            first_line = text.count("\n", 0, offset) + 1
            where, _, problem = yaml_reader.describe(error, first_line).partition(": ")
            raise UserError(f"{source}: {where} is not YAML ({problem})") from None
        except RecursionError:
            line = text.count("\n", 0, offset) + 1
            raise UserError(
                f"{source}: the document at line {line} is nested too deeply to be a Kubernetes "
                "object"
            ) from None
        shape_problem = tree_shape_problem(document)
        if shape_problem:
            line = text.count("\n", 0, offset) + 1
            raise UserError(f"{source}: the document at line {line} {shape_problem}")
        if isinstance(document, dict):
            documents.append(document)
        elif document is not None and not (number == 0 and len(chunks) > 1):
            line = text.count("\n", 0, offset) + 1
            raise UserError(
                f"{source}: the document at line {line} is a {type(document).__name__}, not a "
                f"Kubernetes object; pass {expected}"
            )
    return documents


MAX_DEPTH = 64  # a JobSet nests about 20 levels; deeper trees would exhaust recursive walkers
MAX_NODES = 1_000_000  # after expanding YAML aliases; a JobSet has a few thousand


def tree_shape_problem(document: object) -> str | None:
    """Why a loaded YAML tree cannot be walked, or None.

    YAML aliases can make a tree refer to itself (`&a [*a]`) or expand to billions of nodes from a
    few lines; every later step (pruning, copying, the schema) walks the expanded tree recursively.
    The walk here is iterative and counts each shared node once per use without expanding it.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[object, bool]] = [(document, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        children = (
            list(node.values())
            if isinstance(node, dict)
            else node
            if isinstance(node, list)
            else []
        )
        if children_done:
            on_path.discard(key)
            size[key] = 1 + sum(size.get(id(c), 1) for c in children)
            depth[key] = 1 + max((depth.get(id(c), 0) for c in children), default=0)
            if depth[key] > MAX_DEPTH:
                return f"nests deeper than {MAX_DEPTH} levels; a Kubernetes object does not"
            if size[key] > MAX_NODES:
                return f"expands to over {MAX_NODES} values through YAML aliases"
            continue
        if key in size:
            continue
        if key in on_path:
            return "contains a YAML alias to one of its own ancestors (an endless tree)"
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if isinstance(c, dict | list))
    return None


def _chunks(text: str, starts: list[int]) -> list[tuple[int, str]]:
    bounds = [0, *starts, len(text)]
    return [(start, text[start:end]) for start, end in itertools.pairwise(bounds)]


def jobsets(documents: list[dict]) -> list[dict]:
    return [doc for doc in documents if doc.get("kind") == "JobSet"]


def jobset_name(jobset: Mapping) -> str:
    return str(_mapping(jobset.get("metadata")).get("name", "<unnamed>"))


# ----------------------------------------------------------------------------------------------
# JobSet structure: read leniently, so that a part of the wrong type (`spec: oops`) reads as absent
# here and is named by the schema check (`validate`), never crashes a walk.
# ----------------------------------------------------------------------------------------------


def _mapping(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _mappings(value: object) -> list[dict]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def replicated_jobs(jobset: Mapping) -> list[dict]:
    return _mappings(_mapping(jobset.get("spec")).get("replicatedJobs"))


def pod_spec(replicated_job: Mapping) -> dict:
    """The pod template's spec of a replicated job ({} when absent)."""
    job_spec = _mapping(_mapping(replicated_job.get("template")).get("spec"))
    return _mapping(_mapping(job_spec.get("template")).get("spec"))


def containers(replicated_job: Mapping) -> list[dict]:
    return _mappings(pod_spec(replicated_job).get("containers"))


def asks_for_tpus(replicated_job: Mapping) -> bool:
    return any(TPU_RESOURCE in _resource_names(c) for c in containers(replicated_job))


def _resource_names(container: Mapping) -> set[str]:
    resources = container.get("resources") or {}
    return {*(resources.get("limits") or {}), *(resources.get("requests") or {})}


def literal_env(container: Mapping) -> dict[str, str]:
    """A container's `env` entries that have a literal value (one from the downward API or a
    secret is known only in the pod)."""
    return {
        str(item["name"]): str(item["value"])
        for item in _mappings(container.get("env"))
        if "name" in item and "value" in item
    }


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


TRAINER_SHAPE = (
    "pass the DRY_RUN output of a launch that starts a Pathways trainer (a replicated job with"
    " Pathways containers, TPU workers and one client container running python)"
)


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
        if len(named) > 1:
            raise UserError(
                f"--trainer-jobset {name}: {len(named)} JobSets of that name in {source}; a"
                " namespace holds one JobSet of a name: remove or rename the others in the input"
            )
        if not named:
            found = ", ".join(jobset_name(js) for js in candidates)
            raise UserError(
                f"--trainer-jobset {name}: no JobSet of that name in {source} (found {found});"
                " pass one of those names"
            )
        client_location(named[0])  # a named trainer still needs its one client container
        shortfalls = trainer_shortfalls(named[0])  # naming chooses a trainer, it waives no check
        if shortfalls:
            raise UserError(
                f"--trainer-jobset {name}: JobSet {name} in {source} is not a Pathways trainer"
                f" ({', '.join(shortfalls)}); {TRAINER_SHAPE}"
            )
        return named[0]
    trainers = [js for js in candidates if not trainer_shortfalls(js)]
    if len(trainers) == 1:
        return trainers[0]
    found = ", ".join(
        f"{jobset_name(js)} ({', '.join(trainer_shortfalls(js)) or 'trainer'})" for js in candidates
    )
    if trainers:
        raise UserError(
            f"{len(trainers)} trainer JobSets in {source}: found {found}; pass --trainer-jobset"
            " NAME"
        )
    raise UserError(f"no trainer JobSet in {source}: found {found}; {TRAINER_SHAPE}")


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
