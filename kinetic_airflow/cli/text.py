"""Plain-text help for the command line.

The command modules' docstrings are reStructuredText, written for readers of the code and the
API docs; a terminal would show their markup literally (double backquotes, roles). The help a
command prints is the same text without it, laid out as written (its example lines kept).
"""

from __future__ import annotations

import argparse
import re
import textwrap
from typing import Any

__all__ = ["described", "plain"]

_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?([^`]+)`")  # :class:`X`, :py:func:`~x.y`
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)
_INTERPRETED = re.compile(r"(?<![`\w])`([^`\n]+)`(?![`\w])")


def plain(text: str | None) -> str:
    """``text`` without reStructuredText inline markup: ````x```` and ```x``` become ``x``,
    ``:role:`x``` becomes ``x``; indentation and line breaks are kept."""
    if not text:
        return ""
    text = _ROLE.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    text = _INTERPRETED.sub(r"\1", text)
    return textwrap.dedent(text).strip()


def described(doc: str | None) -> dict[str, Any]:
    """``add_parser`` / ``ArgumentParser`` keywords that show ``doc`` as a command's help text."""
    return {"description": plain(doc), "formatter_class": argparse.RawDescriptionHelpFormatter}
