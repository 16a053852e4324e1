#!/usr/bin/env bash
# A private MongoDB wire server for as long as process PID lives: SecantusDB (a single-node,
# replica-set-like server with transactions and change streams, from the Python package index)
# installed into .venv-mongo when missing (scripts/install-secantusdb.sh), its data in a temporary
# directory, a free port.
# Prints the URL; once PID has exited the server is stopped and its directory removed.
#   url=$(scripts/throwaway-mongodb.sh $$)
set -euo pipefail
owner=${1:?usage: throwaway-mongodb.sh PID}
cd "$(dirname "$0")/.."
. scripts/common.sh
server_bin=$(scripts/install-secantusdb.sh)
dir=$(mktemp -d /tmp/relaybus-mongodb.XXXXXX)
port=$(free_port)
say "starting SecantusDB on 127.0.0.1:$port, data in $dir"
"$server_bin" --host 127.0.0.1 --port "$port" --storage-path "$dir" \
  --oplog-max-entries 20000 >"$dir.log" 2>&1 </dev/null &
server=$!
for _ in $(seq 1 60); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.5; done
(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { say "SecantusDB did not start: $(tail -3 "$dir.log")"; exit 1; }
( while kill -0 "$owner" 2>/dev/null; do sleep 1; done
  kill "$server"; sleep 1; kill -9 "$server"; rm -rf "$dir" "$dir.log" ) >/dev/null 2>&1 </dev/null &
echo "mongodb://127.0.0.1:$port/?directConnection=true"
