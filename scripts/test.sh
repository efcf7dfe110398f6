#!/usr/bin/env bash
# Set up, lint, and run the whole test suite. Exits non-zero if anything fails or no test ran.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .ci-logs
# keras-kinetic 0.0.4 in its own venv: the oracle of tests/test_accelerator_parity.py. Installed
# beside the main venv (pip against uv: mostly network; it installs nothing of this clone).
bash scripts/setup-kinetic-oracle.sh >.ci-logs/oracle-setup.log 2>&1 &
oracle_setup=$!
bash scripts/setup.sh
# Debian's chromium: the headless browser of tests/test_ui_components.py (tests/browser.py). After
# setup.sh, whose PostgreSQL and Redis come from apt too (one dpkg at a time).
bash scripts/setup-browser.sh
oracle=0
wait "$oracle_setup" || oracle=$?
cat .ci-logs/oracle-setup.log
if [ "$oracle" -ne 0 ]; then
  echo "the keras-kinetic oracle venv could not be set up (exit $oracle)" >&2
  exit "$oracle"
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# The dag.test() tier again on the oldest Airflow pyproject.toml declares (its own venv), beside the
# main suite: its venv is mostly network and disk, and the main suite leaves about a third of the
# two cores idle (waiting on its services), which the tier's 100 s fill. A little lower priority
# (nice 5), so the main suite's real-components scenarios keep the larger share under load.
floor_tier() {
  bash scripts/test-airflow-floor.sh --setup-only || return $?
  nice -n 5 bash scripts/test-airflow-floor.sh "$@"
}
floor_tier -q -rs >.ci-logs/floor.log 2>&1 &
floor_job=$!
set +e
# Two processes (pytest-xdist), each test module whole in one of them: a module's services and
# cluster emulator start once. The longest modules go first (tests/module_seconds.py), so the run
# does not end on one long module with the other process idle. The cores are busy most of the run
# (sampled from /proc/stat: 100 % while the real-components modules run together, 71 % on
# average), so more processes mostly share the same CPU: four took 12m47 instead of 20m26 once,
# but a fresh-clone run then lost a four-host JAX collective to the load (a host aborted, exit 134).
# The 25 slowest tests are listed at the end: where the suite's time goes, in every CI log.
.venv/bin/python -m pytest tests -n 2 --dist loadfile --no-loadscope-reorder --durations=25 "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "no tests were collected: failing" >&2
  exit 1
fi
floor=0
wait "$floor_job" || floor=$?
cat .ci-logs/floor.log
if [ "$code" -ne 0 ]; then
  exit "$code"
fi
exit "$floor"
