#!/usr/bin/env bash
# Install Debian packages as root (directly, or through passwordless sudo): `debian-install.sh WHAT PKG...`.
# WHAT names what they are for in the messages. Without root it warns and exits 0, so a setup run by an
# unprivileged user still sets up the rest (the tests that need the packages then fail, naming them).
set -euo pipefail
what="$1"
shift
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "WARNING: $what is missing and this is not root (nor is passwordless sudo set up): run" \
    "'apt-get install -y $*' as root, or the tests that need it fail" >&2
  exit 0
fi
echo "installing $what (Debian packages $*)"
# env(1) so DEBIAN_FRONTEND also survives sudo's environment reset.
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
