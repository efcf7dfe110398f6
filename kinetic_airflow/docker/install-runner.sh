#!/bin/sh
# Install the kinetic-airflow runner into the current Python: cloudpickle, google-cloud-storage and
# the kinetic_airflow package folder found in SRC (a source checkout, or the folder holding an
# installed package), copied into site-packages -- no Airflow, no build step, so an installed
# wheel can rebuild its own runner. Used by the Dockerfile and by the test that checks these
# steps in a plain virtualenv.
set -eu
SRC="${1:-/src}"
if [ ! -f "$SRC/kinetic_airflow/job/runner.py" ]; then
  echo "install-runner.sh: $SRC/kinetic_airflow/job/runner.py not found; pass the folder that contains kinetic_airflow/" >&2
  exit 2
fi
python -m pip install --no-cache-dir --quiet "cloudpickle>=3.0" "google-cloud-storage>=2.14"
SITE="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -rf "$SITE/kinetic_airflow"
cp -R "$SRC/kinetic_airflow" "$SITE/kinetic_airflow"
find "$SITE/kinetic_airflow" -name __pycache__ -type d -prune -exec rm -rf {} +
python -m kinetic_airflow.runner --help >/dev/null
