"""The bench code a rendered pod runs, as a reproducible archive embedded in the client command.

The pod must run exactly the code that rendered it, without the package installed in the image, so
the renderer embeds an archive of the files `code_digest.code_files` names in the client command;
their digest (`code_digest.code_sha256`) is logged at both ends. The archive is byte-reproducible
(sorted names, zero times and owners, and xz's output depends on nothing but its input), so
rendering twice gives the same manifest. xz rather than gzip: the bundle must fit one exec argument,
and xz packs this code about 14% smaller; the pod unpacks it with the trainer's own Python
(`pod_script.py`), whose standard library reads xz, so the image needs no archive tools.
"""

from __future__ import annotations

import base64
import io
import lzma
import tarfile
from pathlib import Path

from rl_trainer_bench.code_digest import code_files, default_root
from rl_trainer_bench.engine.factory import BUILT_IN


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
