"""Airflow plugin: registers the listener that stops jobs of task instances users mark by hand."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from kinetic_airflow import listener


class KineticPlugin(AirflowPlugin):
    name = "kinetic"
    listeners = [listener]
