#!/usr/bin/env bash
# Run the test suite on a fresh machine: installs what the tests need (Debian's prometheus for promtool and the
# end-to-end tests, the Python dev extras into .venv), then runs pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v promtool >/dev/null 2>&1 || ! command -v alertmanager >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null
  else
    echo "scripts/test.sh: promtool is missing; run: sudo apt-get install prometheus prometheus-alertmanager" >&2
    exit 1
  fi
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev]'
exec .venv/bin/python -m pytest -q "$@"
