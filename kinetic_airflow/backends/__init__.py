"""Backends: where a job runs. ``base`` is what every backend shares; ``registry.get_backend``
maps a job's backend name to its implementation (imported only when a job uses it)."""

from __future__ import annotations

from kinetic_airflow.backends.base import Backend, BackendStatus, JobRef, JobState

__all__ = ["Backend", "BackendStatus", "JobRef", "JobState"]
