"""Provider metadata read by every Airflow process: a plain dict, no heavy imports.

The ``[kinetic]`` section is the option table's (``kinetic_airflow.options``, standard library
only): description, type, example and the built-in default of each setting, which
``airflow config list --section kinetic`` shows.
"""

from kinetic_airflow.options import provider_config


def get_provider_info() -> dict:
    info = {
        "package-name": "kinetic-airflow",
        "name": "Kinetic",
        "description": "Run Python functions on TPUs and GPUs (GKE) or locally, with @task.kinetic.",
        "versions": ["0.1.0"],
        "task-decorators": [{"name": "kinetic", "class-name": "kinetic_airflow.decorators.kinetic_task"}],
        "extra-links": [
            "kinetic_airflow.links.KineticJobConsoleLink",
            "kinetic_airflow.links.KineticJobLogsLink",
            "kinetic_airflow.links.KineticViewLink",
        ],
        "config": {
            "kinetic": {
                "description": "Defaults for @task.kinetic / KineticRunOperator. A task argument wins over "
                "these; these win over KINETIC_* environment variables.",
                "options": provider_config(),
            }
        },
    }
    return info
