#!/usr/bin/env bash
# Create .venv with kinetic-airflow and the cluster emulator (emulator/, its own distribution; both
# editable) and their test tools, and make sure the PostgreSQL server
# binaries, redis-server and squid are on the machine (the real-components tests start private throwaway
# servers from them, tests/components/postgres.py and redis_server.py). Idempotent: safe to run again
# on a machine that has everything.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

# PostgreSQL: only the binaries are needed (initdb, pg_ctl, postgres); the tests never use the
# machine's own cluster. Installed from Debian only when missing, so a second run does no network I/O.
if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  bash scripts/debian-install.sh PostgreSQL postgresql
fi
# Redis: the CeleryExecutor tests' broker (tests/components/redis_server.py starts a private
# redis-server on a free port; the machine's own service is never used). Same rule: only when missing.
if ! command -v redis-server >/dev/null && [ ! -x /usr/bin/redis-server ]; then
  bash scripts/debian-install.sh Redis redis-server
fi
# Squid: tests/test_proxy.py sends the GKE tier's traffic through a real HTTP proxy (a private squid on
# a free loopback port; the machine's own service is never used). Same rule: only when missing.
if ! command -v squid >/dev/null && [ ! -x /usr/sbin/squid ]; then
  bash scripts/debian-install.sh Squid squid
fi

# A fresh clone starts from this machine's venv of the same pyproject.toml, if it has one
# (scripts/venv-cache.sh); pip then only points the editable install at this clone.
. scripts/venv-cache.sh
key="$(venv_cache_key main "$PYTHON" pyproject.toml emulator/pyproject.toml scripts/setup.sh)"
venv_restore .venv "$key"
if [ -x .venv/bin/python ] && ! .venv/bin/python -c "import airflow" 2>/dev/null && [ -e .venv/.kinetic-setup ]; then
  venv_discard .venv # a venv this script finished once no longer imports Airflow: broken, start over
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# Nothing to install when this clone's venv was set up from the same inputs and still imports the
# package from here: a second run does no pip resolution (it took ~40 s on a 2-core machine).
# -I: without it the check imports ./kinetic_airflow from the current directory, and a venv
# restored from the cache (its editable install pointing at the clone that made it) passed.
done_for="$key $(pwd)"
if [ "$(cat .venv/.kinetic-setup 2>/dev/null)" = "$done_for" ] &&
  [ "$(.venv/bin/python -I -c 'import kinetic_airflow, cluster_emulator, os; print(os.path.dirname(os.path.dirname(kinetic_airflow.__file__)))' 2>/dev/null)" = "$(pwd)" ]; then
  echo "kinetic-airflow already installed in $(pwd)/.venv (pyproject.toml unchanged)"
  exit 0
fi
# uv when it can be had (a pip package): it installs this set in well under a minute where pip's
# resolver takes minutes on a 2-core machine without a cache (CI); else pip.
if .venv/bin/python -m pip install --quiet uv; then
  .venv/bin/uv pip install --quiet --python .venv/bin/python -e ".[test]" -e "./emulator[test]"
else
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[test]" -e "./emulator[test]"
fi
echo "$done_for" >.venv/.kinetic-setup
venv_save .venv "$key"
echo "kinetic-airflow installed in $(pwd)/.venv"
