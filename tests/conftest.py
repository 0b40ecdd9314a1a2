"""Test session set-up: 8 host CPU devices, so mesh and sharding tests run as 2x2x2 on any machine;
CPU code generation at its quickest; one XLA compilation cache for the session; and a temporary
folder of the session's own, which must be empty when the session ends.

XLA reads the device count when JAX first initializes its backend, so it is set here, before any
test module imports JAX. Many tests (and the drivers some of them start as subprocesses) compile
the same cpu-tiny programs; JAX's persistent cache, in a folder of this session's own, compiles
each once, the quick ones too: every engine built in a fresh process (the other worker's, a
driver's) compiles its initial state, update and digest programs, well under a second each, again
otherwise. Tracing and lowering still run on a cache hit, so the driver's recompile watch sees
them as before.

Whatever the tests, the package and the subprocesses they start put in the temporary folder
(`tempfile`, TMPDIR) lands in this session's `tmp/`, and a test or command that does not remove
what it made there fails the run at its end (`_the_temporary_folder_is_left_empty`). pytest's own
`tmp_path` folders and the XLA cache sit beside it, and the whole session folder is removed at exit,
so a run leaves nothing behind in the machine's temporary folder.

The bench keeps compiled programs in the user's cache folder unless told otherwise (COMPILE_CACHE,
docs/run.md); unset, it follows JAX_COMPILATION_CACHE_DIR, so every run the tests start, in this
process or a child, keeps them in the session's cache, and a run that wrote into the user's
folder fails the session at its end (`_the_users_compile_cache_is_left_alone`).

Under pytest-xdist (`-n 2`, README's test command) this module runs first in the controlling
process, whose environment the workers inherit: every worker compiles into the one session cache,
and its own session folder is made inside the controller's `tmp/`, checked by the worker and
removed with the controller's folder.
"""

import atexit
import gc
import os
import shutil
import tempfile
from pathlib import Path

import pytest

SESSION_FOLDER = Path(tempfile.mkdtemp(prefix="rl-trainer-bench-tests-"))
atexit.register(shutil.rmtree, SESSION_FOLDER, ignore_errors=True)
TEMPORARY = SESSION_FOLDER / "tmp"
TEMPORARY.mkdir()
os.environ["TMPDIR"] = str(TEMPORARY)  # subprocesses
tempfile.tempdir = str(TEMPORARY)  # this process: `tempfile` caches the folder it chose first

os.environ["JAX_PLATFORMS"] = "cpu"
# With the [tpu] extra installed, tests build TPU topologies in this process (libtpu compiling for a
# slice from this host), and under `-n 2` both workers can do so at once: libtpu's lockfile lets
# one process in and fails the other with "Internal error when accessing libtpu multi-process
# lockfile". The tests only compile, never open a chip, so the workers may each load libtpu.
os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags = f"{_flags} --xla_force_host_platform_device_count=8"
if "xla_backend_optimization_level" not in _flags:
    # The tests' programs compile for seconds and run for milliseconds: LLVM's code generation
    # at its lowest level leaves XLA's HLO passes (what the HLO and AOT tests read) as they are.
    _flags = f"{_flags} --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ["XLA_FLAGS"] = _flags.strip()
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    (SESSION_FOLDER / "xla-cache").mkdir()  # there before the drivers the tests start share it
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(SESSION_FOLDER / "xla-cache")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """`tmp_path` folders in the session folder, beside the watched `tmp/` (unless --basetemp)."""
    if config.option.basetemp is None:
        config.option.basetemp = str(SESSION_FOLDER / "pytest")


# Chip tests live in files named so (test_code_shape.py checks that no other file marks one), so
# `-m tpu_chip` (README's chip command) collects those files alone instead of importing every module
# of the suite to deselect nearly all of its tests: tens of seconds of a chip host's time.
CHIP_TEST_FILES = "*_on_chip.py"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under `-m tpu_chip`, leave out the test files that hold no chip test."""
    if config.getoption("markexpr") != "tpu_chip" or not collection_path.is_file():
        return None
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    return not collection_path.match(CHIP_TEST_FILES) or None


def left_behind(folder: Path) -> list[str]:
    """The names in `folder`, once objects that remove their folder when collected are gone."""
    gc.collect()
    return sorted(path.name for path in folder.iterdir())


# The user's own compile cache (config/compile_cache.py's default, with this process's HOME).
USER_COMPILE_CACHE = Path.home() / ".cache" / "rl_trainer_bench"


def _changed_at(folder: Path) -> float | None:
    return folder.stat().st_mtime if folder.exists() else None


@pytest.fixture(scope="session", autouse=True)
def _the_users_compile_cache_is_left_alone():
    before = _changed_at(USER_COMPILE_CACHE / "jax")
    yield
    assert _changed_at(USER_COMPILE_CACHE / "jax") == before, (
        f"a test wrote compiled programs into the user's {USER_COMPILE_CACHE}: give its run"
        " JAX_COMPILATION_CACHE_DIR or COMPILE_CACHE from this session"
    )


@pytest.fixture(scope="session", autouse=True)
def _the_temporary_folder_is_left_empty():
    yield
    left = left_behind(TEMPORARY)
    assert not left, (
        f"the tests left {len(left)} entries in the temporary folder, e.g. {left[:5]}: "
        "remove what a test makes there (tmp_path, or tempfile.TemporaryDirectory)"
    )
