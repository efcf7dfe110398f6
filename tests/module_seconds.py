"""How long each test module took in a whole run: the order in which the suite hands them out.

``scripts/test.sh`` runs the modules in two processes, each module whole in one of them
(pytest-xdist ``--dist loadfile``). A process takes the next module when it is done with
its last, so the run ends when the longest modules end: handed out longest first, a
three-minute module no longer starts when the other process has nothing left to do (it
did, with xdist's own order by number of tests: about two idle minutes a run).

Refresh after a whole run that wrote a JUnit report::

    .venv/bin/python -m pytest tests -n 2 --dist loadfile --junitxml=/tmp/junit.xml
    .venv/bin/python tests/module_seconds.py /tmp/junit.xml

A module missing from the file (a new one) goes first: better early than last.
"""

from __future__ import annotations

import collections
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

SECONDS_FILE = Path(__file__).with_name("module_seconds.json")


def load() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(SECONDS_FILE.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}  # unreadable: the suite still runs, in collection order


def from_junit(report: Path) -> dict[str, float]:
    seconds: collections.Counter[str] = collections.Counter()
    for case in ET.parse(report).iter("testcase"):
        path = case.get("file") or (case.get("classname") or "").replace(".", "/") + ".py"
        seconds[path] += float(case.get("time") or 0)  # setup, call and teardown together
    return {path: round(value, 1) for path, value in sorted(seconds.items())}


if __name__ == "__main__":
    SECONDS_FILE.write_text(json.dumps(from_junit(Path(sys.argv[1])), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SECONDS_FILE}")
