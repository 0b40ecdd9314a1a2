"""Shape rules the code keeps: no function over 60 lines, an import inside a function only with its
reason beside it and never in the step loop's modules, and the docs name only paths that exist."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import rl_trainer_bench

PACKAGE = Path(rl_trainer_bench.__file__).parent
ROOT = PACKAGE.parent
LONGEST_FUNCTION = 60
# The modules a timed step runs through: an import there would be paid inside the step.
STEP_LOOP = (
    "bench/step.py",
    "bench/worker.py",
    "bench/clock.py",
    "bench/device_timeline.py",
    "bench/step_record.py",
    "bench/results_file.py",
    "engine/builtin/jax_engine.py",
)
# Every page a reader follows: the README, the figures, docs/, and benchmarks/'s reports and READMEs.
DOCS = tuple(
    dict.fromkeys(
        str(page.relative_to(ROOT))
        for page in (
            ROOT / "README.md",
            ROOT / "BENCHMARKS.md",
            *sorted((ROOT / "docs").glob("*.md")),
            *sorted((ROOT / "benchmarks").glob("*.md")),
            *sorted((ROOT / "benchmarks").glob("*/README.md")),
            *sorted((ROOT / "benchmarks" / "reports").glob("*.md")),
        )
    )
)


def long_functions(source: str, limit: int = LONGEST_FUNCTION) -> list[tuple[str, int]]:
    """(name, lines) of every function in `source` longer than `limit` lines, decorators included."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lines = node.end_lineno - start + 1
            if lines > limit:
                found.append((node.name, lines))
    return found


def function_level_imports(source: str) -> list[ast.stmt]:
    """Every import statement inside a function of `source`, in line order."""
    found = {
        node.lineno: node
        for function in ast.walk(ast.parse(source))
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(function)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    }
    return [found[line] for line in sorted(found)]


def imports_without_reason(source: str) -> list[int]:
    """Lines of the imports inside a function that give no reason for being there: a comment on
    the import itself or on the line before it (a `try:` with one counts); an import right after
    another (blank lines aside) shares that one's reason."""
    lines = source.splitlines()
    commented = {
        token.start[0]
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }
    reasoned: set[int] = set()
    missing = []
    for node in function_level_imports(source):
        if commented & set(range(node.lineno, node.end_lineno + 1)):
            reasoned.add(node.end_lineno)
            continue
        before = node.lineno - 1
        while before > 0 and not lines[before - 1].strip():
            before -= 1
        if before in commented or before in reasoned:
            reasoned.add(node.end_lineno)
        else:
            missing.append(node.lineno)
    return missing


def missing_links(markdown: str, folder: Path) -> list[str]:
    """Relative link targets in `markdown` (`[text](path)`, anchors dropped) that do not exist."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", markdown)
    return [t for t in targets if "://" not in t and not (folder / t).exists()]


def test_no_function_is_longer_than_60_lines():
    found = {
        str(path.relative_to(ROOT)): long_functions(path.read_text())
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    assert {path: functions for path, functions in found.items() if functions} == {}


def test_every_import_inside_a_function_says_why():
    """An import is made at the top of its module unless it must wait (JAX kept from a command
    that runs without it, an optional package, a private module); the reason is written beside it."""
    found = {
        str(path.relative_to(ROOT)): imports_without_reason(path.read_text())
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    assert {path: lines for path, lines in found.items() if lines} == {}


def test_no_import_is_made_inside_the_step_loop():
    found = {name: function_level_imports((PACKAGE / name).read_text()) for name in STEP_LOOP}
    assert {name: [n.lineno for n in nodes] for name, nodes in found.items() if nodes} == {}


def test_every_link_in_the_docs_leads_somewhere():
    broken = {name: missing_links((ROOT / name).read_text(), (ROOT / name).parent) for name in DOCS}
    assert {name: links for name, links in broken.items() if links} == {}


def test_every_package_path_the_docs_name_exists():
    named = {
        path
        for name in DOCS
        for path in re.findall(
            r"`(rl_trainer_bench/[\w/.]+|docs/[\w.]+\.md)`", (ROOT / name).read_text()
        )
    }
    assert sorted(path for path in named if not (ROOT / path).exists()) == []


def test_the_checks_find_a_long_function_and_a_dead_link(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    assert long_functions(f"def short():\n{body}\n") == [("short", 61)]
    assert long_functions("def f():\n    return 1\n") == []
    (tmp_path / "here.md").write_text("")
    text = "[a](here.md) [b](gone.md#part) [c](https://example.com/x)"
    assert missing_links(text, tmp_path) == ["gone.md"]


def test_the_import_checks_find_an_import_without_its_reason():
    source = (
        "import os\n"
        "def bare():\n"
        "    import json\n"
        "def beside():\n"
        "    import json  # a reason\n"
        "def above():\n"
        "    # a reason\n"
        "    import json\n"
        "\n"
        "    from os import path\n"
        "    json.use()\n"
        "    import csv\n"
    )
    assert [node.lineno for node in function_level_imports(source)] == [3, 5, 8, 10, 12]
    assert imports_without_reason(source) == [3, 12]
