"""Imports point one way, as docs/architecture.md says: the rule is read from that page and every
module's imports (lazy ones inside functions too) are checked against it, and no import chain
leads back to the module it starts from. The page's table of rooms says what each room reads
outside itself; that column is checked against the same imports, both ways."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import rl_trainer_bench

PACKAGE = Path(rl_trainer_bench.__file__).parent
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def rule_ranks(text: str) -> dict[str, int]:
    """{room: rank} from the page's `Imports point one way:` sentence; rank 0 is the rightmost."""
    match = re.search(r"Imports point one way: (.*?)\.\n", text, re.S)
    assert match, "docs/architecture.md has no 'Imports point one way:' sentence"
    groups = [re.findall(r"`(\w+)`", group) for group in match.group(1).split("→")]
    assert all(groups), f"an empty step in the rule: {match.group(1)!r}"
    named = [room for group in groups for room in group]
    assert len(named) == len(set(named)), f"a room named twice in the rule: {match.group(1)!r}"
    return {room: len(groups) - 1 - i for i, group in enumerate(groups) for room in group}


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts).removesuffix(".__init__")
        if "." in name:  # the package's own empty __init__ belongs to no room
            names[name] = path
    return names


def imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules `path` imports anywhere in it (`from P import m` counts `P.m`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in modules else node.module)
    return {name for name in found if name in modules}


def room_of(module: str) -> str:
    """`ab` for rl_trainer_bench.ab.plan; the module's own name at the top level (`cli`, `io`)."""
    return module.split(".")[1]


# Read by every room left of it for its error types; the page's reads column leaves it out.
EVERYONES = "rl_trainer_bench.errors"


def table_room(module: str) -> str:
    """The room's name in the page's table: `engine/` for rl_trainer_bench.engine.builtin.model, `top
    level` for the package's own modules (`cli`, `io`), which read one another freely."""
    parts = module.split(".")
    return f"{parts[1]}/" if len(parts) > 2 else "top level"


def reads_column(text: str) -> dict[str, set[str]]:
    """{room: the modules and rooms its `reads` cell names}, e.g. {"launch/": {"config/",
    "bench/plan.py", "io.py"}}: every backquoted path ending in `/` or `.py` in the cell, outside
    the parentheses that say which of the room's modules reads it, and why."""
    lines = text.split("| room | its one job | reads | never |\n", 1)[1].splitlines()
    column = {}
    for line in lines[1:]:
        if not line.startswith("| "):
            break
        room, _, reads, _ = (cell.strip() for cell in line.strip("| ").split(" | "))
        named = re.sub(r"\([^()]*\)", "", reads)
        column[room.strip("`")] = set(re.findall(r"`([\w/]+(?:/|\.py))`", named))
    return column


def names_for(module: str) -> set[str]:
    """The entries of a reads cell that cover `module`: rl_trainer_bench.preflight.aot.check is
    covered by `preflight/`, `preflight/aot/` and `preflight/aot/check.py`; the top level's io by
    `io.py`."""
    parts = module.split(".")[1:]
    folders = {"/".join(parts[:i]) + "/" for i in range(1, len(parts))}
    return {*folders, "/".join(parts) + ".py"}


def reads_problems(column: dict[str, set[str]], graph: dict[str, set[str]]) -> list[str]:
    """Imports of another room that the room's cell does not name, and entries no import reads."""
    problems, used = [], {room: set() for room in column}
    for module, targets in sorted(graph.items()):
        room = table_room(module)
        for target in sorted(targets):
            if table_room(target) == room or target == EVERYONES:
                continue
            named = names_for(target) & column.get(room, set())
            if not named:
                problems.append(f"{room} reads {target} ({module}): not in its reads cell")
            used.setdefault(room, set()).update(named)
    for room, entries in sorted(column.items()):
        problems += [
            f"{room} names {entry}: no module of it imports that"
            for entry in sorted(entries - used[room])
        ]
    return problems


def violations(ranks: dict[str, int], graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for module, targets in sorted(graph.items()):
        source = room_of(module)
        for target in sorted(targets):
            goal = room_of(target)
            if goal == source:
                continue
            if source not in ranks or goal not in ranks:
                problems.append(f"{module} -> {target}: room {source} or {goal} not in the rule")
            elif ranks[goal] >= ranks[source]:
                problems.append(f"{module} -> {target}: {source} may not import {goal}")
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle a depth-first walk meets (one per back edge)."""
    found, state, path = [], {}, []

    def visit(module: str) -> None:
        state[module], _ = "open", path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        state[module], _ = "done", path.pop()

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imported_modules(path, modules) - {name} for name, path in modules.items()}


def test_the_rule_names_every_room_of_the_package_once():
    ranks = rule_ranks(ARCHITECTURE.read_text())
    rooms = {room_of(name) for name in module_names()}
    assert rooms <= set(ranks), f"rooms missing from the rule: {sorted(rooms - set(ranks))}"


def test_every_import_points_down_the_rule(graph):
    ranks = rule_ranks(ARCHITECTURE.read_text())
    assert violations(ranks, graph) == []


def test_no_chain_of_imports_returns_to_its_start(graph):
    assert cycles(graph) == []


def test_the_reads_column_names_what_each_room_imports_and_nothing_else(graph):
    column = reads_column(ARCHITECTURE.read_text())
    rooms = {table_room(name) for name in module_names()}
    assert set(column) == rooms
    assert reads_problems(column, graph) == []


def test_the_reads_check_catches_a_missing_and_a_wrong_entry():
    """On a table and a graph written here: launch reads bench.plan unnamed, names io.py unread."""
    text = (
        "| room | its one job | reads | never |\n| --- | --- | --- | --- |\n"
        "| `launch/` | render | `config/` (`knobs.py`: parsers), `io.py` | import JAX |\n"
        "| top level | cli | one another | - |\n\nAfter the table.\n"
    )
    column = reads_column(text)
    assert column == {"launch/": {"config/", "io.py"}, "top level": set()}
    graph = {
        "rl_trainer_bench.launch.render": {
            "rl_trainer_bench.config.knobs",
            "rl_trainer_bench.bench.plan",
            "rl_trainer_bench.errors",
            "rl_trainer_bench.launch.names",
        },
        "rl_trainer_bench.cli": {"rl_trainer_bench.errors"},
    }
    assert reads_problems(column, graph) == [
        "launch/ reads rl_trainer_bench.bench.plan (rl_trainer_bench.launch.render): not in its"
        " reads cell",
        "launch/ names io.py: no module of it imports that",
    ]


def test_the_checks_catch_an_arrow_the_wrong_way_and_a_circle():
    """The checks themselves, on a graph written here: engine importing bench, and a -> b -> a."""
    ranks = rule_ranks("Imports point one way: `bench` → (`payload`, `config`) → `engine`.\n")
    assert ranks == {"bench": 2, "payload": 1, "config": 1, "engine": 0}
    graph = {
        "rl_trainer_bench.engine.builtin.model": {"rl_trainer_bench.bench.step"},
        "rl_trainer_bench.payload.build": {"rl_trainer_bench.config.knobs"},
        "rl_trainer_bench.bench.a": {"rl_trainer_bench.bench.b"},
        "rl_trainer_bench.bench.b": {"rl_trainer_bench.bench.a", "rl_trainer_bench.engine.x"},
    }
    assert violations(ranks, graph) == [
        "rl_trainer_bench.engine.builtin.model -> rl_trainer_bench.bench.step: engine may not import bench",
        "rl_trainer_bench.payload.build -> rl_trainer_bench.config.knobs: payload may not import config",
    ]
    assert cycles(graph) == [
        ["rl_trainer_bench.bench.a", "rl_trainer_bench.bench.b", "rl_trainer_bench.bench.a"]
    ]
