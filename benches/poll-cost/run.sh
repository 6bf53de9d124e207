#!/usr/bin/env bash
# What the emulated LISTEN's polls cost, this checkout against another commit, interleaved
# in one run (crates/rowbus/examples/poll_cost.rs says what is measured and how).
#
#   benches/poll-cost/run.sh [BASE] [setting=value ...]
#
# BASE (default `main`) is exported with `git archive` into $BASE_DIR (default
# ${TMPDIR:-/tmp}/poll-cost-SHA) and built there, into $BASE_TARGET (default
# $BASE_DIR/target), with this checkout's poll_cost example; an older core (one that
# re-read the lookback window on every poll, such as 4c992a0) has no `at` column, so that
# line of the example's decoders is dropped for it. Settings go to the example unchanged
# (rate=1000 lookback=60 poll=1 warmup=65 measure=20 by default; lead, the writing before
# the subscribe, fills a lookback by default; warmup=0 measures from the subscribe on).
# BASE_DIR may be an existing checkout of BASE (a `git worktree`): it is used as it is.
# ROUNDS (default 2) rounds, each running BASE then this checkout on every URL in URLS
# (default: the test MariaDB and a temporary SQLite file).
set -euo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
base=main
if [ $# -gt 0 ] && [[ $1 != *=* ]]; then
    base=$1
    shift
fi
rounds=${ROUNDS:-2}
sqlite_file=${TMPDIR:-/tmp}/poll_cost_bench_$$.sqlite
urls=${URLS:-"mysql://root@127.0.0.1:3306/test sqlite://$sqlite_file"}
sha=$(git -C "$here" rev-parse --short "$base")
work=${BASE_DIR:-${TMPDIR:-/tmp}/poll-cost-$sha}
base_target=${BASE_TARGET:-$work/target}
new_target=${CARGO_TARGET_DIR:-$here/target}

if [ ! -f "$work/Cargo.toml" ]; then
    mkdir -p "$work"
    git -C "$here" archive "$sha" | tar -x -C "$work"
fi
mkdir -p "$work/crates/rowbus/examples"
cp "$here/crates/rowbus/examples/poll_cost.rs" "$work/crates/rowbus/examples/poll_cost.rs"
if ! grep -q 'pub at: Option<String>' "$work/crates/notify-table/src/statement.rs"; then
    sed -i '/at: r.try_get(5)?/d' "$work/crates/rowbus/examples/poll_cost.rs"
fi
echo "building $base ($sha) in $work and this checkout ($(git -C "$here" rev-parse --short HEAD)$(git -C "$here" diff --quiet || echo '+changes'))"
(cd "$work" && CARGO_TARGET_DIR=$base_target cargo build --release -q -p rowbus --example poll_cost)
(cd "$here" && CARGO_TARGET_DIR=$new_target cargo build --release -q -p rowbus --example poll_cost)

for round in $(seq "$rounds"); do
    for url in $urls; do
        for which in base new; do
            if [ "$which" = base ]; then bin=$base_target/release/examples/poll_cost; else bin=$new_target/release/examples/poll_cost; fi
            echo "== round $round: $which ($([ "$which" = base ] && echo "$base $sha" || echo HEAD)) on ${url%%:*}"
            "$bin" "$url" "$@"
            rm -f "$sqlite_file" "$sqlite_file-wal" "$sqlite_file-shm"
        done
    done
done
