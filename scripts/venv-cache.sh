# Sourced by scripts/setup.sh and scripts/setup-kinetic-oracle.sh: a venv made on this machine
# outlives the clone it was made in, so that a fresh clone of the same inputs starts from a copy of
# it (hard links: seconds) instead of installing Airflow or keras-kinetic again (minutes).
#
# Only a cache: a machine without one (CI) installs from nothing, and a copy that does not import
# what it must is thrown away and installed again. The key is a hash of the files that decide what
# the venv holds (pyproject.toml, the setup script) and of the Python it runs, so a change to any
# of them starts a new venv. Set KINETIC_VENV_CACHE=off to never use or fill it.
#
# Hard links share files with the cache, which is safe because pip and Python replace files (write
# a new one, rename it over the old) rather than rewrite them in place.

VENV_CACHE_ROOT="${KINETIC_VENV_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kinetic-airflow/venvs}"

# venv_cache_key NAME PYTHON FILE...: a name for the venv these files and this Python make.
venv_cache_key() {
  local name="$1" python="$2"
  shift 2
  local version
  version="$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
  echo "$name-py$version-$(cat "$@" | sha256sum | cut -c1-16)"
}

# venv_restore DIR KEY: make DIR from the cached venv KEY, if there is one and DIR does not exist.
# The scripts and activate files in bin/ name the venv's own path: they are rewritten to DIR's.
venv_restore() {
  local dir="$1" key="$2"
  local cached="$VENV_CACHE_ROOT/$key"
  [ "${KINETIC_VENV_CACHE:-on}" != off ] || return 0
  [ ! -e "$dir" ] && [ -x "$cached/bin/python" ] || return 0
  echo "$dir: from the venv cache ($cached)"
  if ! cp -al "$cached" "$dir" 2>/dev/null; then # another file system: no hard links
    rm -rf "$dir"
    cp -a "$cached" "$dir"
  fi
  local here
  here="$(cd "$dir" && pwd)"
  grep -rlIZ --fixed-strings "$cached" "$dir/bin" | xargs -0 -r sed -i "s#$cached#$here#g"
}

# venv_save DIR KEY: keep a copy of DIR as the cached venv KEY (once per key).
venv_save() {
  local dir="$1" key="$2"
  local cached="$VENV_CACHE_ROOT/$key"
  [ "${KINETIC_VENV_CACHE:-on}" != off ] || return 0
  [ ! -e "$cached" ] || return 0
  mkdir -p "$VENV_CACHE_ROOT"
  local tmp here
  tmp="$(mktemp -d "$VENV_CACHE_ROOT/.$key.XXXXXX")"
  here="$(cd "$dir" && pwd)"
  if cp -al "$dir/." "$tmp/" 2>/dev/null || cp -a "$dir/." "$tmp/"; then
    grep -rlIZ --fixed-strings "$here" "$tmp/bin" | xargs -0 -r sed -i "s#$here#$cached#g"
    mv -T "$tmp" "$cached" 2>/dev/null || rm -rf "$tmp" # another run saved it first
  else
    rm -rf "$tmp"
  fi
}

# venv_discard DIR: remove a restored venv that turned out not to work.
venv_discard() {
  echo "$1: the copy from the venv cache does not work; installing from nothing" >&2
  rm -rf "$1"
}
