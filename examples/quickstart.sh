#!/usr/bin/env bash
# relaybus in one command: install the store in a schema of its own, publish 100 sample events
# (keyed and unkeyed, two handlers) and drain them through shell handlers.
#   examples/quickstart.sh                                   # a local PostgreSQL, or a throwaway one
#   RELAYBUS_DATABASE_URL=postgres://app@db/app examples/quickstart.sh
#   RELAYBUS_DATABASE_URL='mongodb://127.0.0.1:27017/?directConnection=true' examples/quickstart.sh
# Without RELAYBUS_DATABASE_URL it uses postgres://postgres@127.0.0.1:5432/test when that server
# lets it in, and otherwise starts a private PostgreSQL for the run (scripts/throwaway-postgres.sh),
# removed when the script ends. Its own files go to a temporary directory, removed too.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "building relaybus (cargo build --release; the first build takes a few minutes)"
# The path cargo reports, wherever CARGO_TARGET_DIR puts it.
bin=$(cargo build --release --message-format=json-render-diagnostics \
  | sed -n 's/.*"executable":"\([^"]*\/relaybus\)".*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "cargo reported no relaybus binary" >&2; exit 1; }
relaybus() { "$bin" --schema relaybus_quickstart "$@"; }
out=$(mktemp -d)
# On every way out its files go; a throwaway server's watchdog stops it and removes its
# directory within a second of this shell's exit, however it ends.
trap 'rm -rf "$out"' EXIT

if [ -z "${RELAYBUS_DATABASE_URL:-}" ]; then
  export RELAYBUS_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test
  # 0 (installed) and 1 (not installed yet) both mean the server let us in.
  rc=0; relaybus setup --check >/dev/null 2>&1 || rc=$?
  if [ "$rc" -gt 1 ]; then
    echo "no usable server at $RELAYBUS_DATABASE_URL; starting a throwaway PostgreSQL"
    RELAYBUS_DATABASE_URL=$(scripts/throwaway-postgres.sh $$)
    throwaway=1
  fi
fi

relaybus setup
for n in $(seq 1 100); do
  key=$([ $((n % 2)) = 0 ] && echo "\"order-$((n % 5))\"" || echo null)
  echo "{\"type\": \"demo.order\", \"key\": $key, \"payload\": {\"n\": $n}}"
done | relaybus publish --handler billing --handler email | wc -l | xargs echo "published events:"

# Handlers run concurrently: each envelope goes to a file of its own, joined afterwards, so the
# NDJSON has one whole envelope per line. Appending a short line is atomic, so the email log can
# be shared.
mkdir "$out/billing"
cat > "$out/handlers.toml" <<TOML
[handlers.billing]
exec = 'cat > $out/billing/\$RELAYBUS_DELIVERY_ID.json'

[handlers.email]
exec = 'echo "email for \$RELAYBUS_EVENT_ID (attempt \$RELAYBUS_ATTEMPT)" >> $out/email.log'
TOML
relaybus run --config "$out/handlers.toml" --drain --poll-interval 100ms

for f in "$out"/billing/*.json; do cat "$f"; echo; done > "$out/billing.ndjson"
echo "billing received $(wc -l < "$out/billing.ndjson") envelopes, the first one:"
head -1 "$out/billing.ndjson"
echo "email handled $(wc -l < "$out/email.log") events"
if [ -z "${throwaway:-}" ]; then
  echo "the store stays in schema relaybus_quickstart; to look at it:"
  echo "  RELAYBUS_DATABASE_URL='$RELAYBUS_DATABASE_URL' $bin --schema relaybus_quickstart stats"
fi
