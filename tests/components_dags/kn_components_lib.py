"""A sibling module of the DAG files in this folder, imported by them as ``kn_components_lib``.

The scheduler's dag-processor and the workers find it because Airflow puts the
DAG folder on ``sys.path``; the kinetic job process does not have that folder on
its path, so this module must reach the job pickled by value. Standard library
only: a job image has no orchestrator installed.
"""

from __future__ import annotations


def greet(name: str) -> str:
    return f"hello {name} from the sibling module"


class Counter:
    """A class defined in the sibling module; the job creates and uses an instance."""

    def __init__(self, start: int) -> None:
        self.value = start

    def step(self, by: int = 1) -> Counter:
        self.value += by
        return self
