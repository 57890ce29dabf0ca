#!/usr/bin/env bash
# System packages the tests need beyond the venv: Debian's chromium for tests/ui (Playwright drives it by
# executable path; nothing is downloaded by Playwright). CI runs as root on a clean Debian machine.
set -euo pipefail
if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "test_deps: chromium is missing and this is not root: sudo apt-get install chromium (tests/ui skip without it)" >&2
    exit 0
  fi
  echo "test_deps: installing Debian's chromium for tests/ui"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
