"""The ``kinetic-airflow`` command (``kinetic_airflow.cli.main:main``): one module a command group.

main       the parser and the small commands (accelerators, check, show)
jobs       jobs list|show|logs|result|cancel
logs       a job's log, from storage or the cluster
reproduce  run a stored job here
gc         delete old job files, find orphans
image      build and push the runner image
doctor     check a cluster for a first job
text       help texts shared by the commands
"""


# No ``main`` here: the submodule ``cli.main`` would shadow it as soon as it is imported, so
# ``from kinetic_airflow.cli import main`` would give a function or a module depending on what ran
# first. The console script and callers name ``kinetic_airflow.cli.main:main``.
