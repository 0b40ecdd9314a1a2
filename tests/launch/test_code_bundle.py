"""The embedded bench code: which files, a digest that survives the trip into the pod, reproducibility."""

import ast
import io
import os
import tarfile
import tokenize
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


def test_the_pod_gets_each_module_without_comments_and_docstrings_line_for_line(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        '"""The module\'s docstring stays: commands print it."""\n'
        "\n"
        "X = 1  # a comment\n"
        "# a comment line\n"
        "def f(a):\n"
        '    """Two lines\n'
        '    of docstring, with a # in it."""\n'
        "    return a + 1\n"
        "class C:\n"
        '    """Élan."""\n'
        "    def g(self): return '# not a comment'\n"
        'def h(): """kept: code follows on its line"""; return 2\n'
        "S = '\f\u2028'  # a form feed and a line separator inside a string\n"
        "T = 2  # the line after them\n"
    )
    assert code_digest.shipped(module).decode() == (
        '"""The module\'s docstring stays: commands print it."""\n'
        "\n"
        "X = 1\n"
        "\n"
        "def f(a):\n"
        '    ""\n'
        "\n"
        "    return a + 1\n"
        "class C:\n"
        '    ""\n'
        "    def g(self): return '# not a comment'\n"
        'def h(): """kept: code follows on its line"""; return 2\n'
        "S = '\f\u2028'\n"
        "T = 2\n"
    )
    data = tmp_path / "profile.json"
    data.write_text('{"# kept": 1}\n')
    assert code_digest.shipped(data) == data.read_bytes()
    module.write_text('"""First line, kept: a command prints it.\n\nWhy, at length."""\nX = 1\n')
    assert code_digest.shipped(module).decode() == (
        "'First line, kept: a command prints it.'\n\n\nX = 1\n"
    )


class _BlankDocstrings(ast.NodeTransformer):
    """Functions' and classes' docstrings as "", the module's as its first line, the rest of the
    tree as it is."""

    def _blank(self, node):
        self.generic_visit(node)
        first = node.body[0] if node.body else None
        docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        if docstring and isinstance(first.value.value, str):
            module = isinstance(node, ast.Module)
            first.value.value = first.value.value.split("\n", 1)[0] if module else ""
        return node

    visit_Module = visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _blank


def _statement_places(tree: ast.AST) -> list[tuple[str, int, int]]:
    return [
        (type(n).__name__, n.lineno, n.col_offset)
        for n in ast.walk(tree)
        if isinstance(n, ast.stmt)
    ]


def test_every_shipped_module_is_the_same_program_on_the_same_lines():
    """Each module of a same-pod A/B pod with MaxText's adapter (the largest closure) parses to
    the checkout's tree with docstrings blanked, keeps its lines, and ships again unchanged."""
    root = code_digest.default_root()
    engine = "rl_trainer_bench.engine.maxtext.adapter:MaxTextEngine"
    modules = [
        p for p in code_digest.code_files(root, engine, same_pod_ab=True) if p.suffix == ".py"
    ]
    assert len(modules) > 50
    for path in modules:
        source, shipped = path.read_bytes(), code_digest.shipped(path)
        tree, shipped_tree = ast.parse(source), ast.parse(shipped)
        assert ast.dump(shipped_tree) == ast.dump(_BlankDocstrings().visit(tree)), path
        assert _statement_places(shipped_tree) == _statement_places(tree), path
        assert shipped.count(b"\n") == source.count(b"\n"), path
        assert b"#" not in shipped or all(
            token.type != tokenize.COMMENT
            for token in tokenize.tokenize(io.BytesIO(shipped).readline)
        ), path
