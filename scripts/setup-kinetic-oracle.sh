#!/usr/bin/env bash
# Create .venv-kinetic: keras-kinetic 0.0.4 exactly as released on PyPI, for the accelerator parity
# test (tests/test_accelerator_parity.py runs tests/kinetic_oracle.py in it and compares what kinetic
# would submit with kinetic-airflow's parse).
#
# Its own venv, because keras-kinetic pulls in Pulumi, Keras and a dozen Google Cloud clients that
# kinetic-airflow does not need (and that would drag the main venv's pins around). The wheel is
# installed with --no-deps and pinned by hash; then only what `import kinetic` and its Job /
# LeaderWorkerSet manifest builders (kinetic/backend/{k8s_utils,gke_client,pathways_client}.py)
# import at module level, and what its job listing / attach / `kinetic jobs` commands import
# (kinetic/jobs.py, kinetic/cli/commands/jobs.py: click; tests/test_kinetic_interop.py). pip
# reports the left-out dependencies (Pulumi, Keras, ...) as missing; that is expected. Idempotent: a second run with everything in place does no network I/O.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV=.venv-kinetic
KINETIC_VERSION=0.0.4
# sha256 of keras_kinetic-0.0.4-py3-none-any.whl on PyPI.
KINETIC_SHA256=52a9ac385c8e51d8985b34fbb3497b497499fd9a099e6cdea6c1bcbe9d11ef96

ready() {
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$KINETIC_VERSION" <<'EOF' 2>/dev/null
import importlib.metadata, sys
assert importlib.metadata.version("keras-kinetic") == sys.argv[1]
import kinetic.backend.gke_client, kinetic.backend.k8s_utils, kinetic.backend.pathways_client  # noqa: F401
import kinetic.core.accelerators, kinetic.core.core  # noqa: F401
import kinetic.jobs, kinetic.cli.commands.jobs  # noqa: F401  (tests/test_kinetic_interop.py)
EOF
}

# A fresh clone starts from this machine's copy of the venv, if it has one (scripts/venv-cache.sh).
. scripts/venv-cache.sh
key="$(venv_cache_key kinetic-oracle "$PYTHON" scripts/setup-kinetic-oracle.sh)"
venv_restore "$VENV" "$key"
if ready; then
  venv_save "$VENV" "$key"
  echo "keras-kinetic $KINETIC_VERSION already in $(pwd)/$VENV"
  exit 0
fi

# keras-kinetic needs Python >= 3.11.
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "keras-kinetic $KINETIC_VERSION needs Python >= 3.11; set PYTHON=python3.11 or newer" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip --quiet)
# Lower bounds are keras-kinetic 0.0.4's own.
"${pip[@]}" install \
  "absl-py" \
  "click>=8.1" \
  "cloudpickle" \
  "rich>=14.0" \
  "google-auth>=2.49" \
  "google-cloud-storage>=3.10" \
  "google-cloud-container>=2.64" \
  "google-cloud-artifact-registry>=1.11" \
  "google-cloud-build>=3.36" \
  "kubernetes>=35.0"
requirements="$(mktemp)"
trap 'rm -f "$requirements"' EXIT
echo "keras-kinetic==$KINETIC_VERSION --hash=sha256:$KINETIC_SHA256" >"$requirements"
# pip's resolver names the dependencies left out on purpose; its exit status is what counts.
"${pip[@]}" install --no-deps --require-hashes -r "$requirements" 2>&1 \
  | grep -v -E "^(ERROR: pip's dependency resolver|keras-kinetic $KINETIC_VERSION requires )" || true
if ! ready; then
  echo "keras-kinetic $KINETIC_VERSION did not install into $VENV (see the output above)" >&2
  exit 1
fi
venv_save "$VENV" "$key"
echo "keras-kinetic $KINETIC_VERSION installed in $(pwd)/$VENV"
