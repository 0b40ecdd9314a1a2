"""A manifest's size as `kubectl apply` stores it: the whole object, as JSON, in one annotation.

Client-side `kubectl apply` keeps the object it applied in the annotation
`kubectl.kubernetes.io/last-applied-configuration`, and the API server refuses an object whose
annotations, keys and values together, exceed 256 KiB (262,144 bytes: `TotalAnnotationSizeLimitB`
in Kubernetes' apimachinery validation). A bench JobSet carries its code and resolved plan in the
client command, so it can outgrow that: a manifest that passes the schema would then fail at
`kubectl apply`, after the slice was planned for. The render measures it as kubectl stores it (Go's
`encoding/json`: compact, map keys sorted, `<`, `>` and `&` escaped as six characters each) and
refuses it before it is written, naming the size and the ways out. Nothing here imports JAX.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
ANNOTATIONS_LIMIT = 262_144
# What Go's encoding/json escapes that Python's json.dumps(ensure_ascii=False) keeps as is.
_GO_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def last_applied_json(document: Mapping) -> str:
    """The annotation's value for `document`: the object without that annotation, as Go writes it."""
    metadata = dict(document.get("metadata") or {})
    annotations = {
        k: v for k, v in (metadata.get("annotations") or {}).items() if k != LAST_APPLIED
    }
    if annotations:
        metadata["annotations"] = annotations
    else:
        metadata.pop("annotations", None)
    text = json.dumps(
        {**document, "metadata": metadata},
        separators=(",", ":"),
        sort_keys=True,
        ensure_ascii=False,
    )
    for character, escaped in _GO_ESCAPES.items():
        text = text.replace(character, escaped)
    return text


def stored_annotation_bytes(document: Mapping) -> int:
    """The bytes of every annotation the object holds once `kubectl apply` has added its own."""
    annotations = (document.get("metadata") or {}).get("annotations") or {}
    others = sum(
        len(str(key).encode()) + len(str(value).encode())
        for key, value in annotations.items()
        if key != LAST_APPLIED
    )
    return others + len(LAST_APPLIED) + len(last_applied_json(document).encode())


def apply_size_problems(document: Mapping) -> list[str]:
    """The one problem of an object `kubectl apply` could not store ([] when it fits)."""
    size = stored_annotation_bytes(document)
    if size <= ANNOTATIONS_LIMIT:
        return []
    return [
        f"{size:,} bytes of annotations once `kubectl apply` stores the object in {LAST_APPLIED},"
        f" over the API server's {ANNOTATIONS_LIMIT:,}: apply it with `kubectl apply"
        " --server-side` or `kubectl create` (neither stores that copy), or render with fewer"
        " arms and knobs"
    ]
