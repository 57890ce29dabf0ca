#!/usr/bin/env bash
# Runs the whole suite (unit, integration, end-to-end). pytest exits 5 when it collected nothing:
# that is a failure here, never a silent pass.
set -uo pipefail
cd "$(dirname "$0")/.."
bash deploy/test_deps.sh || exit 1
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run_tests: pytest collected no tests; treating as failure" >&2
  exit 1
fi
exit "$rc"
