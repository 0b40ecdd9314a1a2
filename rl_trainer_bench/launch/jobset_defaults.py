"""The JobSet webhook's defaulting, applied before the schema is checked, as a cluster applies it.

The API server runs JobSet's mutating webhook (kubernetes-sigs/jobset, `pkg/webhooks/
jobset_webhook.go`, method `Default`, at the commit `schemas/README.md` names) before it checks the
CRD schema. The webhook fills fields the schema marks as required: an unnamed failure-policy rule
is called `failurePolicyRule<i>`, so a manifest without rule names is admitted although the schema
alone would refuse it. Validating without this step refuses JobSets a cluster accepts.

Every default the webhook sets at that commit is applied here, and only where the field is absent:
success policy (operator All), startup policy (AnyOrder), each replicated job's completion mode
(Indexed) and pod restart policy (OnFailure), DNS hostnames and publishing not-ready addresses
(true), failure-policy rule names, and the volume claim policies' retention (delete). A part of
the tree that is absent or of the wrong type is left as it is, for the schema to name.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

RULE_NAME_FORMAT = "failurePolicyRule{}"


def with_webhook_defaults(jobset: Mapping) -> dict:
    """A copy of `jobset` with the webhook's defaults filled in where absent."""
    out = copy.deepcopy(dict(jobset))
    spec = out.get("spec")
    if not isinstance(spec, dict):
        return out
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    for job in _dicts(spec.get("replicatedJobs")):
        job_spec = _child(job, "template", "spec")
        if job_spec is None:
            continue
        job_spec.setdefault("completionMode", "Indexed")
        pod_spec = _child(job_spec, "template", "spec")
        if pod_spec is not None and not pod_spec.get("restartPolicy"):
            pod_spec["restartPolicy"] = "OnFailure"
    network = spec.setdefault("network", {})
    if isinstance(network, dict):
        network.setdefault("enableDNSHostnames", True)
        network.setdefault("publishNotReadyAddresses", True)
    failure_policy = spec.get("failurePolicy")
    if isinstance(failure_policy, dict):
        for index, rule in enumerate(_items(failure_policy.get("rules"))):
            if isinstance(rule, dict) and not rule.get("name"):
                rule["name"] = RULE_NAME_FORMAT.format(index)
    for policy in _dicts(spec.get("volumeClaimPolicies")):
        policy.setdefault("retentionPolicy", {"whenDeleted": "Delete"})
    return out


def _items(value: object) -> list:
    return value if isinstance(value, list) else []


def _dicts(value: object) -> list[dict]:
    return [item for item in _items(value) if isinstance(item, dict)]


def _child(node: dict, *keys: str) -> dict | None:
    """node[k1][k2]... when every step is a mapping, else None.

    The webhook's Go types would create an absent job or pod template here; it is not created, so
    that the schema names the missing template rather than a field inside an empty one.
    """
    for key in keys:
        node = node.get(key)
        if not isinstance(node, dict):
            return None
    return node
