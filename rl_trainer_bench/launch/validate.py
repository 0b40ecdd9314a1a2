"""JobSet checks before anything is written or applied, in the order a cluster applies them.

1. Null values are pruned, as the API server prunes them (`annotations: null` is absent).
2. The webhook's defaults are filled in (`jobset_defaults`): unnamed failure-policy rules get names.
3. The CRD schema: JobSet's v1alpha2 openAPIV3Schema in strict form (unknown fields are errors, as
   with `kubectl apply`), shipped as package data. What the shipped schema adds to the CRD is listed
   in `schemas/README.md`: a required top-level `spec`, `apiVersion`, `kind` and `metadata`, and
   the API server's rules for `metadata` (a DNS-1123 name or a generateName).
4. Only on a tree the schema accepts: the CRD's list keys (a list marked `x-kubernetes-list-type:
   map` holds one entry per key, e.g. one replicated job per name; a `set` holds no repeats), which
   the API server enforces but JSON Schema cannot say; the webhook's name budgets
   (`jobset_names`); slice consistency, which catches a half-edited slice: node selectors, hosts
   times chips per host and the Pathways instance type must describe one slice.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import sys
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

import jsonschema

from rl_trainer_bench.chips.accelerators import TPU_CHIPS
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch.apply_size import apply_size_problems
from rl_trainer_bench.launch.dry_run import (
    TPU_RESOURCE,
    asks_for_tpus,
    containers,
    is_pathways_container,
    jobset_name,
    jobsets,
    pod_spec,
    read_documents,
    replicated_jobs,
)
from rl_trainer_bench.launch.jobset_defaults import with_webhook_defaults
from rl_trainer_bench.launch.names import name_problems

SCHEMA_FILE = "jobset_v1alpha2.strict.schema.json"
API_VERSION = "jobset.x-k8s.io/v1alpha2"
ACCELERATOR_SELECTOR = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_SELECTOR = "cloud.google.com/gke-tpu-topology"
INSTANCE_TYPE_FLAG = "--instance_type="
INSTANCE_COUNT_FLAG = "--instance_count="
_MAX_LISTED = 5


# The CRD's integer widths, which the API server enforces: JSON Schema's validators check a format
# only when given a checker for it, and none ships one for these.
INTEGER_FORMATS = jsonschema.FormatChecker(formats=())
_INTEGER_BITS = {"int32": 32, "int64": 64}


def _fits(bits: int):
    def check(value: object) -> bool:
        if not isinstance(value, int) or isinstance(value, bool):
            return True  # the schema's `type` says what else is wrong
        return -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)

    return check


for _name, _bits in _INTEGER_BITS.items():
    INTEGER_FORMATS.checks(_name)(_fits(_bits))


@functools.cache
def schema_validator() -> jsonschema.protocols.Validator:
    """The compiled validator for the shipped schema; built once per process (the schema is 550 KB)."""
    text = resources.files("rl_trainer_bench.launch").joinpath("schemas", SCHEMA_FILE).read_text()
    schema = json.loads(text)
    return jsonschema.validators.validator_for(schema)(schema, format_checker=INTEGER_FORMATS)


def prune_nulls(node: object) -> object:
    """The tree without null mapping values, as the API server prunes them before validation."""
    if isinstance(node, dict):
        return {key: prune_nulls(value) for key, value in node.items() if value is not None}
    if isinstance(node, list):
        return [prune_nulls(value) for value in node]
    return node


def admitted_tree(jobset: Mapping) -> dict:
    """The JobSet as the API server validates it: nulls pruned, then the webhook's defaults."""
    return with_webhook_defaults(prune_nulls(dict(jobset)))


def schema_problems(tree: Mapping) -> list[str]:
    """The schema's complaints about an admitted tree (see `admitted_tree`)."""
    problems = []
    if tree.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion is {tree.get('apiVersion')!r}, expected {API_VERSION!r}")
    errors = schema_validator().iter_errors(tree)
    for error in sorted(errors, key=lambda e: (e.json_path, e.message)):
        message = error.message if len(error.message) <= 160 else error.message[:157] + "..."
        if error.validator == "format" and error.validator_value in _INTEGER_BITS:
            bits = _INTEGER_BITS[error.validator_value]
            message = (
                f"{error.instance} is past the {error.validator_value} the API server stores"
                f" ({-(2 ** (bits - 1)):,} to {2 ** (bits - 1) - 1:,})"
            )
        problems.append(f"{error.json_path}: {message}")
    return problems


def list_key_problems(node: object, schema: Mapping, path: str = "$") -> list[str]:
    """Repeated keys in the lists the CRD keys (`x-kubernetes-list-type` map or set).

    Walks a schema-valid tree beside its schema; the API server refuses a keyed list with two
    entries of one key, where plain JSON Schema sees nothing wrong.
    """
    problems = []
    if isinstance(node, list):
        list_type = schema.get("x-kubernetes-list-type")
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen: dict[str, int] = {}
        for index, item in enumerate(node):
            if list_type == "map" and isinstance(item, dict):
                identity = ", ".join(f"{key}={item.get(key)!r}" for key in keys)
            elif list_type == "set":
                identity = json.dumps(item, sort_keys=True, default=str)
            else:
                identity = None
            if identity is not None and identity in seen:
                problems.append(
                    f"{path}[{index}]: duplicate entry {identity} (also at [{seen[identity]}]); "
                    f"each {'/'.join(keys) or 'value'} may appear once in this list"
                )
            elif identity is not None:
                seen[identity] = index
            problems += list_key_problems(item, schema.get("items") or {}, f"{path}[{index}]")
    elif isinstance(node, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, value in node.items():
            child = properties.get(key, extra if isinstance(extra, dict) else {})
            problems += list_key_problems(value, child, f"{path}.{key}")
    return problems


def _pathways_flag_values(jobset: Mapping, flag: str) -> set[str]:
    """The values the Pathways containers give `flag` (`--instance_type=`)."""
    return {
        arg[len(flag) :]
        for job in replicated_jobs(jobset)
        for container in containers(job)
        if is_pathways_container(container)
        for arg in map(str, container.get("args") or [])
        if arg.startswith(flag)
    }


def worker_slices(jobset: Mapping) -> tuple[int, str]:
    """The TPU slices the JobSet's worker jobs hold (each job's replicas), and which ones."""
    workers = [job for job in replicated_jobs(jobset) if asks_for_tpus(job)]
    replicas = [job.get("replicas", 1) for job in workers]
    slices = sum(count for count in replicas if isinstance(count, int))
    each = ", ".join(
        f"{job.get('name')!r} x{count}" for job, count in zip(workers, replicas, strict=True)
    )
    return slices, each


def slice_problems(jobset: Mapping) -> list[str]:
    """Node selectors, hosts x chips and the Pathways instance type must agree on one slice, and
    the TPU worker jobs' slices on the Pathways instance count."""
    problems = []
    instance_types = _pathways_flag_values(jobset, INSTANCE_TYPE_FLAG)
    counts = _pathways_flag_values(jobset, INSTANCE_COUNT_FLAG)
    slices, each = worker_slices(jobset)
    if counts and slices and counts != {str(slices)}:
        problems.append(
            f"the TPU worker jobs hold {slices} slice(s) ({each}) but Pathways"
            f" --instance_count={','.join(sorted(counts))}; make them agree"
        )
    for job in replicated_jobs(jobset):
        selector = pod_spec(job).get("nodeSelector") or {}
        accelerator, topology = selector.get(ACCELERATOR_SELECTOR), selector.get(TOPOLOGY_SELECTOR)
        chip = next((c for c in TPU_CHIPS if c.gke_accelerator == accelerator), None)
        if chip is None or not isinstance(topology, str):
            continue
        where = f"replicated job {job.get('name')!r}"
        expected_type = f"{chip.pathways_prefix}:{topology}"
        if instance_types and expected_type not in instance_types:
            problems.append(
                f"{where}: nodes {accelerator} {topology} but Pathways --instance_type="
                f"{','.join(sorted(instance_types))}; expected {expected_type}"
            )
        per_host = _tpus_per_host(job)
        if per_host:
            hosts = ((job.get("template") or {}).get("spec") or {}).get("completions", 1)
            chips = math.prod(int(d) for d in topology.split("x") if d.isdigit())
            if hosts * per_host != chips:
                problems.append(
                    f"{where}: {hosts} hosts x {per_host} {TPU_RESOURCE} = {hosts * per_host} "
                    f"chips, but topology {topology} has {chips}"
                )
    return problems


def _tpus_per_host(job: Mapping) -> int:
    total = 0
    for container in containers(job):
        limits = (container.get("resources") or {}).get("limits") or {}
        value = limits.get(TPU_RESOURCE)
        if value is not None and str(value).isdigit():
            total += int(value)
    return total


def jobset_problems(jobset: Mapping) -> list[str]:
    """Everything wrong with one JobSet ([] when it would be admitted and describe one slice).

    The structural checks read the tree by its schema's types, so they run only on a tree the
    schema accepts: `spec: oops` is reported by the schema, never walked.
    """
    tree = admitted_tree(jobset)
    problems = schema_problems(tree)
    if problems:
        return problems
    schema = schema_validator().schema
    return [
        *list_key_problems(tree, schema),
        *name_problems(tree),
        *container_name_problems(tree),
        *slice_problems(tree),
        *apply_size_problems(jobset),
    ]


DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_LIMIT = 63


def container_name_problems(tree: Mapping) -> list[str]:
    """Container names the API server refuses: each must be a DNS-1123 label (lower-case letters,
    digits and `-`, at most 63, a letter or digit at each end), which the CRD's schema leaves to
    the server's own validation of the pod template."""
    problems = []
    for job_index, job in enumerate(replicated_jobs(tree)):
        pod = pod_spec(job)
        for field in ("initContainers", "containers"):
            for index, container in enumerate(pod.get(field) or []):
                name = str(container.get("name", ""))
                if len(name) > _LABEL_LIMIT or not DNS_1123_LABEL.match(name):
                    problems.append(
                        f"$.spec.replicatedJobs[{job_index}].template.spec.template.spec.{field}"
                        f"[{index}].name: {name!r} is not a DNS-1123 label (lower-case letters,"
                        " digits and '-', at most 63, a letter or digit at each end)"
                    )
    return problems


def check(jobset: Mapping, source: str) -> None:
    """Raise a one-line UserError listing a JobSet's problems; return quietly when it has none."""
    _raise_problems(jobset_problems(jobset), jobset, source)


def check_schema(jobset: Mapping, source: str) -> None:
    """`check` for the schema only: an input JobSet must be well-formed before it is read further."""
    _raise_problems(schema_problems(admitted_tree(jobset)), jobset, source)


def _raise_problems(problems: list[str], jobset: Mapping, source: str) -> None:
    if problems:
        listed = "; ".join(problems[:_MAX_LISTED])
        more = f" (and {len(problems) - _MAX_LISTED} more)" if len(problems) > _MAX_LISTED else ""
        raise UserError(f"{source}: JobSet {jobset_name(jobset)} is invalid: {listed}{more}")


def validate_text(text: str, source: str) -> list[str]:
    """Check every JobSet in a YAML stream; the names of the valid ones, or UserError."""
    found = jobsets(read_documents(text, source, "a rendered or launched JobSet file"))
    if not found:
        raise UserError(f"{source} holds no JobSet; pass a rendered or launched JobSet file")
    for jobset in found:
        check(jobset, source)
    return [jobset_name(jobset) for jobset in found]


def validate_file(file: str) -> list[str]:
    """validate_text of a file's contents; UserError when it cannot be read as UTF-8 text."""
    try:
        data = Path(file).read_bytes()
    except OSError as error:
        raise UserError(f"{file}: cannot read ({error.strerror}); pass an existing file") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserError(
            f"{file}: byte {error.start} is not UTF-8; pass a YAML text file (a JobSet manifest)"
        ) from None
    return validate_text(text, file)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML files holding JobSets")


def run(args) -> int:
    """Report on every file, one line each (valid on stdout, invalid on stderr); exit 2 if any fails."""
    failed = 0
    for file in args.files:
        try:
            names = validate_file(file)
        except UserError as error:
            failed += 1
            print(f"rl-trainer-bench validate: {error}", file=sys.stderr)
            continue
        for name in names:
            print(
                f"{file}: JobSet {name}: valid (schema {API_VERSION}, list keys, name budgets, container names, slice)"
            )
    return 2 if failed else 0
