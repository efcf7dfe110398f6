"""Test helpers for users' own DAG tests: a fake GCS server (``kinetic_airflow.testing.gcs``).
Use it as a pytest plugin::

    pytest_plugins = ["kinetic_airflow.testing.gcs"]

The Kubernetes cluster emulator is its own distribution (``emulator/`` in the repository,
``pip install ./emulator``), never part of this package.
"""
