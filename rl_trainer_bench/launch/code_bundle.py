"""The bench code a rendered pod runs: which files, their digest, and a reproducible archive of them.

The pod must run exactly the code that rendered it, without the package installed in the image, so
the renderer embeds an archive of it in the client command. The digest is computed the same way here
and, by the driver at start, inside the pod from the unpacked archive: equal digests prove the pod
ran the rendered code. The archive is byte-reproducible (sorted names, zero times and owners, and
xz's output depends on nothing but its input), so rendering twice gives the same manifest. xz
rather than gzip: the bundle must fit one exec argument (below), and xz packs this code about 14%
smaller; the pod unpacks it with the trainer's own Python (`pod_script.py`), whose standard
library reads xz, so the image needs no archive tools.

The JobSet schemas are render-time data the pod never reads; they are left out, because their
100 KB of base64 would push the manifest past the 256 KiB that `kubectl apply` can store in its
last-applied annotation. Documentation files are left out for the same reason as the rest of the
package: the client command must stay under the kernel's limit on one exec argument.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import lzma
import tarfile
from pathlib import Path

from rl_trainer_bench.engine.factory import BUILT_IN

PACKAGE = "rl_trainer_bench"
DRIVER_SCRIPT = "bench_driver.py"
_RENDER_TIME_ONLY = (("launch", "schemas"),)  # package-relative folders
_SKIPPED_DIRS = ("__pycache__",)
_DOCUMENTATION = (".md",)  # read by people, never by the driver


def default_root() -> Path:
    """The folder holding the `rl_trainer_bench` package (a checkout, or the pod's unpacked bundle)."""
    return Path(__file__).resolve().parents[2]


def code_files(root: Path | None = None, engine: str = BUILT_IN) -> list[Path]:
    """The files the pod's driver needs to time `engine` (`module:Class`), sorted, under `root`.

    That is the driver's import closure inside the package (found by reading the imports, lazy
    ones too), the `__init__.py` of every package on the way, the package's data files (routing
    profiles), and `bench_driver.py` if present. The driver builds its engine from a name (the
    ENGINE knob), which no import statement shows, so the named engine's module starts the
    closure too when it is one of the package's (an adapter); the renderer and the pod's driver
    both pass the same name, so their digests cover the same files. The rest of the package
    (renderer, AOT and A/B tools, adapters not named) never runs in the pod; leaving it out keeps
    the client command under the kernel's 128 KiB limit on one exec argument, which
    `bash -c SCRIPT` is.
    """
    root = default_root() if root is None else root
    package = root / PACKAGE
    named = root.joinpath(*engine.partition(":")[0].split(".")).with_suffix(".py")
    sources = _import_closure(root, [package / "bench" / "driver.py", root / DRIVER_SCRIPT, named])
    data = [
        path
        for path in package.rglob("*")
        if path.is_file() and path.suffix != ".py" and _belongs_to_bundle(path.relative_to(package))
    ]
    return sorted({*sources, *data}, key=lambda path: path.relative_to(root).as_posix())


def _import_closure(root: Path, starts: list[Path]) -> set[Path]:
    """Every package module reachable by imports from `starts`, with their packages' `__init__.py`."""
    found: set[Path] = set()
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
        for module in _package_imports(path.read_text()):
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


def _package_imports(source: str) -> set[str]:
    """Dotted names of the package's modules that `source` imports (`from P import m` counts `P.m`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name.split(".")[0] == PACKAGE}


def code_sha256(root: Path | None = None, engine: str = BUILT_IN) -> str:
    """sha256 over each code file's relative path and bytes, in sorted order; hex."""
    root = default_root() if root is None else root
    digest = hashlib.sha256()
    for path in code_files(root, engine):
        data = path.read_bytes()
        name = path.relative_to(root).as_posix().encode()
        digest.update(b"%d:%s\0%d:" % (len(name), name, len(data)))
        digest.update(data)
    return digest.hexdigest()


def bundle(root: Path | None = None, engine: str = BUILT_IN) -> bytes:
    """A reproducible tar.xz of `code_files(root, engine)`, paths relative to `root`."""
    root = default_root() if root is None else root
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for path in code_files(root, engine):
            data = path.read_bytes()
            info = tarfile.TarInfo(path.relative_to(root).as_posix())
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 0
            archive.addfile(info, io.BytesIO(data))
    return lzma.compress(tar_bytes.getvalue(), preset=9 | lzma.PRESET_EXTREME)


def bundle_base64(root: Path | None = None, engine: str = BUILT_IN, line_length: int = 76) -> str:
    """`bundle(root, engine)` as base64 lines of `line_length` characters, as `base64 -d` reads."""
    encoded = base64.b64encode(bundle(root, engine)).decode()
    return "\n".join(encoded[i : i + line_length] for i in range(0, len(encoded), line_length))
