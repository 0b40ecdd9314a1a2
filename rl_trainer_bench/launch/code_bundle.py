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

from rl_trainer_bench.code_digest import code_files, default_root
from rl_trainer_bench.engine.factory import BUILT_IN


def bundle(
    root: Path | None = None,
    engine: str = BUILT_IN,
    same_pod_ab: bool = False,
    aot_job: bool = False,
) -> bytes:
    """A reproducible tar.xz of `code_files(root, engine, same_pod_ab, aot_job)`, paths relative
    to `root`."""
    root = default_root() if root is None else root
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for path in code_files(root, engine, same_pod_ab, aot_job):
            data = path.read_bytes()
            info = tarfile.TarInfo(path.relative_to(root).as_posix())
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
# The AOT job carries the aot and hlo-overlap commands, half as much code again as a bench pod
# (156 KB of xz against 113 KB for MaxText's engine), and each line of a part costs the YAML
# its indentation (16 bytes in the job's manifest): at 76 characters the 397B job's manifest is
# 264,764 bytes, past the 262,144 `kubectl apply` keeps in its last-applied annotation; at 1,024
# it is 221,737 (BENCHMARKS.md, "The AOT job").
AOT_JOB_LINE_CHARS = 1024


def bundle_parts(
    root: Path | None = None,
    engine: str = BUILT_IN,
    same_pod_ab: bool = False,
    aot_job: bool = False,
) -> list[str]:
    """`bundle(root, engine)` in base64, cut into exec arguments of at most PART_CHARS characters
    of 76-character lines (so the manifest stays readable; AOT_JOB_LINE_CHARS for the AOT job);
    joined with newlines, they are one base64 text that `base64.b64decode` reads back (it skips
    the newlines)."""
    encoded = base64.b64encode(bundle(root, engine, same_pod_ab, aot_job)).decode()
    width = AOT_JOB_LINE_CHARS if aot_job else LINE_CHARS
    lines = [encoded[i : i + width] for i in range(0, len(encoded), width)]
    per_part = PART_CHARS // (width + 1)
    return ["\n".join(lines[i : i + per_part]) for i in range(0, len(lines), per_part)]
