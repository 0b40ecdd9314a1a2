"""The record stays readable: BENCHMARKS.md the current figures only (at most 40 KB, at most 20
headline rows, each with its figure, machine and date, kind, command and report), README at most
6 KB, no page of docs/ over 30 KB; and README's test command is the one CI runs.

History belongs to the dated reports and to git: a page that grows past its size has taken in
what belongs there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KB = 1000
KINDS = ("MEASURED", "INFERRED", "ESTIMATE", "SIMULATED", "bound")


def headline_rows(benchmarks: str) -> list[list[str]]:
    """The cells of each row of the table under `## Headline`, its header and rule left out."""
    section = benchmarks.split("\n## Headline\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows[2:]]


def row_faults(row: list[str]) -> list[str]:
    """What a headline row lacks: six cells, a kind, a command, a report that exists."""
    if len(row) != 6:
        return [f"{len(row)} cells, not 6"]
    _question, figure, machine, kind, command, report = row
    faults = []
    if not figure or not machine:
        faults.append("no figure or machine")
    if not any(word in kind for word in KINDS):
        faults.append(f"kind {kind!r}")
    if "`" not in command:
        faults.append("no command")
    reports = re.findall(r"\]\((benchmarks/reports/[\w.-]+\.md)\)", report)
    if not reports or not all((ROOT / path).exists() for path in reports):
        faults.append(f"report {report!r}")
    return faults


def test_benchmarks_md_is_the_current_figures_only():
    text = (ROOT / "BENCHMARKS.md").read_text()
    assert len(text.encode()) <= 40 * KB
    rows = headline_rows(text)
    assert 0 < len(rows) <= 20
    assert {row[0]: row_faults(row) for row in rows if row_faults(row)} == {}


def test_readme_and_every_docs_page_keep_their_size():
    assert len((ROOT / "README.md").read_bytes()) <= 6 * KB
    too_big = {
        page.name: len(page.read_bytes())
        for page in sorted((ROOT / "docs").glob("*.md"))
        if len(page.read_bytes()) > 30 * KB
    }
    assert too_big == {}


def test_readmes_test_command_is_the_one_ci_runs():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Run the tests", 1)[1]
    (block,) = re.findall(r"```bash\n(.*?)\n```", section.split("\n## ", 1)[0], re.S)
    readme_pytest = block.split("&&")[-1].strip()
    ci = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert readme_pytest.startswith(".venv/bin/python -m pytest")
    assert ci[-1] == readme_pytest


def test_the_checks_find_a_row_without_its_kind_command_or_report():
    gone = "benchmarks/reports/" + "gone.md"  # in two: no file cites a report that is not there
    table = (
        "# B\n\n## Headline\n\n| q | f | m | k | c | r |\n| --- | --- | --- | --- | --- | --- |\n"
        "| step | 1 s | chip, today | MEASURED | `run` | [r](benchmarks/reports/README.md) |\n"
        f"| peak | 2 GiB | chip | guessed | none | [r]({gone}) |\n\n## Next\n"
    )
    good, bad = headline_rows(table)
    assert row_faults(good) == []
    assert row_faults(bad) == [
        "kind 'guessed'",
        "no command",
        f"report '[r]({gone})'",
    ]
