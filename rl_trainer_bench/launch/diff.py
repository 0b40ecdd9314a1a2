"""Structured diff of two JobSets, each change sorted into a kind, so a render can prove what it moved.

The renderer promises to change only names, `maxRestarts`, the client command, its provenance
annotations and, when asked, the slice. `render-diff A B --expect-only names,restarts,command,...`
turns that promise into a check: every added, removed or changed path is classified, and anything
outside the expected kinds fails the command. Lists of named items (replicated jobs, containers,
env, volumes) are matched by name, so one inserted item does not show as a cascade of changes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from collections.abc import Iterator, Mapping

from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import read_user_text
from rl_trainer_bench.launch.compile_flags import ENV_NAME, flag_name
from rl_trainer_bench.launch.dry_run import (
    PATHWAYS_PREFIX,
    TPU_RESOURCE,
    find_trainer,
    jobset_name,
    jobsets,
    read_documents,
)
from rl_trainer_bench.launch.names import rename_text
from rl_trainer_bench.launch.render import ANNOTATION_PREFIX, LIBTPU_FLAGS_ANNOTATION
from rl_trainer_bench.launch.validate import (
    ACCELERATOR_SELECTOR,
    INSTANCE_TYPE_FLAG,
    TOPOLOGY_SELECTOR,
)

KINDS = ("names", "restarts", "command", "provenance", "slice", "libtpu-flags", "other")
_ABSENT = object()
_SHOWN_CHARACTERS = 96


@dataclasses.dataclass(frozen=True)
class Change:
    op: str  # "added" | "removed" | "changed"
    path: tuple  # keys, list indices, or ("name", value) for named list items
    before: object
    after: object
    kind: str = "other"

    @property
    def path_text(self) -> str:
        return format_path(self.path)


def format_path(path: tuple) -> str:
    text = ""
    for part in path:
        if isinstance(part, tuple):
            text += f"[name={part[1]}]"
        elif isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + str(part)
    return text or "(document)"


def _named_items(items: list) -> dict | None:
    names = [item.get("name") for item in items if isinstance(item, dict)]
    if len(names) != len(items) or None in names or len(set(names)) != len(names):
        return None
    return {("name", item["name"]): item for item in items}


def raw_changes(before: object, after: object, path: tuple = ()) -> Iterator[Change]:
    """Every path where the two trees differ, depth first, in the order of `before` then `after`."""
    if isinstance(before, dict) and isinstance(after, dict):
        yield from _mapping_changes(before, after, path)
    elif isinstance(before, list) and isinstance(after, list):
        named_before, named_after = _named_items(before), _named_items(after)
        if named_before is not None and named_after is not None:
            yield from _mapping_changes(named_before, named_after, path)
        else:
            as_before = dict(enumerate(before))
            as_after = dict(enumerate(after))
            yield from _mapping_changes(as_before, as_after, path)
    elif before != after or type(before) is not type(after):
        yield Change("changed", path, before, after)


def _mapping_changes(before: Mapping, after: Mapping, path: tuple) -> Iterator[Change]:
    for key in [*before, *(k for k in after if k not in before)]:
        old, new = before.get(key, _ABSENT), after.get(key, _ABSENT)
        if old is _ABSENT:
            yield Change("added", (*path, key), None, new)
        elif new is _ABSENT:
            yield Change("removed", (*path, key), old, None)
        else:
            yield from raw_changes(old, new, (*path, key))


def classify(
    change: Change, old_name: str, new_name: str, libtpu_words: frozenset[str] = frozenset()
) -> str:
    """The kind of one change: what the renderer may move, or "other". `libtpu_words` are the
    LIBTPU_FLAGS words the bench says it set in the compiling containers' arguments and
    LIBTPU_INIT_ARGS."""
    path, keys = change.path, [p for p in change.path if isinstance(p, str)]
    container = next((p[1] for p in reversed(path) if isinstance(p, tuple)), "")
    if path[:2] == ("metadata", "name") or (
        isinstance(change.before, str)
        and rename_text(change.before, old_name, new_name) == change.after
    ):
        return "names"
    if path == ("spec", "failurePolicy", "maxRestarts"):
        return "restarts"
    if path[:2] == ("metadata", "annotations") and _is_provenance(change, path):
        return "provenance"
    if _is_slice(change, keys, str(container)):
        return "slice"
    if _in_client_command(path) and not str(container).startswith(PATHWAYS_PREFIX):
        return "command"
    if (
        str(container).startswith(PATHWAYS_PREFIX)
        and "args" in keys
        and change.op != "removed"
        and change.after in libtpu_words
    ) or _is_libtpu_env(change, libtpu_words):
        return "libtpu-flags"
    return "other"


def _is_libtpu_env(change: Change, libtpu_words: frozenset[str]) -> bool:
    """A container's literal LIBTPU_INIT_ARGS whose words moved only as the bench's LIBTPU_FLAGS
    words say: every added word is one of them, every dropped word a flag they set."""
    if change.path[-3:] != ("env", ("name", ENV_NAME), "value") or change.op != "changed":
        return False
    before, after = set(str(change.before).split()), set(str(change.after).split())
    names = {flag_name(word) for word in libtpu_words}
    return after - before <= libtpu_words and {flag_name(w) for w in before - after} <= names


def _is_provenance(change: Change, path: tuple) -> bool:
    if len(path) > 2:
        return str(path[2]).startswith(ANNOTATION_PREFIX)
    added = change.after if isinstance(change.after, dict) else {}
    removed = change.before if isinstance(change.before, dict) else {}
    return all(str(key).startswith(ANNOTATION_PREFIX) for key in [*added, *removed])


def _in_client_command(path: tuple) -> bool:
    keys = [p for p in path if isinstance(p, str)]
    return "containers" in keys and any(
        k in ("command", "args") for k in keys[keys.index("containers") :]
    )


def _is_slice(change: Change, keys: list[str], container: str) -> bool:
    if keys[-1:] in ([ACCELERATOR_SELECTOR], [TOPOLOGY_SELECTOR]) and "nodeSelector" in keys:
        return True
    if keys[-3:] in (["template", "spec", "completions"], ["template", "spec", "parallelism"]):
        return keys.count("template") == 1  # the Job's counts, not a pod template field
    if keys[-1:] == [TPU_RESOURCE] and "resources" in keys:
        return True
    return (
        container.startswith(PATHWAYS_PREFIX)
        and keys[-1:] == ["args"]
        and all(
            isinstance(v, str) and v.startswith(INSTANCE_TYPE_FLAG)
            for v in (change.before, change.after)
        )
    )


def diff(before: Mapping, after: Mapping) -> list[Change]:
    """The classified changes from `before` to `after`."""
    old_name, new_name = jobset_name(before), jobset_name(after)
    annotations = (after.get("metadata") or {}).get("annotations") or {}
    libtpu_words = frozenset(_words(str(annotations.get(LIBTPU_FLAGS_ANNOTATION, ""))))
    return [
        dataclasses.replace(change, kind=classify(change, old_name, new_name, libtpu_words))
        for change in raw_changes(before, after)
    ]


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an annotation edited by hand: no flag counts as the bench's
        return []


def unexpected(changes: list[Change], allowed: set[str]) -> list[Change]:
    return [change for change in changes if change.kind not in allowed]


def parse_kinds(text: str) -> set[str]:
    kinds = {kind.strip() for kind in text.split(",") if kind.strip()}
    unknown = sorted(kinds - set(KINDS))
    if unknown:
        raise UserError(
            f"--expect-only {text}: unknown kind {unknown[0]}; choose from {', '.join(KINDS)}"
        )
    return kinds


def _shown(value: object) -> str:
    if value is None:
        return "(absent)"
    if isinstance(value, str) and "\n" in value:
        return f"<text, {value.count(chr(10)) + 1} lines>"
    text = json.dumps(value, sort_keys=False, default=str)
    return text if len(text) <= _SHOWN_CHARACTERS else text[: _SHOWN_CHARACTERS - 3] + "..."


def format_change(change: Change) -> str:
    mark = {"added": "+", "removed": "-", "changed": "~"}[change.op]
    if change.op == "added":
        values = _shown(change.after)
    elif change.op == "removed":
        values = _shown(change.before)
    else:
        values = f"{_shown(change.before)} -> {_shown(change.after)}"
    return f"{mark} {change.path_text}: {values}  [{change.kind}]"


def _load_jobset(path: str, trainer_jobset: str | None) -> dict:
    text = read_user_text(path, "render-diff")
    documents = read_documents(text, path)
    found = jobsets(documents)
    if len(found) == 1 and trainer_jobset is None:
        return found[0]
    return find_trainer(documents, path, trainer_jobset)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("before", metavar="A", help="launch render or JobSet file (the trainer)")
    parser.add_argument("after", metavar="B", help="JobSet file to compare (the bench)")
    parser.add_argument(
        "--trainer-jobset", metavar="NAME", help="which JobSet of A (default: the trainer)"
    )
    parser.add_argument(
        "--expect-only",
        metavar="KINDS",
        help="comma list of change kinds allowed (names,restarts,command,provenance,slice); "
        "exit 1 when anything else changed",
    )
    parser.add_argument("--json", action="store_true", help="print the diff as JSON")


def run(args) -> int:
    allowed = parse_kinds(args.expect_only) if args.expect_only else None
    before = _load_jobset(args.before, args.trainer_jobset)
    after = _load_jobset(args.after, None)
    changes = diff(before, after)
    if args.json:
        rows = [
            {"op": c.op, "path": c.path_text, "kind": c.kind, "before": c.before, "after": c.after}
            for c in changes
        ]
        print(json.dumps(rows, indent=1, default=str))
    else:
        print(
            f"{jobset_name(before)} ({args.before}) -> {jobset_name(after)} ({args.after}): "
            f"{len(changes)} changes"
        )
        for change in changes:
            print(format_change(change))
    if allowed is not None:
        outside = unexpected(changes, allowed)
        if outside:
            kinds = sorted({change.kind for change in outside})
            print(
                f"render-diff: {len(outside)} changes outside --expect-only {args.expect_only} "
                f"(kinds {', '.join(kinds)}), first: {outside[0].path_text}",
                file=sys.stderr,
            )
            return 1
    return 0
