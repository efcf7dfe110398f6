"""``python -m kinetic_airflow.runner``: the command every job pod, image and local job runs.

The runner itself is :mod:`kinetic_airflow.job.runner`; this package only keeps the command
that images built before the move (and ``docker/Dockerfile``'s entry point) call.
"""
