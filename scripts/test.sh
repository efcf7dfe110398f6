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
# The layers: import-linter's contracts ([tool.importlinter] in pyproject.toml; about a second).
.venv/bin/lint-imports
# The documentation site (mkdocs.yml, docs/) with warnings as errors, built into the gitignored .site/
# (not --quiet: it hides the warnings, and --strict then passes a broken link).
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict
# The floor tier's venv (Airflow's oldest declared release) is installed while the main suite runs:
# mostly network and disk, where the suite mostly waits on its services.
bash scripts/test-airflow-floor.sh --setup-only >.ci-logs/floor-setup.log 2>&1 &
floor_setup=$!
set +e
# Three processes (pytest-xdist), each test module whole in one of them: a module's services and
# cluster emulator start once, and most of the suite's time is waiting on them, not computing.
# Four once lost a four-host JAX collective to the load (a host aborted, exit 134); three passed
# whole on this 2-core machine at a load average of 9 (other test runs beside it).
# The slowest modules go first (files are run in the order named), so no long module starts last
# and leaves one process working alone at the end.
# The 25 slowest tests are listed at the end: where the suite's time goes, in every CI log.
SLOWEST_FIRST=(
  tests/test_lifecycle_components.py
  tests/test_lifecycle_celery.py
  tests/test_ui_components.py
  tests/test_jobs_cli.py
  tests/test_e2e_dag.py
  tests/test_pathways.py
  tests/test_gc.py
  tests/test_reproduce.py
  tests/test_components_infra.py
  tests/test_example_dags.py
  tests/test_triggerer_concurrency.py
)
rest=()
for file in tests/test_*.py; do
  case " ${SLOWEST_FIRST[*]} " in *" $file "*) ;; *) rest+=("$file") ;; esac
done
.venv/bin/python -m pytest "${SLOWEST_FIRST[@]}" "${rest[@]}" emulator/tests -n 3 --dist loadfile --durations=25 "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "no tests were collected: failing" >&2
  exit 1
fi
# The dag.test() tier again on the oldest Airflow pyproject.toml declares (its own venv).
floor=0
wait "$floor_setup" || floor=$?
cat .ci-logs/floor-setup.log
if [ "$floor" -eq 0 ]; then
  bash scripts/test-airflow-floor.sh -q -rs || floor=$?
fi
if [ "$code" -ne 0 ]; then
  exit "$code"
fi
exit "$floor"
