"""The bench code a rendered pod runs, and its digest: which files, and one sha256 over them.

The pod must run exactly the code that rendered it. The renderer computes this digest and embeds
the files (`launch/code_bundle.py`), each in the form the pod gets (`shipped`: the same program on
the same lines, without comments and inner docstrings); the driver computes it again at start, inside the pod, from
the unpacked files: equal digests prove the pod ran the rendered code. This module imports no JAX
and nothing of the renderer, so the driver's import closure (the code the pod embeds) stays small.

The JobSet schemas are render-time data the pod never reads; they are left out, because their
100 KB of base64 would push the manifest past the 256 KiB that `kubectl apply` can store in its
last-applied annotation. Documentation files are left out for the same reason as the rest of the
package: the client command must stay under the kernel's limit on one exec argument.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import tokenize
from pathlib import Path

from rl_trainer_bench.engine.factory import BUILT_IN

PACKAGE = "rl_trainer_bench"


DRIVER_SCRIPT = "bench_driver.py"
SAME_POD_AB_ENTRY = Path("ab") / "same_pod.py"  # package-relative: a same-pod A/B pod's entry
# Package-relative: the entry of the AOT job's pod (`launch/aot_job.py` renders it), which compiles
# and runs no bench, so its code is this entry's closure and the engine's, without the driver.
AOT_JOB_ENTRY = Path("preflight") / "aot_job_pod.py"


_RENDER_TIME_ONLY = (("launch", "schemas"),)  # package-relative folders


_SKIPPED_DIRS = ("__pycache__",)


_DOCUMENTATION = (".md",)  # read by people, never by the driver


def default_root() -> Path:
    """The folder holding the `rl_trainer_bench` package (a checkout, or the pod's unpacked bundle)."""
    return Path(__file__).resolve().parents[1]


def code_files(
    root: Path | None = None,
    engine: str = BUILT_IN,
    same_pod_ab: bool = False,
    aot_job: bool = False,
) -> list[Path]:
    """The files the pod's driver needs to time `engine` (`module:Class`), sorted, under `root`.

    That is the driver's import closure inside the package (found by reading the imports, lazy
    ones too; with `same_pod_ab`, for a pod rendered with AB_ARMS, the same-pod A/B's entry's
    too), the `__init__.py` of every package on the way, the package's data files (routing
    profiles), and `bench_driver.py` if present. The driver builds its engine from a name (the
    ENGINE knob), which no import statement shows, so the named engine's module starts the
    closure too when it is one of the package's (an adapter); the renderer and the pod's driver
    both pass the same name, so their digests cover the same files. The rest of the package
    (renderer, AOT and, unless asked for, A/B tools, adapters not named) never runs in the pod; leaving it out keeps
    the archive in the manifest's client command under half the whole package's (98 KiB of xz
    against 228 KiB for the built-in engine). With `aot_job` the closure starts at the AOT job's
    entry (`AOT_JOB_ENTRY`) and the named engine instead of the driver.
    """
    root = default_root() if root is None else root
    package = root / PACKAGE
    named = root.joinpath(*engine.partition(":")[0].split(".")).with_suffix(".py")
    starts = [package / "bench" / "entry.py", package / "bench" / "driver.py", root / DRIVER_SCRIPT]
    if aot_job:
        starts = [package / AOT_JOB_ENTRY]
    starts.append(named)
    if same_pod_ab:
        starts.append(package / SAME_POD_AB_ENTRY)
    sources = _import_closure(root, starts)
    data = [
        path
        for path in package.rglob("*")
        if path.is_file() and path.suffix != ".py" and _belongs_to_bundle(path.relative_to(package))
    ]
    return sorted({*sources, *data}, key=lambda path: path.relative_to(root).as_posix())


def _import_closure(root: Path, starts: list[Path]) -> set[Path]:
    """Every package module reachable by imports from `starts`, with their packages' `__init__.py`."""
    found: set[Path] = set()
    named: set[str] = set()  # module names already looked up: each names the same files again
    pending = [path for path in starts if path.is_file()]
    pending += [
        folder / "__init__.py"
        for path in pending
        for folder in path.parents
        if folder.is_relative_to(root) and (folder / "__init__.py").is_file()
    ]
    while pending:
        path = pending.pop()
        if path in found:
            continue
        found.add(path)
        for module in _package_imports(path.read_text()) - named:
            named.add(module)
            parts = module.split(".")
            for depth in range(1, len(parts) + 1):
                init = root.joinpath(*parts[:depth], "__init__.py")
                if init.is_file():
                    pending.append(init)
            module_file = root.joinpath(*parts).with_suffix(".py")
            if module_file.is_file():
                pending.append(module_file)
    return found


def _belongs_to_bundle(relative: Path) -> bool:
    parts = relative.parts
    return not (
        any(parts[: len(folder)] == folder for folder in _RENDER_TIME_ONLY)
        or any(part in _SKIPPED_DIRS or part.startswith(".") for part in parts)
        or relative.suffix in (".pyc", ".pyo", *_DOCUMENTATION)
    )


@functools.lru_cache(maxsize=1024)
def _package_imports(source: str) -> frozenset[str]:
    """Dotted names of the package's modules that `source` imports (`from P import m` counts `P.m`),
    kept by content as `_shipped_module` is: a render walks the closure twice (its files, its
    digest), and a process that renders many times parses each module once."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(name for name in names if name.split(".")[0] == PACKAGE)


def code_sha256(
    root: Path | None = None,
    engine: str = BUILT_IN,
    same_pod_ab: bool = False,
    aot_job: bool = False,
) -> str:
    """sha256 over each code file's relative path and bytes, in sorted order; hex."""
    root = default_root() if root is None else root
    digest = hashlib.sha256()
    for path in code_files(root, engine, same_pod_ab, aot_job):
        data = shipped(path)
        name = path.relative_to(root).as_posix().encode()
        digest.update(b"%d:%s\0%d:" % (len(name), name, len(data)))
        digest.update(data)
    return digest.hexdigest()


def shipped(path: Path) -> bytes:
    """`path`'s bytes as the pod gets them: a Python module without its comments and its
    functions' and classes' docstrings, its own docstring cut to its first line, other files as
    they are.

    They are a quarter of the code's xz (184 KB -> 137 KB for a same-pod A/B of the built-in
    engine), and the archive rides in the manifest, whose annotations `kubectl apply` caps at
    262,144 bytes. Each function's and class's docstring is left as `""`, a module's as its first
    line (a command prints that line), and the lines they took are left blank, so every statement
    keeps its line number in a pod's traceback. Applying it twice gives the same bytes, so the
    digest the pod takes of what it unpacked equals the renderer's of the checkout."""
    data = path.read_bytes()
    return _shipped_module(data) if path.suffix == ".py" else data


@functools.lru_cache(maxsize=1024)
def _shipped_module(data: bytes) -> bytes:
    """`shipped` of a module's bytes, kept by content: a process that renders many times (the
    tests, `render-diff`) parses each module once, not once a render (0.4-0.8 s a bundle)."""
    lines = data.splitlines(keepends=True)
    for first, last, start, end, kept in _docstring_spans(data):
        if lines[last - 1][end:].strip() != b"":
            continue  # code after the closing quotes on its line: left as written
        newline = lines[last - 1][len(lines[last - 1].rstrip(b"\r\n")) :]
        lines[first - 1] = lines[first - 1][:start] + kept + newline
        for number in range(first, last):
            lines[number] = newline
    return _without_comments(b"".join(lines).decode()).encode()


def _docstring_spans(source: bytes) -> list[tuple[int, int, int, int, bytes]]:
    """(first line, last line, start byte, end byte, what it becomes) of each docstring: a
    function's or class's `""`, the module's its first line (unchanged where it has one line)."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                if isinstance(node, ast.Module):
                    if first.lineno == first.end_lineno:
                        continue
                    kept = repr(first.value.value.split("\n", 1)[0]).encode()
                else:
                    kept = b'""'
                spans.append(
                    (first.lineno, first.end_lineno, first.col_offset, first.end_col_offset, kept)
                )
    return spans


def _without_comments(source: str) -> str:
    """`source` without its comments. Its lines are the tokenizer's, split at newlines only:
    `str.splitlines` also splits at a form feed or U+2028, which a string or a comment may hold,
    and would then edit the wrong line."""
    lines = io.StringIO(source).readlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            number, column = token.start
            line = lines[number - 1]
            newline = line[len(line.rstrip("\r\n")) :]
            lines[number - 1] = line[:column].rstrip() + newline
    return "".join(lines)
