#!/usr/bin/env bash
# The libraries the README's publishing examples use, for the tests that run them: psycopg in
# .venv-examples/ (python3-venv from Debian's packages when missing) and the Node.js driver pg
# in .node-examples/ (Node.js and npm from Debian's packages when missing), each installed when
# it is not there yet. Prints the Python interpreter's path, then the NODE_PATH for pg.
#   scripts/install-example-libraries.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
# One install at a time: tests that start at once may all find them missing.
exec 9>".venv-examples.lock"
flock 9
if [ ! -x .venv-examples/bin/python ] || ! .venv-examples/bin/python -c 'import psycopg' 2>/dev/null; then
  say "installing psycopg into .venv-examples"
  if ! python3 -m venv .venv-examples >&2 2>/dev/null; then
    apt_install python3-venv
    python3 -m venv .venv-examples >&2
  fi
  .venv-examples/bin/pip install -q 'psycopg[binary]>=3.1,<4' >&2
fi
if [ ! -f .node-examples/node_modules/pg/package.json ]; then
  if ! command -v npm >/dev/null; then
    say "installing Node.js and npm with apt-get"
    apt_install nodejs npm
  fi
  say "installing pg into .node-examples"
  npm install --prefix .node-examples --no-audit --no-fund --loglevel=error 'pg@8' >&2
fi
echo "$PWD/.venv-examples/bin/python"
echo "$PWD/.node-examples/node_modules"
