"""What differs between two engine configurations, key by key.

Two runs rarely differ where people look: a launcher edit, a rendered bench and a hand-written flag
list spell the same configuration differently. This reads each side from whatever the user has (a
`key=value` list, a YAML mapping, a trainer argv, or a launched or rendered JobSet whose client
command holds the flags), and lists keys added, removed and changed, each with the built-in
engine's default and a mark where the built-in engine does not apply the key, so a difference that
cannot change the bench's numbers is visible as such. Values that are the same number or boolean
spelled differently (`1e-6` and `1.0e-06`) are equal.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from rl_trainer_bench.config.engine_keys import (
    ENGINE_KEYS,
    parse_engine_flags,
    parse_trainer_argv,
    trainer_key_fates,
)
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import read_user_text
from rl_trainer_bench.launch import yaml_reader
from rl_trainer_bench.launch.client_command import client_argv, read_client_command
from rl_trainer_bench.launch.dry_run import client_container, find_trainer, read_documents
from rl_trainer_bench.launch.pod_plan import embedded_document

_BOOLEANS = {"true": True, "false": False}
# A trainer command's MaxText keys are listed under this prefix, apart from its flags.
MAXTEXT_PREFIX = "maxtext:"


@dataclasses.dataclass(frozen=True)
class Side:
    """One side of the diff: where it came from and its flags."""

    label: str
    kind: str  # "flags" | "argv" | "yaml" | "jobset"
    flags: dict[str, str]
    fates: dict[str, str] = dataclasses.field(default_factory=dict)  # maxtext:KEY -> its fate
    # A bench JobSet's: what its pod times in place of the trainer's program (its plan's lines).
    substitutions: tuple[str, ...] = ()


def trainer_side(label: str, kind: str, argv: str | Sequence[str], engine_flags: str = "") -> Side:
    """A trainer command's side: its flags, ENGINE_FLAGS, and its MaxText keys as `maxtext:KEY`
    (the last setting of each, as MaxText keeps), each with what the built-in engine made of it."""
    flags = {**parse_trainer_argv(argv), **parse_engine_flags(engine_flags)}
    fates = {}
    for fate in trainer_key_fates(argv, engine_flags):
        flags[MAXTEXT_PREFIX + fate.key] = fate.value
        fates[MAXTEXT_PREFIX + fate.key] = fate.describe().partition(": ")[2]
    return Side(label, kind, flags, fates)


@dataclasses.dataclass(frozen=True)
class KeyChange:
    key: str
    change: str  # "added" | "removed" | "changed"
    before: str | None
    after: str | None
    default: str | None  # the built-in engine's default, when the key is one of its keys
    applied: bool  # whether the built-in engine applies the key
    fate: str | None = None  # a trainer MaxText key's fate on the side that sets it last


@dataclasses.dataclass(frozen=True)
class ConfigDiff:
    before: Side
    after: Side
    changes: list[KeyChange]
    unchanged: int
    ignored: list[str]

    def to_json(self) -> dict:
        return {
            "before": {"source": self.before.label, "kind": self.before.kind},
            "after": {"source": self.after.label, "kind": self.after.kind},
            "substitutions": {
                side: list(found.substitutions)
                for side, found in (("before", self.before), ("after", self.after))
                if found.substitutions
            },
            "changes": [dataclasses.asdict(c) for c in self.changes],
            "unchanged": self.unchanged,
            "ignored": self.ignored,
        }


# ----------------------------------------------------------------------------------------------
# Reading a side
# ----------------------------------------------------------------------------------------------


def read_side(text: str, trainer_jobset: str | None = None) -> Side:
    """A side from a file path (YAML mapping, JobSet stream, or a text of flags) or an inline string."""
    path = Path(text)
    if "\n" not in text and len(text) < 4096 and (path.exists() or _looks_like_a_path(text)):
        return _from_file(path, trainer_jobset)
    return _from_text(text, text if len(text) <= 60 else text[:57] + "...")


def _looks_like_a_path(text: str) -> bool:
    """A word with a folder or a file extension and no `=`: meant as a file, so say if it is missing."""
    return (
        "=" not in text
        and not text.lstrip().startswith("-")
        and ("/" in text or Path(text).suffix.lower() in (".yaml", ".yml", ".json", ".txt", ".sh"))
    )


def _from_text(text: str, label: str) -> Side:
    """`--flag` words mean a trainer argv (env prefix and python command allowed), else key=value."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError as error:
        raise UserError(f"{label}: not a list of shell words ({error}); check the quotes") from None
    if any(word.startswith("--") for word in words):
        return trainer_side(label, "argv", words)
    return Side(label, "flags", parse_engine_flags(" ".join(words)))


def _from_file(path: Path, trainer_jobset: str | None) -> Side:
    text = read_user_text(path, "config-diff")
    label = str(path)
    try:
        documents = yaml_reader.load_all(yaml_reader.normalise(text))
    except yaml_reader.KeyProblem as error:
        raise UserError(f"{label}: {yaml_reader.describe(error)}") from None
    except yaml.YAMLError:
        documents = None  # DRY_RUN noise before the first `---`, or plain flags: see below
    if _has_jobset(text, documents):
        return _from_jobsets(text, label, trainer_jobset)
    if documents and len(documents) == 1 and isinstance(documents[0], Mapping):
        return Side(label, "yaml", {str(k): _text(v) for k, v in documents[0].items()})
    return _from_text(text, label)


def _has_jobset(text: str, documents: list | None) -> bool:
    if documents is not None:
        return any(isinstance(d, Mapping) and d.get("kind") == "JobSet" for d in documents)
    return "kind: JobSet" in text


def _from_jobsets(text: str, label: str, trainer_jobset: str | None) -> Side:
    """The trainer's flags from its client command; a bench JobSet's TRAINER_ARGV and ENGINE_FLAGS."""
    jobset = find_trainer(read_documents(text, label), label, trainer_jobset)
    container = client_container(jobset)
    command = read_client_command([*container.get("command", []), *container.get("args", [])])
    side = trainer_side(label, "jobset", client_argv(jobset), command.env.get("ENGINE_FLAGS", ""))
    if "BENCH_CODE_SHA256" not in command.env:
        return side
    return dataclasses.replace(side, substitutions=bench_substitutions(jobset, label))


def bench_substitutions(jobset: Mapping, label: str) -> tuple[str, ...]:
    """What a bench JobSet's pod times in place of the trainer's program: the substitutions of
    the plan resolved at render time and embedded in the JobSet, which its pod checks."""
    return embedded_document(jobset, label).substitutions


def _text(value: object) -> str:
    """A YAML scalar as the flag text a command line would carry."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping | list):
        return json.dumps(value)
    return "" if value is None else str(value)


# ----------------------------------------------------------------------------------------------
# Diffing
# ----------------------------------------------------------------------------------------------


def same_value(a: str, b: str) -> bool:
    """Equal as text, or as numbers, or as booleans (`True`/`true`)."""
    if a == b:
        return True
    if a.lower() in _BOOLEANS and b.lower() in _BOOLEANS:
        return _BOOLEANS[a.lower()] == _BOOLEANS[b.lower()]
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def diff(before: Side, after: Side, ignore: Sequence[str] = ()) -> ConfigDiff:
    """Keys added, removed and changed from `before` to `after`; `ignore` holds fnmatch patterns."""
    keys = sorted(set(before.flags) | set(after.flags))
    ignored = [k for k in keys if any(fnmatch.fnmatchcase(k, pattern) for pattern in ignore)]
    changes: list[KeyChange] = []
    unchanged = 0
    for key in keys:
        if key in ignored:
            continue
        old, new = before.flags.get(key), after.flags.get(key)
        if old is not None and new is not None and same_value(old, new):
            unchanged += 1
            continue
        change = "added" if old is None else "removed" if new is None else "changed"
        spec = ENGINE_KEYS.get(key)
        fate = after.fates.get(key, before.fates.get(key))
        applied = spec is not None or (fate or "").startswith("applied")
        default = spec.default if spec else None
        changes.append(KeyChange(key, change, old, new, default, applied, fate))
    return ConfigDiff(before, after, changes, unchanged, ignored)


def format_diff(result: ConfigDiff) -> str:
    """Human listing: removed (-), added (+), changed (~); `[not applied]` where the engine ignores it."""
    lines = [
        f"--- A: {result.before.label} ({result.before.kind}, {len(result.before.flags)} keys)",
        f"+++ B: {result.after.label} ({result.after.kind}, {len(result.after.flags)} keys)",
    ]
    mark = {"removed": "-", "added": "+", "changed": "~"}
    for change in sorted(
        result.changes, key=lambda c: ("removed added changed".index(c.change), c.key)
    ):
        if change.change == "changed":
            values = f"{change.before} -> {change.after}"
        else:
            values = change.before if change.change == "removed" else change.after
        default = f"  (default {change.default})" if change.default is not None else ""
        applied = "" if change.applied else "  [not applied by the built-in engine]"
        if change.fate is not None:
            applied = f"  [trainer MaxText key: {change.fate}]"
        lines.append(f"{mark[change.change]} {change.key}: {values}{default}{applied}")
    counts = {kind: sum(c.change == kind for c in result.changes) for kind in mark}
    lines.append(
        f"{counts['removed']} removed, {counts['added']} added, {counts['changed']} changed, "
        f"{result.unchanged} unchanged"
        + (
            f", {len(result.ignored)} ignored ({', '.join(result.ignored)})"
            if result.ignored
            else ""
        )
    )
    substituted = sum(len(side.substitutions) for side in (result.before, result.after))
    if substituted:
        lines[-1] += f"; and {substituted} substitutions by the bench, listed below"
    for side in (result.before, result.after):
        if side.substitutions:
            lines.append(
                f"substitutions the bench makes in {side.label} (what its pod times in place of"
                " the trainer's program):"
            )
            lines += [f"  {line}" for line in side.substitutions]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Command
# ----------------------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    for name, side in (("before", "A"), ("after", "B")):
        parser.add_argument(
            name,
            metavar=side,
            help="a file (YAML mapping, JobSet or launch render, flags) or an inline "
            "key=value list or trainer argv",
        )
    parser.add_argument(
        "--ignore",
        default="",
        metavar="KEYS",
        help="comma list of keys or glob patterns to leave out (e.g. 'model_dir,checkpoint_*')",
    )
    parser.add_argument(
        "--trainer-jobset", metavar="NAME", help="which JobSet of a launch render holds the trainer"
    )
    parser.add_argument("--json", action="store_true", help="print the diff as JSON")


def run(args) -> int:
    """Exit 0 when nothing differs, 1 when something does (like diff), 2 for bad input."""
    before = read_side(args.before, args.trainer_jobset)
    after = read_side(args.after, args.trainer_jobset)
    ignore = [p.strip() for p in args.ignore.split(",") if p.strip()]
    result = diff(before, after, ignore)
    print(json.dumps(result.to_json(), indent=1) if args.json else format_diff(result))
    return 1 if result.changes else 0
