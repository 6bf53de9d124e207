#!/usr/bin/env bash
# Drain rates on the Galera cluster of scripts/galera.sh: three `rowbus consume` processes
# on one node, then the same three spread one per node, over the same backlog, with the
# cluster's certification conflicts (wsrep_local_cert_failures + wsrep_local_bf_aborts,
# summed over the nodes) per 1,000 messages. Several `rowbus` binaries (a build before a
# change and after it, say) run interleaved, each run in the order given, so that they
# share the machine's ups and downs.
#
#   scripts/galera.sh up
#   scripts/galera-bench.sh [--runs N] [--messages N] [--workers N] [--modes "MODE..."] ROWBUS_BINARY...
#
# Modes (default "one-node spread"): one-node, all three consumers on node 1; spread, one
# per node; two-nodes, one on node 1 and two on node 2, none on node 3 (as when node 3's
# consumers are gone: the others must drain its lane).
#
# One line per drain: binary, mode (one-node or spread), messages, seconds, messages/s,
# conflicts per 1,000 messages, of which certification failures at COMMIT and
# transactions aborted by another node's replicated writes (brute-force aborts), and the
# CPU seconds the three nodes' servers used; then each binary's medians and its
# spread/one-node ratio.
set -euo pipefail
runs=3 messages=6000 workers=4 modes="one-node spread"
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --messages) messages=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    -*) echo "galera-bench: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: scripts/galera-bench.sh [--runs N] [--messages N] [--workers N] ROWBUS_BINARY..." >&2; exit 2; }
for bin in "$@"; do [ -x "$bin" ] || { echo "galera-bench: $bin is not an executable" >&2; exit 2; }; done

url() { echo "mysql://root@127.0.0.1:$((3310 + $1))/test"; }
sql() { mariadb -h 127.0.0.1 -P 3311 -u root -N -B test -e "$1"; }
conflicts() { # certification failures and brute-force aborts, summed over the nodes
  local n cert=0 bf=0
  for n in 1 2 3; do
    cert=$((cert + $(mariadb -h 127.0.0.1 -P $((3310 + n)) -u root -N -B -e "SHOW GLOBAL STATUS LIKE 'wsrep_local_cert_failures'" | cut -f2)))
    bf=$((bf + $(mariadb -h 127.0.0.1 -P $((3310 + n)) -u root -N -B -e "SHOW GLOBAL STATUS LIKE 'wsrep_local_bf_aborts'" | cut -f2)))
  done
  echo "$cert $bf"
}
cpu() { # CPU seconds the nodes' servers have used (user + system)
  local n ticks=0 pid
  for n in 1 2 3; do
    pid=$(cat "${GALERA_DIR:-/tmp/rowbus-galera}/node$n/mysqld.pid" 2>/dev/null) || continue
    ticks=$((ticks + $(awk '{ print $14 + $15 }' "/proc/$pid/stat" 2>/dev/null || echo 0)))
  done
  echo "$ticks $(getconf CLK_TCK)" | awk '{ printf "%.1f", $1 / $2 }'
}

results=$(mktemp)
pids=()
stop_consumers() {
  local pid
  for pid in "${pids[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
table=""
cleanup() {
  stop_consumers
  [ -z "$table" ] || sql "DROP TABLE IF EXISTS \`$table\`, \`${table}_dead\`, \`${table}_pause\`" || true
  rm -f "$results"
}
trap cleanup EXIT

drain() { # binary, mode, run
  local bin=$1 mode=$2 run=$3
  table="gbench_$$_${run}_${mode//-/_}"
  "$bin" deploy --database-url "$(url 1)" --queue "$table" >/dev/null 2>&1
  # The backlog comes from all three nodes, as from publishers spread over the cluster.
  local n per=$((messages / 3))
  for n in 1 2 3; do
    seq 1 "$per" | sed "s/^/node$n-/" | "$bin" publish --database-url "$(url "$n")" "$table" - >/dev/null
  done
  local total=$((per * 3))
  sleep 2 # every node applied the backlog
  local before start end after cpu_before cpu_after
  before=$(conflicts)
  cpu_before=$(cpu)
  start=$(date +%s.%N)
  for n in 1 2 3; do
    local node=1
    [ "$mode" = spread ] && node=$n
    [ "$mode" = two-nodes ] && node=$((n == 1 ? 1 : 2))
    "$bin" consume --database-url "$(url "$node")" --workers "$workers" --poll-interval 100ms "$table" \
      >/dev/null 2>>"/tmp/galera-bench-$$.log" &
    pids+=($!)
  done
  while [ "$(sql "SELECT COUNT(*) FROM \`$table\`")" != 0 ]; do sleep 0.05; done
  end=$(date +%s.%N)
  cpu_after=$(cpu)
  stop_consumers
  after=$(conflicts)
  sql "DROP TABLE IF EXISTS \`$table\`, \`${table}_dead\`, \`${table}_pause\`"
  table=""
  awk -v b="$bin" -v m="$mode" -v n="$total" -v s="$start" -v e="$end" -v before="$before" -v after="$after" \
    -v cpu="$(awk -v a="$cpu_before" -v z="$cpu_after" 'BEGIN { print z - a }')" \
    'BEGIN { t = e - s; split(before, x, " "); split(after, y, " "); cert = y[1] - x[1]; bf = y[2] - x[2]
      printf "%s %s %d %.2f %.0f %.1f %.1f %.1f %.1f\n", b, m, n, t, n / t, (cert + bf) * 1000 / n, cert * 1000 / n, bf * 1000 / n, cpu }' |
    tee -a "$results"
}

echo "binary mode messages seconds messages/s conflicts/1000 cert/1000 bf/1000 server-cpu-s"
for run in $(seq 1 "$runs"); do
  for bin in "$@"; do
    for mode in $modes; do drain "$bin" "$mode" "$run"; done
  done
done
echo "medians:"
for bin in "$@"; do
  awk -v b="$bin" '
    function median(a, n,   i, j, t) {
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    $1 == b && $2 == "one-node" { one[++o] = $5; c1[o] = $6 }
    $1 == b && $2 == "spread" { sp[++s] = $5; c2[s] = $6 }
    $1 == b && $2 == "two-nodes" { tw[++t] = $5; c3[t] = $6 }
    END {
      line = b ":"
      if (o) line = line sprintf(" one node %.0f/s (%.1f conflicts/1000),", median(one, o), median(c1, o))
      if (s) line = line sprintf(" spread %.0f/s (%.1f conflicts/1000),", median(sp, s), median(c2, s))
      if (t) line = line sprintf(" two nodes %.0f/s (%.1f conflicts/1000),", median(tw, t), median(c3, t))
      if (o && s) line = line sprintf(" spread/one-node %.2fx", median(sp, s) / median(one, o))
      print line
    }' "$results"
done
