"""An auth manager for tests/test_ui_components.py: Airflow's SimpleAuthManager, except that
the user ``outsider`` may not see the DAG ``kn_ui_secret`` (SimpleAuthManager's roles are
not per DAG; the Kinetic view must follow whatever the configured auth manager says)."""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

HIDDEN_DAG = "kn_ui_secret"


class PerDagAuthManager(SimpleAuthManager):
    def is_authorized_dag(
        self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None
    ) -> bool:
        if user.get_name() == "outsider" and details is not None and details.id == HIDDEN_DAG:
            return False
        return super().is_authorized_dag(
            method=method, user=user, access_entity=access_entity, details=details
        )
