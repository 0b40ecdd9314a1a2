"""The bench code a rendered pod runs, as a reproducible archive embedded in the client command.

The pod must run exactly the code that rendered it, without the package installed in the image, so
the renderer embeds an archive of the files `code_digest.code_files` names in the client command;
their digest (`code_digest.code_sha256`) is logged at both ends. The archive is byte-reproducible
(sorted names, zero times and owners, and xz's output depends on nothing but its input), so
rendering twice gives the same manifest. xz rather than gzip: xz packs this code about 14% smaller,
and the pod unpacks it with the trainer's own Python (`pod_script.py`), whose standard library reads
xz, so the image needs no archive tools.

The kernel refuses any one exec argument over 128 KiB (MAX_ARG_STRLEN), and the bench's code
outgrew that as one base64 text; so the text travels as several arguments after the script
(`bash -c SCRIPT NAME PART...`), each well under the limit, and the script joins them. The total
of all arguments and the environment (ARG_MAX, a quarter of the stack limit: 2 MiB by default)
leaves room for many times today's bundle.
"""

from __future__ import annotations

import base64
import functools
import io
import lzma
import tarfile
from pathlib import Path

from rl_trainer_bench.bench.plan_document import PLAN_FILE
from rl_trainer_bench.code_digest import code_files, default_root, shipped
from rl_trainer_bench.engine.factory import BUILT_IN


def bundle(
    root: Path | None = None,
    engine: str = BUILT_IN,
    same_pod_ab: bool = False,
    resolved_plan: str | None = None,
    aot_job: bool = False,
) -> bytes:
    """A reproducible tar.xz of `code_files(root, engine, same_pod_ab, aot_job)` as the pod gets
    them (`code_digest.shipped`), paths relative to `root`, and the resolved plan's document
    (`bench/plan_document.py`) beside them when given: it rides in the archive, where xz packs it
    with the code, not in the manifest's text."""
    root = default_root() if root is None else root
    files = [
        (path.relative_to(root).as_posix(), shipped(path))
        for path in code_files(root, engine, same_pod_ab, aot_job)
    ]
    if resolved_plan is not None:
        files.append((PLAN_FILE, resolved_plan.encode()))
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 0
            archive.addfile(info, io.BytesIO(data))
    return _xz(tar_bytes.getvalue())


@functools.lru_cache(maxsize=4)
def _xz(data: bytes) -> bytes:
    """xz at its strongest setting: about 0.2 s for this code, paid once per distinct archive in
    a process that renders many times (`render-diff`, the test suite)."""
    return lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)


# Base64 characters per exec argument: 64 KiB, half the kernel's limit on one argument.
PART_CHARS = 64 * 1024
LINE_CHARS = 76


def bundle_parts(
    root: Path | None = None,
    engine: str = BUILT_IN,
    same_pod_ab: bool = False,
    resolved_plan: str | None = None,
    aot_job: bool = False,
) -> list[str]:
    """`bundle(...)` in base64, cut into exec arguments of at most PART_CHARS characters
    of 76-character lines (so the manifest stays readable); joined with newlines, they are one
    base64 text that `base64.b64decode` reads back (it skips the newlines)."""
    encoded = base64.b64encode(bundle(root, engine, same_pod_ab, resolved_plan, aot_job)).decode()
    lines = [encoded[i : i + LINE_CHARS] for i in range(0, len(encoded), LINE_CHARS)]
    per_part = PART_CHARS // (LINE_CHARS + 1)
    return ["\n".join(lines[i : i + per_part]) for i in range(0, len(lines), per_part)]
