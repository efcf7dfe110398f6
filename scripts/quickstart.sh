#!/usr/bin/env bash
# Set up, then run the quickstart DAG end to end on the embedded local backend (no cloud)
# and print its results.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export AIRFLOW_HOME="${AIRFLOW_HOME:-$(pwd)/.airflow-home}"
export AIRFLOW__CORE__DAGS_FOLDER="$(pwd)/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export KINETIC_BASE_URI="${KINETIC_BASE_URI:-file://$(pwd)/.kinetic}"
.venv/bin/airflow db migrate >/dev/null
.venv/bin/python dags/quickstart.py
