"""Run :func:`kinetic_airflow.job.runner.main` as ``python -m kinetic_airflow.runner``."""

import os
import sys

from kinetic_airflow.job.integrity import hide_key_from_environ

# First, before the runner's imports (cloudpickle, storage clients): a key given in the
# environment (a Kubernetes secretKeyRef) moves to a pipe by exec, which would import them twice.
hide_key_from_environ(sys.orig_argv)

from kinetic_airflow.job.runner import main  # noqa: E402 (after the exec above)

# os._exit: the result is written, so lingering non-daemon threads the user started
# must not keep the job (and its accelerators) alive.
os._exit(main())
