"""Shape rules the code keeps: no function over 60 lines, and the docs name only paths that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import rl_trainer_bench

PACKAGE = Path(rl_trainer_bench.__file__).parent
ROOT = PACKAGE.parent
LONGEST_FUNCTION = 60
DOCS = ("README.md", "BENCHMARKS.md", "docs/architecture.md", "docs/commands.md", "docs/engine.md")


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
