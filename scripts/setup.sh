#!/usr/bin/env bash
# Create .venv with kinetic-airflow (editable) and its test tools. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test]"
echo "kinetic-airflow installed in $(pwd)/.venv"
