"""Test session set-up: 8 host CPU devices, so mesh and sharding tests run as 2x2x2 on any machine,
and one XLA compilation cache for the session.

XLA reads the device count when JAX first initializes its backend, so it is set here, before any
test module imports JAX. Many tests (and the drivers some of them start as subprocesses) compile
the same cpu-tiny programs; JAX's persistent cache, in a folder of this session's own, compiles
each once. Tracing and lowering still run on a cache hit, so the driver's recompile watch sees
them as before.
"""

import atexit
import os
import shutil
import tempfile

os.environ["JAX_PLATFORMS"] = "cpu"
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_force_host_platform_device_count=8".strip()
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="rl-trainer-bench-test-xla-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "1"
