#!/usr/bin/env bash
# Create .venv with kinetic-airflow (editable) and its test tools, and make sure the PostgreSQL server
# binaries are on the machine (the real-components tests start a private throwaway server from them,
# tests/components/postgres.py). Idempotent: safe to run again on a machine that has everything.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

# PostgreSQL: only the binaries are needed (initdb, pg_ctl, postgres); the tests never use the
# machine's own cluster. Installed from Debian only when missing, so a second run does no network I/O.
if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  bash scripts/debian-install.sh PostgreSQL postgresql
fi

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test]"
echo "kinetic-airflow installed in $(pwd)/.venv"
