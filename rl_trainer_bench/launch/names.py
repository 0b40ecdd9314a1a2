"""JobSet name budgets (what the JobSet webhook enforces) and the bench's name derived from the trainer's.

The controller builds child names from the JobSet name J, each replicated job's name R and indices:
Jobs `J-R-<replica>`, pods `J-R-<replica>-<completion>-<suffix>`, and with a coordinator the label
`J-R-0-0.<subdomain>`. The webhook (kubernetes-sigs/jobset, pkg/webhooks/jobset_webhook.go) refuses
a JobSet whose longest child names would break DNS limits; the schema cannot say this, so a bench
that passes `kubectl apply --dry-run=client` could still be refused at admission. Checking here
catches it at render time.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from rl_trainer_bench.errors import UserError
from rl_trainer_bench.launch.dry_run import jobset_name, replicated_jobs

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
JOB_NAME_LIMIT = 63  # J + R + digits(replicas-1) + 2 separators
POD_NAME_BUDGET = 54  # J + R + digits(replicas-1) + digits(completions-1)
LABEL_VALUE_LIMIT = 63  # the coordinator label J-R-0-0.<subdomain>
BENCH_SUFFIX = "-bench"


def rename_text(text: str, old: str, new: str) -> str:
    """`text` with references to JobSet `old` pointing at `new`.

    A reference is the name as a whole word or as the start of a derived name (`old-proc-0-0`), not
    part of a longer name (`old2`, `older`, `x-old`).
    """
    return re.sub(rf"(?<![A-Za-z0-9-]){re.escape(old)}(?![A-Za-z0-9])", new, text)


def _digits(count: object) -> int:
    """Digits of the largest index (count - 1); a missing count means 1."""
    value = count if isinstance(count, int) and count > 0 else 1
    return len(str(value - 1))


def name_problems(jobset: Mapping, name: str | None = None) -> list[str]:
    """What breaks the webhook's budgets if the JobSet is called `name` (default: its own)."""
    name = jobset_name(jobset) if name is None else name
    problems = []
    if len(name) > JOB_NAME_LIMIT or not DNS_1035.match(name):
        problems.append(
            f"metadata.name {name!r} is not a DNS-1035 label (lower-case letters, digits and '-', "
            f"starting with a letter, at most {JOB_NAME_LIMIT} characters)"
        )
    spec = jobset.get("spec") or {}
    for job in replicated_jobs(jobset):
        job_name = str(job.get("name", ""))
        replica_digits = _digits(job.get("replicas", 1))
        completions = ((job.get("template") or {}).get("spec") or {}).get("completions", 1)
        job_length = len(name) + len(job_name) + replica_digits + 2
        if job_length > JOB_NAME_LIMIT:
            problems.append(
                f"Job names of replicated job {job_name!r} would have {job_length} characters "
                f"(limit {JOB_NAME_LIMIT}); shorten the JobSet name"
            )
        pod_budget = len(name) + len(job_name) + replica_digits + _digits(completions)
        if pod_budget > POD_NAME_BUDGET:
            problems.append(
                f"pod names of replicated job {job_name!r} use {pod_budget} of the "
                f"{POD_NAME_BUDGET} characters the webhook allows (J+R+digits); shorten the JobSet name"
            )
    coordinator = (spec.get("coordinator") or {}).get("replicatedJob")
    if coordinator:
        subdomain = (spec.get("network") or {}).get("subdomain") or name
        label = f"{name}-{coordinator}-0-0.{subdomain}"
        if len(label) > LABEL_VALUE_LIMIT:
            problems.append(
                f"coordinator label {label!r} has {len(label)} characters "
                f"(limit {LABEL_VALUE_LIMIT}); shorten the JobSet name"
            )
    return problems


def longest_name(jobset: Mapping) -> int:
    """The longest JobSet name whose child names fit every budget (0 when none fits)."""
    fitting = [n for n in range(1, JOB_NAME_LIMIT + 1) if not name_problems(jobset, "a" * n)]
    return max(fitting, default=0)


def bench_name(jobset: Mapping, requested: str | None = None, suffix: str = BENCH_SUFFIX) -> str:
    """The bench's JobSet name: `requested` if it fits, else `<trainer><suffix>`, shortened to fit
    (`jobset` is named as the trainer, with the replicated jobs of the JobSet being named).

    A shortened name keeps a 4-character digest of the trainer's full name, so two long trainer
    names with a common prefix still get different benches.
    """
    if requested is not None:
        problems = name_problems(jobset, requested)
        if problems:
            raise UserError(f"--name {requested}: {problems[0]}")
        return requested
    trainer = jobset_name(jobset)
    budget = longest_name(jobset)
    candidate = f"{trainer}{suffix}"
    if len(candidate) > budget:
        digest = hashlib.sha256(trainer.encode()).hexdigest()[:4]
        keep = budget - len(suffix) - len(digest) - 1
        if keep < 1:
            raise UserError(
                f"JobSet {trainer}: its replicated job names leave {budget} characters for the "
                "JobSet name; no bench name fits (shorten the replicated job names)"
            )
        candidate = f"{trainer[:keep].rstrip('-')}-{digest}{suffix}"
    if not DNS_1035.match(candidate):
        raise UserError(f"JobSet name {trainer!r} gives bench name {candidate!r}: pass --name NAME")
    return candidate
