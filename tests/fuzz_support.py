"""Shared pieces of the property tests over the command line: example counts, running a command
in-process, the tally of outcomes, and random trees.

CI draws `RTB_FUZZ_EXAMPLES` examples per property (default 25, a few seconds each); a reliability
run sets it to 1000 or more and `RTB_FUZZ_TALLY=FILE.json` to record, per entry point, how many
inputs were tried and how each ended (benchmarks/reports/reliability_cpu_2026-12-03.md).
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from rl_trainer_bench import cli

EXAMPLES = int(os.environ.get("RTB_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TALLY: collections.Counter = collections.Counter()


def run_command(entry: str, argv: list[str]) -> int:
    """Exit status of `rl-trainer-bench ARGV` run in-process; fails on a traceback or a status
    other than 0, 1 or 2, and on an error that is not at least one line on stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exit_:  # argparse's own errors
            code = exit_.code
    assert code in (0, 1, 2), (argv, code)
    if code == 2:
        assert err.getvalue().strip() and "Traceback" not in err.getvalue(), err.getvalue()
    TALLY[entry, code] += 1
    return code


def assert_no_partial_output(folder: Path, inputs: set[str], output: str, code: int) -> None:
    """The folder holds the inputs, and the output only after success: no temporary, no half file."""
    present = {p.name for p in folder.iterdir()}
    assert present <= inputs | {output}, present - inputs - {output}
    if code != 0:
        assert output not in present, f"exit {code} left {output} behind"


def write_tally() -> None:
    """Add this run's counts to RTB_FUZZ_TALLY (a JSON file), when it is set."""
    target = os.environ.get("RTB_FUZZ_TALLY")
    if not target:
        return
    path = Path(target)
    totals = json.loads(path.read_text()) if path.is_file() else {}
    for (entry, code), count in TALLY.items():
        row = totals.setdefault(entry, {"0": 0, "1": 0, "2": 0})
        row[str(code)] += count
    path.write_text(json.dumps(totals, indent=1, sort_keys=True) + "\n")
    TALLY.clear()


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)


def mutate(tree: object, data: st.DataObject, edits: int = 3) -> object:
    """`tree` with up to `edits` random subtrees replaced by random values or removed."""
    for _ in range(data.draw(st.integers(1, edits))):
        tree = _mutate_once(tree, data)
    return tree


def _mutate_once(node: object, data: st.DataObject) -> object:
    children = (
        list(node.items())
        if isinstance(node, dict)
        else list(enumerate(node))
        if isinstance(node, list)
        else []
    )
    if not children or data.draw(st.integers(0, 5)) == 0:
        return data.draw(JSON_VALUES)
    key, child = data.draw(st.sampled_from(children))
    copy = dict(node) if isinstance(node, dict) else list(node)
    if data.draw(st.integers(0, 7)) == 0:
        del copy[key]
    else:
        copy[key] = _mutate_once(child, data)
    return copy
