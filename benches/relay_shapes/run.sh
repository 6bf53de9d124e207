#!/usr/bin/env bash
# What the database does per relayed batch of 500, in the relay's shape (claimed under a lease,
# then deleted) and in a transaction's (deleted, committed once confirmed), alternating three
# times: pgbench's average latency per batch on one connection, 60 batches each. The table is
# the script's own (relay_shapes), dropped at the end.
#   benches/relay_shapes/run.sh [postgres://postgres@127.0.0.1:5432/test]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
url=${1:-postgres://postgres@127.0.0.1:5432/test}
psql -X -q "$url" -f "$here/setup.sql"
for shape in lease locked lease locked lease locked; do
  psql -X -q "$url" -c "INSERT INTO relay_shapes (payload) SELECT decode(repeat('ab', 100), 'hex') FROM generate_series(1, 40000)"
  echo "$shape: $(pgbench -n -f "$here/$shape.sql" -t 60 -c 1 "$url" 2>/dev/null | grep 'latency average')"
done
psql -X -q "$url" -c "DROP TABLE relay_shapes"
