"""benchmarks/ and its record agree both ways: every script BENCHMARKS.md, a report or a doc names
exists, BENCHMARKS.md names every maintained script (a script outside `closed/` that it does not
name is a suite nobody keeps), and every script names the row or report it remakes.

A figure is only as good as the command that remakes it: a renamed script leaves the record's
commands dead, and a script no page names is a figure nobody will look for."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
# Folders of benchmarks/ that hold no maintained script: the raw results the reports cite, the
# reports, and the probes whose question is closed (their README names them).
NOT_SUITES = ("results", "reports", "closed")
SCRIPT = re.compile(r"benchmarks/[\w./-]+?\.(?:py|sh)\b")
REPORT = re.compile(r"benchmarks/reports/[\w.-]+\.md")


def record_pages(root: Path) -> list[Path]:
    """The Markdown pages that name scripts: BENCHMARKS.md, README.md, docs/, and benchmarks/'s own
    pages (the reports and the READMEs), not the raw results."""
    pages = [root / "BENCHMARKS.md", root / "README.md", *sorted((root / "docs").glob("*.md"))]
    pages += [
        path
        for path in sorted((root / "benchmarks").rglob("*.md"))
        if "results" not in path.relative_to(root / "benchmarks").parts
    ]
    return [page for page in pages if page.exists()]


def named_scripts(text: str) -> set[str]:
    """Every `benchmarks/.../name.py|sh` path the text names."""
    return set(SCRIPT.findall(text))


def scripts(root: Path) -> list[Path]:
    """Every script under benchmarks/, the raw results and the reports left out."""
    found = []
    for path in sorted((root / "benchmarks").rglob("*")):
        parts = path.relative_to(root / "benchmarks").parts
        if path.suffix in (".py", ".sh") and parts[0] not in ("results", "reports"):
            found.append(path)
    return found


def maintained(root: Path) -> list[Path]:
    """The scripts of the suites: every script but the closed probes."""
    return [
        p for p in scripts(root) if p.relative_to(root / "benchmarks").parts[0] not in NOT_SUITES
    ]


def missing_scripts(root: Path) -> dict[str, list[str]]:
    """Per page, the scripts it names that do not exist."""
    missing = {}
    for page in record_pages(root):
        gone = sorted(s for s in named_scripts(page.read_text()) if not (root / s).exists())
        if gone:
            missing[str(page.relative_to(root))] = gone
    return missing


def unnamed_suites(root: Path) -> list[str]:
    """The maintained scripts BENCHMARKS.md does not name."""
    named = named_scripts((root / "BENCHMARKS.md").read_text())
    return [
        str(p.relative_to(root)) for p in maintained(root) if str(p.relative_to(root)) not in named
    ]


def opening(path: Path) -> str:
    """A script's own account of itself: a Python module's docstring, a shell script's first
    block of comments."""
    text = path.read_text()
    if path.suffix == ".py":
        return ast.get_docstring(ast.parse(text)) or ""
    lines = text.splitlines()
    lines = lines[1:] if lines and lines[0].startswith("#!") else lines
    block = []
    for line in lines:
        if not line.startswith("#"):
            break
        block.append(line)
    return "\n".join(block)


def test_every_script_the_record_names_exists():
    assert missing_scripts(ROOT) == {}


def test_benchmarks_md_names_every_maintained_script():
    assert maintained(ROOT), "no suite found under benchmarks/"
    assert unnamed_suites(ROOT) == []


def test_every_script_names_the_row_or_report_it_remakes():
    silent = [
        str(path.relative_to(ROOT))
        for path in scripts(ROOT)
        if "BENCHMARKS.md" not in opening(path) and not REPORT.search(opening(path))
    ]
    assert silent == []


def test_every_closed_probe_is_in_its_folders_readme():
    readme = (BENCHMARKS / "closed" / "README.md").read_text()
    closed = [p for p in scripts(ROOT) if p.parent.name == "closed"]
    assert [
        str(p.relative_to(ROOT)) for p in closed if str(p.relative_to(ROOT)) not in readme
    ] == []


def test_every_report_the_code_and_the_record_cite_exists():
    """Code comments, tests and pages cite reports by path; a renamed report leaves them dead."""
    sources = [
        *ROOT.joinpath("rl_trainer_bench").rglob("*.py"),
        *ROOT.joinpath("tests").rglob("*.py"),
        *scripts(ROOT),
        *record_pages(ROOT),
        ROOT / "pyproject.toml",
    ]
    cited = {report for path in sources for report in REPORT.findall(path.read_text())}
    assert cited, "no report cited anywhere"
    assert sorted(report for report in cited if not (ROOT / report).exists()) == []


def test_the_checks_find_a_dead_script_and_an_unnamed_suite(tmp_path):
    (tmp_path / "docs").mkdir()
    suite = tmp_path / "benchmarks" / "chip"
    suite.mkdir(parents=True)
    (suite / "kept.py").write_text('"""Remakes BENCHMARKS.md\'s row."""\n')
    (suite / "stray.py").write_text('"""Nobody names this one."""\n')
    (tmp_path / "README.md").write_text("")
    (tmp_path / "BENCHMARKS.md").write_text(
        "`benchmarks/chip/kept.py`, then `benchmarks/chip/gone.sh --flag`"
    )
    assert missing_scripts(tmp_path) == {"BENCHMARKS.md": ["benchmarks/chip/gone.sh"]}
    assert unnamed_suites(tmp_path) == ["benchmarks/chip/stray.py"]
    assert "BENCHMARKS.md" in opening(suite / "kept.py")
