"""JobSet checks before anything is written or applied: the CRD schema, name budgets, slice consistency.

The schema is the JobSet CRD's v1alpha2 openAPIV3Schema in strict form (unknown fields are errors,
as with `kubectl apply`), shipped as package data. Before validating, null values are pruned the way
the API server prunes them, so `annotations: null` from a launcher is accepted as absent. The name
budgets are the webhook's (`jobset_names`). Slice consistency catches a half-edited slice: node
selectors, hosts times chips per host, and the Pathways instance type must describe one slice.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

import jsonschema

from rl_trainer_bench.accelerators import TPU_CHIPS
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch.dry_run import (
    TPU_RESOURCE,
    containers,
    is_pathways_container,
    jobset_name,
    jobsets,
    pod_spec,
    read_documents,
    replicated_jobs,
)
from rl_trainer_bench.launch.names import name_problems

SCHEMA_FILE = "jobset_v1alpha2.strict.schema.json"
API_VERSION = "jobset.x-k8s.io/v1alpha2"
ACCELERATOR_SELECTOR = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_SELECTOR = "cloud.google.com/gke-tpu-topology"
INSTANCE_TYPE_FLAG = "--instance_type="
_MAX_LISTED = 5


@functools.cache
def schema_validator() -> jsonschema.protocols.Validator:
    """The compiled validator for the shipped schema; built once per process (the schema is 550 KB)."""
    text = resources.files("rl_trainer_bench.launch").joinpath("schemas", SCHEMA_FILE).read_text()
    schema = json.loads(text)
    return jsonschema.validators.validator_for(schema)(schema)


def prune_nulls(node: object) -> object:
    """The tree without null mapping values, as the API server prunes them before validation."""
    if isinstance(node, dict):
        return {key: prune_nulls(value) for key, value in node.items() if value is not None}
    if isinstance(node, list):
        return [prune_nulls(value) for value in node]
    return node


def schema_problems(jobset: Mapping) -> list[str]:
    problems = []
    if jobset.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion is {jobset.get('apiVersion')!r}, expected {API_VERSION!r}")
    errors = schema_validator().iter_errors(prune_nulls(dict(jobset)))
    for error in sorted(errors, key=lambda e: (e.json_path, e.message)):
        message = error.message if len(error.message) <= 160 else error.message[:157] + "..."
        problems.append(f"{error.json_path}: {message}")
    return problems


def slice_problems(jobset: Mapping) -> list[str]:
    """Node selectors, hosts x chips and the Pathways instance type must agree on one slice."""
    problems = []
    instance_types = {
        arg[len(INSTANCE_TYPE_FLAG) :]
        for job in replicated_jobs(jobset)
        for container in containers(job)
        if is_pathways_container(container)
        for arg in map(str, container.get("args") or [])
        if arg.startswith(INSTANCE_TYPE_FLAG)
    }
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
    """Everything wrong with one JobSet ([] when it would be admitted and describe one slice)."""
    return [*schema_problems(jobset), *name_problems(jobset), *slice_problems(jobset)]


def check(jobset: Mapping, source: str) -> None:
    """Raise a one-line UserError listing a JobSet's problems; return quietly when it has none."""
    problems = jobset_problems(jobset)
    if problems:
        listed = "; ".join(problems[:_MAX_LISTED])
        more = f" (and {len(problems) - _MAX_LISTED} more)" if len(problems) > _MAX_LISTED else ""
        raise UserError(f"{source}: JobSet {jobset_name(jobset)} is invalid: {listed}{more}")


def validate_text(text: str, source: str) -> list[str]:
    """Check every JobSet in a YAML stream; the names of the valid ones, or UserError."""
    found = jobsets(read_documents(text, source))
    if not found:
        raise UserError(f"{source} holds no JobSet; pass a rendered or launched JobSet file")
    for jobset in found:
        check(jobset, source)
    return [jobset_name(jobset) for jobset in found]


def run(args) -> int:
    for file in args.files:
        path = Path(file)
        try:
            text = path.read_text()
        except OSError as error:
            raise UserError(
                f"{file}: cannot read ({error.strerror}); pass an existing file"
            ) from None
        for name in validate_text(text, file):
            print(f"{file}: JobSet {name}: valid (schema {API_VERSION}, name budgets, slice)")
    return 0
