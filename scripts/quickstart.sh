#!/usr/bin/env bash
# Install kinetic-airflow (and so Airflow) into .venv, then run the quickstart DAG end to end on the
# embedded local backend (no cloud) and print its results.
#
# Only the package and what it depends on: no test tooling, no cluster providers, no PostgreSQL
# (Airflow uses SQLite in .airflow-home). The test toolchain is scripts/setup.sh / scripts/test.sh.
# The install uses uv when it can (a pip package; installing Airflow's ~140 packages with it takes
# seconds, with pip minutes): the one on PATH, else one installed into .venv. PIP_ONLY=1 uses pip.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
started=$SECONDS

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
install() {
  if [ "${PIP_ONLY:-0}" != 1 ]; then
    local uv
    uv="$(command -v uv || true)"
    if [ -z "$uv" ] && .venv/bin/python -m pip install --quiet uv; then
      uv=.venv/bin/uv
    fi
    if [ -n "$uv" ]; then
      "$uv" pip install --quiet --python .venv/bin/python "$@"
      return
    fi
  fi
  .venv/bin/python -m pip install --quiet "$@"
}
install -e .
echo "kinetic-airflow installed in $(pwd)/.venv in $((SECONDS - started))s"

export AIRFLOW_HOME="${AIRFLOW_HOME:-$(pwd)/.airflow-home}"
export AIRFLOW__CORE__DAGS_FOLDER="$(pwd)/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export KINETIC_BASE_URI="${KINETIC_BASE_URI:-file://$(pwd)/.kinetic}"
# One Python process migrates the SQLite DB (what `airflow db migrate` does) and runs
# dags/quickstart.py as `python dags/quickstart.py` would: Airflow is imported once, not twice.
.venv/bin/python - <<'PY'
import logging
import runpy
import sys

from airflow.utils import db

logging.getLogger("alembic").setLevel(logging.WARNING)
db.upgradedb()
sys.path.insert(0, "dags")
sys.argv = ["dags/quickstart.py"]
runpy.run_path("dags/quickstart.py", run_name="__main__")
PY
echo "quickstart finished in $((SECONDS - started))s"
