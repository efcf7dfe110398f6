#!/usr/bin/env bash
# Make sure a headless browser is on the machine for the UI tests: Debian's chromium (driven over the
# Chrome DevTools Protocol by tests/browser.py, so no driver or browser build is downloaded) and a
# font, so pages render real glyphs in screenshots. Idempotent: installed from Debian only when
# chromium is missing, so a second run on a machine that has it does no network I/O.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    as_root=(none)
  fi
  if [ "${as_root[*]-}" != "none" ]; then
    echo "installing Chromium (Debian packages chromium, fonts-dejavu-core)"
    # env(1) so DEBIAN_FRONTEND also survives sudo's environment reset.
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      chromium fonts-dejavu-core >/dev/null
  else
    echo "WARNING: chromium is missing and this is not root (nor is passwordless sudo set up): run" \
      "'apt-get install -y chromium fonts-dejavu-core' as root, or the browser tests fail" >&2
    exit 0
  fi
fi
if ! command -v chromium >/dev/null; then
  echo "ERROR: installed the chromium package, but no chromium is on PATH ($PATH)" >&2
  exit 1
fi
echo "chromium: $(command -v chromium)"
