"""Run :func:`kinetic_airflow.job.runner.main` as ``python -m kinetic_airflow.runner``."""

import os

from kinetic_airflow.job.runner import main

# os._exit: the result is written, so lingering non-daemon threads the user started
# must not keep the job (and its accelerators) alive.
os._exit(main())
