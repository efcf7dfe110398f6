"""`kinetic-airflow --help` and every subcommand's help are plain text: the modules' docstrings are
reStructuredText, the terminal shows them without markup (kinetic_airflow/cli_text.py)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from kinetic_airflow.cli.main import build_parser
from kinetic_airflow.cli.text import plain

MARKUP = re.compile(r"``|:[a-z]+:`|(?<![\w`])`[^`\s][^`]*`")


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, (*path, name))


def test_every_help_text_is_plain():
    seen = []
    for path, parser in _commands(build_parser()):
        text = parser.format_help()
        assert not MARKUP.search(text), (path, MARKUP.search(text)[0], text)
        seen.append(" ".join(path))
    assert {"", "jobs", "jobs list", "jobs cancel", "gc", "reproduce", "image", "check"} <= set(seen)


def test_the_commands_say_what_they_do():
    described = {" ".join(p): parser.description for p, parser in _commands(build_parser())}
    for command in ("", "accelerators", "check", "show", "jobs", "gc", "reproduce", "image"):
        assert described[command], f"kinetic-airflow {command} --help has no description"
    assert described[""].startswith("kinetic-airflow: small command-line helpers")
    assert "kinetic-airflow gc --older-than 30d" in described[""]  # the command table keeps its layout
    assert "KINETIC_OUTPUT_DIR contents" in described["gc"] and "--skip-airflow-checks" in described["gc"]


def test_the_installed_command_prints_plain_help():
    script = Path(sys.executable).parent / "kinetic-airflow"
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True, env=os.environ)
    assert "kinetic-airflow: small command-line helpers" in out.stdout and "``" not in out.stdout


def test_plain_removes_inline_markup_only():
    assert plain("``a`` and :class:`~x.Y` and `b`, then ``c d``") == "a and x.Y and b, then c d"
    assert plain("    keep\n      indentation\n") == "keep\n  indentation"
