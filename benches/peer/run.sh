#!/usr/bin/env bash
# rowbus against ruststream-sqlx 0.7.1: publish N single messages from 8 publishers, then drain
# that backlog with 8 workers (single messages), interleaved in one run so that the ratios are
# measured under the same conditions:
#   rowbus, peer (row lock form), peer (lease form), rowbus, peer, peer, ... (ROUNDS rounds)
# then the medians and the ratio rowbus / peer per database and form. The peer's row lock
# form is its default; SQLite has no row locks, so there the peer runs in the lease form only.
#
#   benches/peer/run.sh [URL...]        (default: the PostgreSQL, MariaDB and SQLite below)
#   MESSAGES=20000 ROUNDS=3 FORMS="row-lock lease" benches/peer/run.sh postgres://...
#
# Builds target/release/rowbus (-p rowbus-cli) and the peer binary first. Needs python3 to
# read the JSON lines.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
MESSAGES=${MESSAGES:-20000}
ROUNDS=${ROUNDS:-3}
if [ $# -eq 0 ]; then
  set -- postgres://postgres@127.0.0.1:5432/test mysql://root@127.0.0.1:3306/test sqlite:///tmp/rowbus-peer.sqlite
fi

(cd "$root" && cargo build --release -q -p rowbus-cli)
(cd "$here" && cargo build --release -q)
rowbus="${CARGO_TARGET_DIR:-$root/target}/release/rowbus"
peer="${CARGO_TARGET_DIR:-$here/target}/release/rowbus-peer-bench"

results=$(mktemp)
trap 'rm -f "$results"' EXIT

for url in "$@"; do
  case "$url" in
    # The bench refuses a missing SQLite file; `deploy` is the command that creates one.
    sqlite:*) forms=${FORMS:-lease}; "$rowbus" --database-url "$url" deploy >/dev/null ;;
    *) forms=${FORMS:-row-lock lease} ;;
  esac
  for round in $(seq 1 "$ROUNDS"); do
    echo "== $url, round $round of $ROUNDS" >&2
    "$rowbus" --database-url "$url" bench broker --only publish1,drain8 --rounds 1 --messages "$MESSAGES" --json \
      | python3 -c 'import json,sys; d=json.load(sys.stdin); t=d["throughput"]; print(json.dumps({"url": sys.argv[1], "who": "rowbus", "msgs_per_s": t["drain8"]["msgs_per_s"], "publish_msgs_per_s": t["publish1"]["msgs_per_s"]}))' "$url" \
      | tee -a "$results" >&2
    for form in $forms; do
      "$peer" --database-url "$url" --messages "$MESSAGES" --workers 8 --form "$form" --json \
        | python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps({"url": sys.argv[1], "who": "peer " + d["form"], "msgs_per_s": d["drain_msgs_per_s"], "publish_msgs_per_s": d["publish_msgs_per_s"]}))' "$url" \
        | tee -a "$results" >&2
    done
  done
done

python3 - "$results" "$MESSAGES" "$ROUNDS" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
messages, rounds = sys.argv[2], sys.argv[3]
for what, key in (("publish", "publish_msgs_per_s"), ("drain", "msgs_per_s")):
    print(f"{what} of {messages} messages, 8 at a time, single messages: medians of {rounds} interleaved rounds")
    print(f"{'database':<42} {'who':<16} {'msgs/s':>9}  {'runs':<26} {'rowbus / this':>13}")
    for url in dict.fromkeys(r["url"] for r in rows):
        mine = [r for r in rows if r["url"] == url]
        by = {}
        for r in mine:
            by.setdefault(r["who"], []).append(r[key])
        ours = statistics.median(by.get("rowbus", [0]))
        for who, runs in by.items():
            med = statistics.median(runs)
            ratio = "" if who == "rowbus" or med == 0 else f"{ours / med:.2f}x"
            print(f"{url:<42} {who:<16} {med:>9,.0f}  {' '.join(f'{v:,.0f}' for v in runs):<26} {ratio:>13}")
        peers = {w: statistics.median(v) for w, v in by.items() if w != "rowbus"}
        if peers:
            best = max(peers, key=peers.get)
            print(f"{url:<42} {'ratio vs best':<16} {'':>9}  {best:<26} {ours / peers[best]:>12.2f}x")
    print()
EOF
