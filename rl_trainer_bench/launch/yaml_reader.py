"""The one YAML reader for what users hand the bench: strict about keys, lenient about line ends.

PyYAML's safe loader keeps the last of two equal keys in a mapping without a word, so a launcher
output whose trainer spells `name:` twice renders and validates as a JobSet the user did not
write. The YAML spec requires the keys of a mapping to be unique; the loader here refuses a repeat
and names it with its line and column, and the line of its first use.

Files saved on Windows end their lines with CRLF (older Mac tools with CR alone) and may start with
a UTF-8 byte-order mark. YAML reads all of these as LF, but the document splitting and line counts
around the parser see raw text, so `normalise` turns them into the LF text they stand for before
anything else looks at it: the same file, whatever editor saved it, reads and renders the same.
"""

from __future__ import annotations

from collections.abc import Hashable

import yaml
from yaml.constructor import ConstructorError

_MERGE_TAG = "tag:yaml.org,2002:merge"
_BYTE_ORDER_MARK = "\ufeff"


class KeyProblem(ConstructorError):
    """A mapping key the bench refuses, with the mark of where it is written."""


class NonStringKeyError(KeyProblem):
    """A Kubernetes object's mapping key that YAML reads as something other than a string."""

    def __init__(self, key: object, written: str, mark: yaml.Mark):
        kind = {bool: "a boolean", int: "an integer", float: "a number", type(None): "null"}.get(
            type(key)
        )
        super().__init__(
            None,
            None,
            f"the key {written} reads as {kind or type(key).__name__} ({key!r}), and a Kubernetes"
            f" object's keys are strings; quote it: '{written}'",
            mark,
        )


class DuplicateKeyError(KeyProblem):
    """A mapping holds one key twice; marks are those of the repeat and of the first use."""

    def __init__(self, key: object, first: yaml.Mark, repeat: yaml.Mark):
        super().__init__(None, None, f"the key {key!r} appears twice in one mapping", repeat)
        self.key = key
        self.first_mark = first


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with a repeated key.

    Keys are compared as Python compares them, because that is where one would silently replace
    the other (`1` and `1.0`, `true` and `1` included). Merge keys (`<<: *base`) are left to
    PyYAML: a key written beside a merge overrides the merged one by design, and is checked only
    against the keys written beside it.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            _refuse_repeated_keys(self, node)
        return super().construct_mapping(node, deep=deep)


class _KubernetesLoader(_UniqueKeyLoader):
    """The unique-key loader for Kubernetes objects, whose keys are strings: an unquoted `yes:`,
    `on:` or `8080:` (YAML 1.1 reads them as a boolean or an integer) is refused where it is
    written, not turned into a key the object cannot have."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, str):
                    raise NonStringKeyError(key, key_node.value, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _refuse_repeated_keys(loader: yaml.SafeLoader, node: yaml.MappingNode) -> None:
    seen: dict[Hashable, yaml.Mark] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):
            continue  # SafeConstructor names an unhashable key itself
        try:
            first = seen.setdefault(key, key_node.start_mark)
        except TypeError:  # hashable type holding an unhashable value, e.g. a tuple of lists
            continue
        if first is not key_node.start_mark:
            raise DuplicateKeyError(key, first, key_node.start_mark)


def normalise(text: str) -> str:
    """`text` as the LF text YAML reads it: no byte-order mark, CRLF and lone CR as LF.

    Line numbers are unchanged (each CRLF or CR was one line break), so messages about the
    normalised text point at the user's lines.
    """
    return text.removeprefix(_BYTE_ORDER_MARK).replace("\r\n", "\n").replace("\r", "\n")


def load(text: str, kubernetes: bool = False) -> object:
    """The one document in `text`, with unique keys in every mapping (else `DuplicateKeyError`);
    `kubernetes`: every key a string too (else `NonStringKeyError`)."""
    loader = _KubernetesLoader if kubernetes else _UniqueKeyLoader  # SafeLoader subclasses
    return yaml.load(text, Loader=loader)


def load_all(text: str) -> list[object]:
    """Every document in `text`, with unique keys in every mapping (else `DuplicateKeyError`)."""
    return list(yaml.load_all(text, Loader=_UniqueKeyLoader))  # a SafeLoader subclass


def describe(error: yaml.YAMLError, first_line: int = 1) -> str:
    """Where and what: `line L, column C: problem`, lines counted from `first_line`.

    `first_line` is the user's line number of the text's first line, for text cut from a longer
    file (one document of a stream).
    """
    mark = getattr(error, "problem_mark", None)
    problem = str(getattr(error, "problem", None) or error).splitlines()[0]
    if mark is None:
        return f"line {first_line}: {problem}"
    where = f"line {first_line + mark.line}, column {mark.column + 1}"
    if isinstance(error, DuplicateKeyError):
        first = error.first_mark
        return (
            f"{where}: {problem} (first at line {first_line + first.line}, column "
            f"{first.column + 1}); keep one"
        )
    return f"{where}: {problem}"
