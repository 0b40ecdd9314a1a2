"""What `rl-trainer-bench --help` and each command's `--help` cost: wall time and modules imported;
and how many imports in the package sit inside a function (lazy imports).

Usage: PYTHONPATH=. python benchmarks/cli_help_imports.py [REPEATS]
Each `--help` runs in a fresh interpreter (`python -m rl_trainer_bench.cli ... --help`), REPEATS
times (default 7); the wall time is the median over them, from before the interpreter starts to
its exit. The modules imported are counted in one more fresh interpreter that runs the same
`--help` through `cli.main` and then lists `sys.modules` against what the bare interpreter held
before the import of the CLI: all modules, the package's own, and whether numpy or JAX came in.
"""

import ast
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rl_trainer_bench"

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


def command_names() -> list[str]:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from rl_trainer_bench import cli; print(*(c[0] for c in cli.COMMANDS))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()


def median_seconds(command: list[str], repeats: int) -> float:
    """Median wall time of `command` in a fresh process, its output discarded."""
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def imported(argv: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", COUNT_IMPORTS, json.dumps(argv)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.splitlines()[-1])


def function_level_imports() -> list[str]:
    """`file:line` of every import statement inside a function of the package (each counted once,
    however deeply the functions around it nest)."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(function):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        found.add(f"{path.relative_to(ROOT)}:{node.lineno}")
    return sorted(found)


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    bare = median_seconds([sys.executable, "-c", "pass"], repeats)
    print(f"bare interpreter: median {bare * 1e3:.0f} ms (n={repeats})")
    print(f"{'argv':<28} {'median ms':>9} {'modules':>8} {'own':>4} numpy jax")
    for argv in [["--help"]] + [[name, "--help"] for name in command_names()]:
        seconds = median_seconds([sys.executable, "-m", "rl_trainer_bench.cli", *argv], repeats)
        counts = imported(argv)
        print(
            f"{' '.join(argv):<28} {seconds * 1e3:>9.0f} {counts['modules']:>8} {counts['own']:>4}"
            f" {'yes' if counts['numpy'] else 'no':>5} {'yes' if counts['jax'] else 'no':>3}"
        )
    lazy = function_level_imports()
    print(f"function-level imports in rl_trainer_bench/: {len(lazy)}")


if __name__ == "__main__":
    main()
