#!/usr/bin/env bash
# relaybus in one command: install the store in a schema of its own, publish 100 sample events
# (keyed and unkeyed, two handlers) and drain them through shell handlers.
#   RELAYBUS_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test examples/quickstart.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export RELAYBUS_DATABASE_URL=${RELAYBUS_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
cargo build --release -q
relaybus() { ./target/release/relaybus --schema relaybus_quickstart "$@"; }
out=$(mktemp -d)

relaybus setup
for n in $(seq 1 100); do
  key=$([ $((n % 2)) = 0 ] && echo "\"order-$((n % 5))\"" || echo null)
  echo "{\"type\": \"demo.order\", \"key\": $key, \"payload\": {\"n\": $n}}"
done | relaybus publish --handler billing --handler email | wc -l | xargs echo "published events:"

cat > "$out/handlers.toml" <<TOML
[handlers.billing]
exec = '{ cat; echo; } >> $out/billing.ndjson'

[handlers.email]
exec = 'echo "email for \$RELAYBUS_EVENT_ID (attempt \$RELAYBUS_ATTEMPT)" >> $out/email.log'
TOML
relaybus run --config "$out/handlers.toml" --drain --poll-interval 100ms

echo "billing received $(wc -l < "$out/billing.ndjson") envelopes, the first one:"
head -1 "$out/billing.ndjson"
echo "email handled $(wc -l < "$out/email.log") events"
