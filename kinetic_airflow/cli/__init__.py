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


def main(argv: list[str] | None = None) -> int:
    """The console script as installed before ``cli`` was a package (``kinetic_airflow.cli:main``)."""
    # Not at the top: importing a command module (cli.jobs, cli.gc) must not build the parser.
    from kinetic_airflow.cli.main import main as run

    return run(argv)
