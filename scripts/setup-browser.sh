#!/usr/bin/env bash
# Make sure a headless browser is on the machine for the UI tests: Debian's chromium (driven over the
# Chrome DevTools Protocol by tests/browser.py, so no driver or browser build is downloaded) and a
# font, so pages render real glyphs in screenshots. Idempotent: installed from Debian only when
# chromium is missing, so a second run on a machine that has it does no network I/O.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null; then
  bash scripts/debian-install.sh Chromium chromium fonts-dejavu-core
fi
if ! command -v chromium >/dev/null; then
  echo "WARNING: no chromium on PATH ($PATH): tests/test_ui_components.py will fail" >&2
  exit 0
fi
echo "chromium: $(command -v chromium)"
