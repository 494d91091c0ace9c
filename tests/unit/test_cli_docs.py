"""docs/cli.md, the command-line reference, is generated from the argument parsers and current.

tools/gen_cli_docs.py renders the page from ``kiln.cli.main.build_parser()``; here it is
rendered in memory and must equal the committed page (run ``make docs`` when it does not), and
the renderer is checked to follow the parsers: a new option or help text changes the page.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from kiln.cli.main import COMMANDS, build_parser

_PATH = Path(__file__).resolve().parents[2] / "tools" / "gen_cli_docs.py"
_spec = importlib.util.spec_from_file_location("gen_cli_docs", _PATH)
gen = importlib.util.module_from_spec(_spec)
sys.modules.setdefault(_spec.name, gen)
_spec.loader.exec_module(gen)


def test_committed_page_is_current():
    assert gen.DOC.is_file(), f"{gen.DOC} is missing: run {gen.COMMAND}"
    assert gen.DOC.read_text() == gen.render(), (
        f"{gen.DOC} is stale (a command, option or help text changed): run {gen.COMMAND} and "
        "commit it")


def test_every_command_and_option_is_on_the_page():
    page = gen.render()
    parser = build_parser()
    names = [name for name, _, _ in gen._subcommands(parser)]
    assert names == [c.replace("_", "-") for c in COMMANDS]
    for name, _, sub in gen._subcommands(parser):
        assert f"\n## kiln {name}\n" in page
        for action in sub._actions:
            for opt in action.option_strings:
                if opt not in ("-h", "--help"):
                    assert f"`{opt}" in page or f", {opt}" in page, (name, opt)
    assert "`--dim NAME=LO..HI[:DIV]` | bounds of a symbolic dim" in page


def test_the_page_follows_the_parsers():
    parser = argparse.ArgumentParser(prog="kiln", description="Fake.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("go", help="go somewhere", description="Go somewhere far.")
    p.add_argument("where", help="the place")
    p.add_argument("--speed", type=int, default=3, help="how fast (default: %(default)s)")
    p.add_argument("--mode", choices=("a", "b|c"), help="a mode")
    page = gen.render(parser)
    assert "## kiln go\n\nGo somewhere.\n\nGo somewhere far.\n" in page
    assert "usage: kiln go [-h] [--speed SPEED] [--mode {a,b|c}] where" in page
    assert "| `--speed SPEED` | how fast (default: 3) |" in page
    assert "| `--mode {a,b\\|c}` | a mode |" in page  # a | in a cell is escaped
    assert "- [`kiln go`](#kiln-go): go somewhere" in page
    p.add_argument("--new", action="store_true", help="new")
    assert gen.render(parser) != page


def test_usage_does_not_depend_on_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    narrow = gen.render()
    monkeypatch.setenv("COLUMNS", "200")
    assert gen.render() == narrow
