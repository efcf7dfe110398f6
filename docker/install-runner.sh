#!/bin/sh
# Install the kinetic-airflow runner into the current Python: cloudpickle, google-cloud-storage and
# this package without its dependencies (no Airflow). Used by the Dockerfiles and by the test that
# checks these steps in a plain virtualenv.
set -eu
SRC="${1:-/src}"
python -m pip install --no-cache-dir --quiet "cloudpickle>=3.0" "google-cloud-storage>=2.14"
python -m pip install --no-cache-dir --quiet --no-deps "$SRC"
python -m kinetic_airflow.runner --help >/dev/null
