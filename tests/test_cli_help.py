"""Every command's and subcommand's --help renders (a `%` in a help string is a traceback in argparse)."""

from __future__ import annotations

import argparse

import pytest

from h2.cli import ditorch, heteroauto, main, rank

PARSERS = {
    "h2": main.build_parser, "heteroauto": heteroauto._parser, "ditorch": ditorch.build_parser,
    "h2.cli.rank": rank.build_parser
}


def every_parser(parser: argparse.ArgumentParser, name: str):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from every_parser(sub, f"{name} {sub_name}")


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_every_help_text_renders(command):
    rendered = [name for name, parser in every_parser(PARSERS[command](), command) if parser.format_help()]
    assert len(rendered) >= 1
