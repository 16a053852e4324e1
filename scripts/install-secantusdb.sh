#!/usr/bin/env bash
# SecantusDB, the MongoDB wire server the tests run against (a single-node, replica-set-like
# server with transactions and change streams, from the Python package index): installed into
# .venv-mongo/ when it is not there yet (python3-venv from Debian's packages when missing).
# Prints the server's path.
#   scripts/install-secantusdb.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
bin=.venv-mongo/bin/secantusd-py
# One install at a time: tests that start at once may all find it missing.
exec 9>".venv-mongo.lock"
flock 9
if [ ! -x "$bin" ]; then
  say "installing SecantusDB into .venv-mongo"
  if ! python3 -m venv .venv-mongo >&2 2>/dev/null; then
    apt_install python3-venv
    python3 -m venv .venv-mongo >&2
  fi
  .venv-mongo/bin/pip install -q SecantusDB >&2
fi
echo "$PWD/$bin"
