"""What `rl-trainer-bench --help` and each command's `--help` cost: wall time and modules imported;
and how many imports in the package sit inside a function (lazy imports).

Usage: PYTHONPATH=. python benchmarks/cli/cli_help_imports.py [--repeats N] [--before TREE]
Each `--help` runs in a fresh interpreter (`python -m rl_trainer_bench.cli ... --help`), N times
(default 7); the wall time is the median over them, from before the interpreter starts to its exit.
With `--before TREE` (another checkout of the project, e.g. `git archive REV | tar -x -C TREE`),
each `--help` runs in TREE and in this checkout by turns, so a load that comes and goes on the host
falls on both alike, and both are shown. The modules imported are counted in one more fresh
interpreter that runs the same `--help` through `cli.main` and lists `sys.modules` against what the
bare interpreter held before the import of the CLI: all modules, and the package's own.

Remakes BENCHMARKS.md's row "CLI start-up"; benchmarks/reports/cli-startup_cpu_2026-12-04.md.
"""

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Runs `cli.main(argv)` and prints what it imported, as JSON, on the last line of stdout.
COUNT_IMPORTS = """
import contextlib, io, json, sys
before = set(sys.modules)
from rl_trainer_bench import cli
with contextlib.redirect_stdout(io.StringIO()):
    cli.main(json.loads(sys.argv[1]))
new = set(sys.modules) - before
print(json.dumps({
    "modules": len(new),
    "own": sum(name.startswith("rl_trainer_bench.") for name in new),
    "numpy": "numpy" in new,
    "jax": "jax" in new,
}))
"""


def in_tree(tree: Path, command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """`command` run with `tree`'s package first on the path, from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(command, cwd=tree, env=env, check=True, **kwargs)


def command_names(tree: Path) -> list[str]:
    listing = "from rl_trainer_bench import cli; print(*(c[0] for c in cli.COMMANDS))"
    done = in_tree(tree, [sys.executable, "-c", listing], capture_output=True, text=True)
    return done.stdout.split()


def median_ms(trees: list[Path], argv: list[str], repeats: int) -> list[float]:
    """Median wall time of `argv`'s `--help` in each tree, the trees taking turns."""
    seconds: list[list[float]] = [[] for _ in trees]
    for _ in range(repeats):
        for times, tree in zip(seconds, trees, strict=True):
            start = time.perf_counter()
            in_tree(tree, [sys.executable, *argv], stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
    return [statistics.median(times) * 1e3 for times in seconds]


def imported(tree: Path, argv: list[str]) -> str:
    """`modules (own)`, and numpy or JAX where the `--help` imported them."""
    done = in_tree(
        tree,
        [sys.executable, "-c", COUNT_IMPORTS, json.dumps(argv)],
        capture_output=True,
        text=True,
    )
    counts = json.loads(done.stdout.splitlines()[-1])
    heavy = [name for name in ("numpy", "jax") if counts[name]]
    return f"{counts['modules']} ({counts['own']})" + "".join(f", {name}" for name in heavy)


def function_level_imports(tree: Path) -> int:
    """How many import statements sit inside a function of the package (each counted once,
    however deeply the functions around it nest)."""
    found = set()
    for path in sorted((tree / "rl_trainer_bench").rglob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(function):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        found.add((path, node.lineno))
    return len(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--before", type=Path, help="another checkout, timed by turns with this")
    args = parser.parse_args()
    trees = [args.before.resolve(), ROOT] if args.before else [ROOT]
    names = [str(tree) for tree in trees]
    print("| argv | " + " | ".join(f"{n}: ms | {n}: modules (own)" for n in names) + " |")
    bare = median_ms(trees, ["-c", "pass"], args.repeats)
    print("| bare interpreter | " + " | ".join(f"{ms:.0f} | -" for ms in bare) + " |")
    for argv in [["--help"]] + [[name, "--help"] for name in command_names(ROOT)]:
        times = median_ms(trees, ["-m", "rl_trainer_bench.cli", *argv], args.repeats)
        cells = [
            f"{ms:.0f} | {imported(tree, argv)}" for ms, tree in zip(times, trees, strict=True)
        ]
        print(f"| `{' '.join(argv)}` | " + " | ".join(cells) + " |")
    counts = " | ".join(f"{function_level_imports(tree)} | -" for tree in trees)
    print(f"| function-level imports in `rl_trainer_bench/` | {counts} |")


if __name__ == "__main__":
    main()
