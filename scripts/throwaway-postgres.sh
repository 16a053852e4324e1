#!/usr/bin/env bash
# A private PostgreSQL for as long as process PID lives: the server's binaries from the system
# (installed with apt-get when missing), initdb into a temporary directory, a free port, trust
# authentication on 127.0.0.1, a database `test`, and the server options given after PID. Prints
# the URL; once PID has exited the server is stopped and its directory removed.
#   url=$(scripts/throwaway-postgres.sh $$)
#   url=$(scripts/throwaway-postgres.sh $$ -c max_connections=500)
set -euo pipefail
owner=${1:?usage: throwaway-postgres.sh PID [SERVER OPTION...]}
shift
extra="$*"
. "$(dirname "$0")/common.sh"

bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
  say "installing PostgreSQL's server with apt-get"
  apt_install postgresql
  bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
fi
# The server refuses to run as root.
as_server() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

dir=$(mktemp -d /tmp/relaybus-postgres.XXXXXX)
[ "$(id -u)" = 0 ] && chown postgres: "$dir"
port=$(free_port)
say "starting PostgreSQL ($bin) on 127.0.0.1:$port, data in $dir"
as_server "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 >/dev/null
as_server "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 60 \
  -o "-p $port -k $dir -c listen_addresses=127.0.0.1 $extra" start >/dev/null
as_server "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres test
# The watchdog outlives this script, with its output away from the caller's $(...).
( while kill -0 "$owner" 2>/dev/null; do sleep 1; done
  as_server "$bin/pg_ctl" -D "$dir/data" -m immediate stop
  rm -rf "$dir" ) >/dev/null 2>&1 </dev/null &
echo "postgres://postgres@127.0.0.1:$port/test?sslmode=disable"
