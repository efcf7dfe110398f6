"""The ``kinetic-airflow`` command: one module a command group.

main       the parser and the small commands (accelerators, check, show)
jobs       jobs list|show|logs|result|cancel
logs       a job's log, from storage or the cluster
reproduce  run a stored job here
image      build and push the runner image
doctor     check a cluster for a first job
text       help texts shared by the commands

``main`` is re-exported so the console script installed before the move
(``kinetic_airflow.cli:main``) keeps working.
"""

from kinetic_airflow.cli.main import main

__all__ = ["main"]
