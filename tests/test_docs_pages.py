"""The documentation pages keep up with the code they describe.

The option table (``kinetic_airflow.options.OPTIONS``) is where an option is spelled; the
options reference and the configuration reference must name every option it has, so adding an
option without documenting it fails here instead of drifting silently. The README stays a
short entry page whose links all lead to pages that exist. (The site itself is built with
warnings as errors by ``scripts/test.sh``: ``mkdocs build --strict``.)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from kinetic_airflow.options import OPTIONS

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _code_names(text: str) -> set[str]:
    """Every name written as inline code on a page (`name`)."""
    return set(re.findall(r"`([^`\n]+)`", text))


def _options_page() -> str:
    """The options page as the site shows it: its tables rendered from the option table."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from docs_hooks import MARKER, render
    finally:
        sys.path.pop(0)
    source = (DOCS / "reference/options.md").read_text()
    assert MARKER in source, "docs/reference/options.md lost the marker its tables are rendered at"
    return render(source)


def test_every_option_in_the_table_is_on_the_options_page():
    named = _code_names(_options_page())
    missing = [name for name in OPTIONS if name not in named]
    assert not missing, f"docs/reference/options.md does not name these options of the table: {missing}"


def test_every_config_option_is_on_the_configuration_page():
    named = _code_names((DOCS / "reference/configuration.md").read_text())
    missing = [name for name, spec in OPTIONS.items() if spec.config and name not in named]
    assert not missing, f"docs/reference/configuration.md does not list these [kinetic] settings: {missing}"


def test_the_options_page_names_no_option_the_table_lacks():
    """Its option tables name the option table's options and nothing else (an option that is both a
    task argument and a `[kinetic]` setting is in both tables)."""
    text = _options_page()
    tables = text[text.index("## Task options") : text.index("## Values are checked")]
    rows = re.findall(r"^\| `([a-z_]+)` \|", tables, flags=re.MULTILINE)
    assert set(rows) == set(OPTIONS)


def test_the_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    # The two commands the README promises (.ci/run calls the second).
    assert "bash scripts/quickstart.sh" in text and "bash scripts/test.sh" in text
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert local, "the README links into the docs"
    missing = [link for link in local if not (ROOT / link).is_file()]
    assert not missing, f"README links to files that do not exist: {missing}"
