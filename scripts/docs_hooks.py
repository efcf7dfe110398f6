"""MkDocs hooks (mkdocs.yml ``hooks:``): pages whose tables are rendered from the code.

The options reference is ``kinetic_airflow.options.reference_markdown()``, rendered where
``docs/reference/options.md`` holds the marker below: the option table is the only place an
option is spelled, so the page cannot drift from it.
"""

from __future__ import annotations

from typing import Any

MARKER = "<!-- kinetic:options-reference -->"


def render(markdown: str) -> str:
    """``markdown`` with the marker replaced by the options reference."""
    if MARKER not in markdown:
        return markdown
    from kinetic_airflow.options import reference_markdown  # only for the page that asks for it

    # The reference's own headings sit under the page's title.
    return markdown.replace(MARKER, reference_markdown())


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    return render(markdown)
