"""Every command has a page, the page opens with the synopsis its `--help` prints, and it names
every flag the command's parser takes, outside that synopsis: a flag added to a parser and not
described, or a page left with a synopsis the parser no longer prints, fails here.

The parsers are the real ones of `rl_trainer_bench/cli.py`'s table, built as `--help` builds them
(no command's parser imports JAX)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from rl_trainer_bench import cli
from rl_trainer_bench.config.knobs import add_driver_knob_arguments

DOCS = Path(__file__).resolve().parents[1] / "docs"
HELP = ("-h", "--help")


def command_pages(index: str) -> dict[str, str]:
    """command -> page, from the table of docs/commands.md: `| `name` | ... | [page](page) |`."""
    pages = {}
    for line in index.splitlines():
        match = re.match(r"\| `([\w-]+)` \|.*\]\(([\w.-]+\.md)\) \|$", line)
        if match:
            pages[match.group(1)] = match.group(2)
    return pages


def parser_of(name: str) -> argparse.ArgumentParser:
    """The command's parser, as `rl-trainer-bench NAME --help` builds it."""
    (command,) = [c for c in cli.COMMANDS if c.name == name]
    parser = argparse.ArgumentParser(prog=f"rl-trainer-bench {name}", description=command.help)
    cli.function(command.arguments)(parser)
    return parser


def flags(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string the parser takes, help aside."""
    return [
        option
        for action in parser._actions
        for option in action.option_strings
        if option not in HELP
    ]


def words(text: str) -> str:
    return " ".join(text.split())


def opening_synopses(page: str) -> list[str]:
    """The code blocks before the page's first section: its synopses."""
    head = page.split("\n## ", 1)[0]
    return [words(block) for block in re.findall(r"```text\n(.*?)```", head, re.S)]


def body(page: str) -> str:
    """The page without its opening synopses, where each flag must be described."""
    head, _, rest = page.partition("\n## ")
    return re.sub(r"```text\n.*?```", "", head, flags=re.S) + rest


def undescribed(parser: argparse.ArgumentParser, page: str) -> list[str]:
    text = body(page)
    return [flag for flag in flags(parser) if not re.search(rf"(?<![\w-]){flag}(?![\w-])", text)]


PAGES = command_pages((DOCS / "commands.md").read_text())


def test_every_command_has_a_page_that_exists():
    assert sorted(PAGES) == sorted(command.name for command in cli.COMMANDS)
    assert sorted(page for page in set(PAGES.values()) if not (DOCS / page).exists()) == []


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_page_opens_with_the_synopsis_help_prints(name, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    usage = words(parser_of(name).format_usage())
    assert usage in opening_synopses((DOCS / PAGES[name]).read_text())


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_page_describes_every_flag(name):
    assert undescribed(parser_of(name), (DOCS / PAGES[name]).read_text()) == []


def test_the_drivers_page_describes_bench_drivers_flags():
    """bench_driver.py, what a pod runs, takes the driver's knob flags as `run` does."""
    parser = argparse.ArgumentParser(prog="bench_driver")
    add_driver_knob_arguments(parser)
    page = (DOCS / PAGES["run"]).read_text()
    assert "bench_driver.py" in page
    assert undescribed(parser, page) == []


def test_the_checks_find_a_stale_synopsis_and_an_undescribed_flag():
    parser = argparse.ArgumentParser(prog="tool")
    parser.add_argument("--kept")
    parser.add_argument("--dropped", "--alias")
    page = "# tool\n\n```text\nusage: tool [-h]\n    [--kept KEPT]\n```\n\n## Flags\n\n`--kept` and `--alias`\n"
    assert opening_synopses(page) == ["usage: tool [-h] [--kept KEPT]"]
    assert words(parser.format_usage()) not in opening_synopses(page)
    assert undescribed(parser, page) == ["--dropped"]
    assert undescribed(parser, page.replace("## Flags", "## Flags\n\n`--dropped`")) == []
    assert command_pages("| `tool` | does | [tool.md](tool.md) |") == {"tool": "tool.md"}
