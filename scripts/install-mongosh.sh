#!/usr/bin/env bash
# mongosh for the tests that run the rendered scripts: installed from npm into .mongosh/ when it
# is not there yet (Node.js and npm from Debian's packages when missing). Prints its path.
#   scripts/install-mongosh.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
bin=.mongosh/node_modules/.bin/mongosh
# One install at a time: tests that start at once may all find it missing.
exec 9>".mongosh.lock"
flock 9
if [ ! -x "$bin" ]; then
  if ! command -v npm >/dev/null; then
    say "installing Node.js and npm with apt-get"
    apt_install nodejs npm
  fi
  say "installing mongosh into .mongosh"
  npm install --prefix .mongosh --no-audit --no-fund --loglevel=error mongosh@2 >&2
fi
echo "$PWD/$bin"
