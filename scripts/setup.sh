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
  if [ "$(id -u)" -eq 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    as_root=(none)
  fi
  if [ "${as_root[*]-}" != "none" ]; then
    echo "installing PostgreSQL (Debian package postgresql)"
    # env(1) so DEBIAN_FRONTEND also survives sudo's environment reset.
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  else
    echo "WARNING: PostgreSQL binaries are missing and this is not root: run" \
      "'apt-get install -y postgresql' as root, or the PostgreSQL component tests fail" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test]"
echo "kinetic-airflow installed in $(pwd)/.venv"
