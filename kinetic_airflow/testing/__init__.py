"""Test helpers for kinetic-airflow and for users' own DAG tests: a fake GCS server
(``kinetic_airflow.testing.gcs``) and a local Kubernetes cluster emulator
(``kinetic_airflow.testing.cluster``). Use them as pytest plugins::

    pytest_plugins = ["kinetic_airflow.testing.gcs"]
"""
