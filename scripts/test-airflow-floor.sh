#!/usr/bin/env bash
# The dag.test() tier on the oldest Airflow kinetic-airflow declares (pyproject.toml's
# `apache-airflow>=X.Y`, tested as X.Y.0): the provider claims that range, so CI runs it there too.
# `--print-version` prints the release it tests and exits; `--setup-only` makes its venv and exits.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
floor="$("$PYTHON" - <<'PY'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
spec = next(d for d in deps if re.match(r"apache-airflow\s*>=", d))
parts = spec.split(">=")[1].strip().split(".")
print(".".join((parts + ["0", "0"])[:3]))
PY
)"
if [ "${1:-}" = "--print-version" ]; then
  echo "$floor"
  exit 0
fi

# The dag.test() tier: a task's whole run (submit, wait, result, failure, retry and re-run decisions,
# integrity) in-process on the local backend and the cluster emulator. The real-components tier
# runs on the newest release only (scripts/test.sh); its deployments would double CI's time.
TIER=(
  tests/test_airflow_floor.py
  tests/test_e2e_dag.py
  tests/test_lifecycle.py
  tests/test_integrity.py
  tests/test_bad_inputs.py
  tests/test_metrics_airflow.py
)

venv=.venv-airflow-floor
. scripts/venv-cache.sh
key="$(venv_cache_key "airflow-$floor" "$PYTHON" pyproject.toml emulator/pyproject.toml scripts/test-airflow-floor.sh)"
venv_restore "$venv" "$key"
if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -c "import airflow" 2>/dev/null; then
  venv_discard "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv "$venv"
  # Airflow's meta-package pins its core and task SDK to the same release line. uv when it can be
  # had (a pip package; pip's resolver took 7 min for this set on a busy 2-core machine), else pip.
  want=(-e ".[test]" -e "./emulator" "apache-airflow==$floor" "apache-airflow-core==$floor")
  if "$venv/bin/python" -m pip install --quiet uv; then
    "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" "${want[@]}"
  else
    "$venv/bin/python" -m pip install --quiet "${want[@]}"
  fi
  venv_save "$venv" "$key"
fi
# Asked from / : run here, Python would import the package from the working directory whatever the
# venv's editable install points at (a cached venv made in a clone since deleted passed this check,
# and its `airflow` then could not import kinetic_airflow).
here="$(cd / && "$OLDPWD/$venv/bin/python" -c 'import kinetic_airflow, cluster_emulator, os; print(os.path.dirname(os.path.dirname(kinetic_airflow.__file__)))' 2>/dev/null || true)"
if [ "$here" != "$(pwd)" ]; then # a cached venv made in another clone: point it at this one
  "$venv/bin/python" -m pip install --quiet --no-deps -e . -e ./emulator
fi
got="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("apache-airflow-core"))')"
if [ "$got" != "$floor" ]; then
  echo "the floor venv holds Airflow $got, not $floor" >&2
  exit 1
fi
echo "dag.test() tier on Airflow $got (the oldest release pyproject.toml declares)"
if [ "${1:-}" = "--setup-only" ]; then # scripts/test.sh makes the venv while the main suite runs
  exit 0
fi
set +e
"$venv/bin/python" -m pytest "${TIER[@]}" -p no:cacheprovider "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "no tests were collected on the floor release: failing" >&2
  exit 1
fi
exit "$code"
