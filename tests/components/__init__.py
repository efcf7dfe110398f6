"""Helpers for tests that run real Airflow services (see airflow_services.py)."""
