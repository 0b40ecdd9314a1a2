"""The embedded bench code: which files, a digest that survives the trip into the pod, reproducibility."""

import io
import os
import tarfile
from pathlib import Path

from rl_trainer_bench import code_digest
from rl_trainer_bench.launch import code_bundle


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


FILES = {
    "rl_trainer_bench/__init__.py": "",
    "rl_trainer_bench/bench/__init__.py": "",
    "rl_trainer_bench/bench/driver.py": "def main():\n    from rl_trainer_bench.engine.builtin import model\n",
    "rl_trainer_bench/engine/__init__.py": "",
    "rl_trainer_bench/engine/builtin/model.py": "x = 1\n",
    "rl_trainer_bench/launch/__init__.py": "",
    "rl_trainer_bench/launch/render.py": "import yaml\n",
    "rl_trainer_bench/payload/profiles/a.json": "{}",
    "rl_trainer_bench/launch/schemas/big.schema.json": "{}",
    "rl_trainer_bench/__pycache__/m.cpython-311.pyc": "junk",
    "rl_trainer_bench/.hidden": "junk",
    "bench_driver.py": "print('driver')\n",
    "tests/test_x.py": "",
}


def test_code_files_are_the_drivers_import_closure_data_and_driver_script_only(tmp_path):
    root = _tree(tmp_path, FILES)
    names = [p.relative_to(root).as_posix() for p in code_digest.code_files(root)]
    assert names == [
        "bench_driver.py",
        "rl_trainer_bench/__init__.py",
        "rl_trainer_bench/bench/__init__.py",
        "rl_trainer_bench/bench/driver.py",
        "rl_trainer_bench/engine/__init__.py",
        "rl_trainer_bench/engine/builtin/model.py",
        "rl_trainer_bench/payload/profiles/a.json",
    ]


def test_this_checkout_bundles_what_the_driver_runs_and_not_the_render_time_tools():
    names = {p.relative_to(code_digest.default_root()).as_posix() for p in code_digest.code_files()}
    assert {
        "rl_trainer_bench/bench/driver.py",
        "rl_trainer_bench/engine/builtin/jax_engine.py",
    } <= names
    assert {"rl_trainer_bench/payload/build.py", "rl_trainer_bench/code_digest.py"} <= names
    assert not {"rl_trainer_bench/launch/render.py", "rl_trainer_bench/cli.py"} & names
    assert not any(name.startswith("rl_trainer_bench/launch/") for name in names)


def test_digest_changes_with_any_byte_or_name(tmp_path):
    root = _tree(tmp_path, FILES)
    first = code_digest.code_sha256(root)
    (root / "rl_trainer_bench/engine/builtin/model.py").write_text("x = 2\n")
    second = code_digest.code_sha256(root)
    (root / "rl_trainer_bench/engine/builtin/model.py").rename(
        root / "rl_trainer_bench/engine/mode.py"
    )
    assert len({first, second, code_digest.code_sha256(root)}) == 3


def test_bundle_is_reproducible_and_unpacks_to_the_same_digest(tmp_path):
    root = _tree(tmp_path / "src", FILES)
    archive = code_bundle.bundle(root)
    os.utime(
        root / "rl_trainer_bench/engine/builtin/model.py", (1e9, 1e9)
    )  # file times must not matter
    assert code_bundle.bundle(root) == archive
    assert archive[:6] == b"\xfd7zXZ\0"  # xz, which records no time of bundling
    unpacked = tmp_path / "pod"
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:xz") as tar:
        tar.extractall(unpacked, filter="data")
    assert code_digest.code_sha256(unpacked) == code_digest.code_sha256(root)


def test_the_named_engine_travels_with_the_pod_and_other_adapters_do_not():
    adapter = "rl_trainer_bench/engine/maxtext/adapter.py"
    built_in = {
        p.relative_to(code_digest.default_root()).as_posix() for p in code_digest.code_files()
    }
    named = {
        p.relative_to(code_digest.default_root()).as_posix()
        for p in code_digest.code_files(engine="rl_trainer_bench.engine.maxtext.adapter:Any")
    }
    assert "rl_trainer_bench/engine/builtin/jax_engine.py" in built_in and adapter not in built_in
    assert adapter in named
    assert code_digest.code_sha256() != code_digest.code_sha256(
        engine="rl_trainer_bench.engine.maxtext.adapter:Any"
    )
