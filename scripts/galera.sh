#!/usr/bin/env bash
# A throwaway three-node MariaDB Galera cluster on 127.0.0.1 for the cluster tests and
# measurements: nodes 1-3 take clients on ports 3311-3313, each with its own data directory
# under $GALERA_DIR (/tmp/rowbus-galera), its own gcomm (4611-4613), IST (4621-4623) and
# SST (4631-4633) ports, and a `test` database. Needs root (it runs mariadbd as `mysql`).
#
#   scripts/galera.sh up        start what is down (a fresh cluster when no node runs) and
#                               wait until all three are ready in one cluster of three
#   scripts/galera.sh down      stop every node and remove the data
#   scripts/galera.sh kill N    SIGKILL node N's server (a crash)
#   scripts/galera.sh start N   start node N again (it rejoins by IST or SST) and wait until
#                               it is synced
#   scripts/galera.sh status    each node: running or not, ready, cluster size, state
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

DIR=${GALERA_DIR:-/tmp/rowbus-galera}
NODES=(1 2 3)
PROVIDER=/usr/lib/galera/libgalera_smm.so
WAIT=${GALERA_WAIT:-180}

port() { echo $((3310 + $1)); }
gcomm_port() { echo $((4610 + $1)); }
members() { echo "gcomm://127.0.0.1:4611,127.0.0.1:4612,127.0.0.1:4613"; }

die() { echo "galera: $*" >&2; exit 1; }

install_packages() {
  local missing=()
  [ -e "$PROVIDER" ] || missing+=(galera-4)
  command -v rsync >/dev/null || missing+=(rsync)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "galera: installing ${missing[*]}" >&2
    apt-get install -y "${missing[@]}" || { apt-get update && apt-get install -y "${missing[@]}"; }
  fi
  command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || die "mariadbd is not installed (Debian's mariadb-server)"
}

config() { # node
  local n=$1 d="$DIR/node$1"
  cat >"$d/my.cnf" <<EOF
[mysqld]
user = mysql
datadir = $d/data
socket = $d/mysqld.sock
pid-file = $d/mysqld.pid
log-error = $d/error.log
bind-address = 127.0.0.1
port = $(port "$n")
skip-name-resolve
character-set-server = utf8mb4
collation-server = utf8mb4_general_ci
max_connections = 500
innodb_buffer_pool_size = 64M
innodb_log_file_size = 48M
innodb_flush_log_at_trx_commit = 2
binlog_format = ROW
default_storage_engine = InnoDB
innodb_autoinc_lock_mode = 2
wsrep_on = ON
wsrep_provider = $PROVIDER
wsrep_cluster_name = rowbus_galera
wsrep_cluster_address = $(members)
wsrep_node_name = node$n
wsrep_node_address = 127.0.0.1:$(gcomm_port "$n")
wsrep_provider_options = "gmcast.listen_addr=tcp://127.0.0.1:$(gcomm_port "$n");ist.recv_addr=127.0.0.1:$((4620 + n));gcache.size=64M"
wsrep_sst_method = rsync
wsrep_sst_receive_address = 127.0.0.1:$((4630 + n))
[client]
socket = $d/mysqld.sock
EOF
}

pid_of() { # node: the server's pid, if it runs (launched.pid is there before the server
  # writes its own pid file)
  local f pid
  for f in "$DIR/node$1/mysqld.pid" "$DIR/node$1/launched.pid"; do
    [ -s "$f" ] || continue
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then echo "$pid"; return 0; fi
  done
  return 1
}

sql() { # node, statement
  mariadb -h 127.0.0.1 -P "$(port "$1")" -u root -N -B -e "$2" 2>/dev/null
}

status_var() { # node, variable
  sql "$1" "SHOW GLOBAL STATUS LIKE '$2'" | cut -f2
}

ready() { # node: accepts clients, wsrep_ready=ON, synced, cluster of three
  [ "$(status_var "$1" wsrep_ready)" = ON ] &&
    [ "$(status_var "$1" wsrep_cluster_size)" = 3 ] &&
    [ "$(status_var "$1" wsrep_local_state_comment)" = Synced ]
}

wait_ready() { # nodes...
  local n
  for _ in $(seq 1 "$WAIT"); do
    local all=1
    for n in "$@"; do ready "$n" || { all=0; break; }; done
    [ "$all" = 1 ] && return 0
    sleep 1
  done
  for n in "$@"; do
    if ! ready "$n"; then
      echo "galera: node $n is not ready after ${WAIT} s; the end of $DIR/node$n/error.log:" >&2
      tail -n 30 "$DIR/node$n/error.log" >&2 || true
    fi
  done
  return 1
}

wait_accepting() { # node: the server answers (a bootstrapped first node)
  for _ in $(seq 1 "$WAIT"); do
    [ "$(status_var "$1" wsrep_ready)" = ON ] && return 0
    pid_of "$1" >/dev/null || break
    sleep 1
  done
  echo "galera: node $1 did not come up; the end of $DIR/node$1/error.log:" >&2
  tail -n 30 "$DIR/node$1/error.log" >&2 || true
  return 1
}

launch() { # node, extra flags...
  local n=$1; shift
  local d="$DIR/node$n"
  rm -f "$d/mysqld.pid"
  # setsid: the server outlives the shell (and a test process) that started it; not being
  # a group leader, it execs mariadbd in place, so $! is the server.
  setsid /usr/sbin/mariadbd --defaults-file="$d/my.cnf" "$@" </dev/null >>"$d/console.log" 2>&1 &
  echo $! >"$d/launched.pid"
}

fresh_node() { # node: an empty data directory with the system tables
  local n=$1 d="$DIR/node$1"
  mkdir -p "$d/data"
  config "$n"
  chown -R mysql:mysql "$d"
  mariadb-install-db --defaults-file="$d/my.cnf" --auth-root-authentication-method=normal \
    --skip-test-db >"$d/install.log" 2>&1 || { cat "$d/install.log" >&2; die "mariadb-install-db failed for node $n"; }
}

up() {
  install_packages
  local running=() n
  for n in "${NODES[@]}"; do pid_of "$n" >/dev/null && running+=("$n"); done
  if [ ${#running[@]} -eq 0 ]; then
    echo "galera: starting a new cluster in $DIR" >&2
    rm -rf "$DIR"
    mkdir -p "$DIR"
    chmod 755 "$DIR"
    for n in "${NODES[@]}"; do fresh_node "$n"; done
    launch 1 --wsrep-new-cluster
    wait_accepting 1
    sql 1 "CREATE DATABASE IF NOT EXISTS test" || die "cannot create the test database on node 1"
    for n in 2 3; do
      launch "$n"
      # One joiner at a time: two rsync SSTs from one donor at once only take longer.
      for _ in $(seq 1 "$WAIT"); do
        [ "$(status_var "$n" wsrep_local_state_comment)" = Synced ] && break
        pid_of "$n" >/dev/null || break
        sleep 1
      done
    done
  else
    for n in "${NODES[@]}"; do
      pid_of "$n" >/dev/null || start_node "$n" nowait
    done
  fi
  wait_ready "${NODES[@]}" || die "the cluster did not form (see the logs above)"
  echo "galera: nodes on 127.0.0.1:3311-3313 ready, cluster size 3" >&2
}

start_node() { # node [nowait]
  local n=$1
  [ -f "$DIR/node$n/my.cnf" ] || die "node $n has no data directory: run 'scripts/galera.sh up'"
  if pid_of "$n" >/dev/null; then
    echo "galera: node $n already runs" >&2
  else
    # A crashed node's grastate says seqno -1; the server recovers its position itself and
    # asks a donor for the rest (IST, or SST by rsync).
    chown -R mysql:mysql "$DIR/node$n"
    launch "$n"
  fi
  [ "${2:-}" = nowait ] && return 0
  wait_ready "$n" || die "node $n did not rejoin (see the log above)"
}

kill_node() { # node
  local pid
  pid=$(pid_of "$1") || die "node $1 is not running"
  kill -KILL "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  echo "galera: node $1 killed" >&2
}

down() {
  local n pid
  for n in "${NODES[@]}"; do
    if pid=$(pid_of "$n"); then
      kill -TERM "$pid" || true
      for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$DIR"
  echo "galera: stopped" >&2
}

status() {
  local n
  for n in "${NODES[@]}"; do
    if pid_of "$n" >/dev/null; then
      echo "node $n (port $(port "$n")): running, ready $(status_var "$n" wsrep_ready || echo '?'), cluster size $(status_var "$n" wsrep_cluster_size || echo '?'), $(status_var "$n" wsrep_local_state_comment || echo '?')"
    else
      echo "node $n (port $(port "$n")): down"
    fi
  done
}

node_arg() {
  case "${1:-}" in 1 | 2 | 3) echo "$1" ;; *) die "expected a node number 1, 2 or 3, got '${1:-}'" ;; esac
}

[ "$(id -u)" = 0 ] || die "run as root (the nodes run as the mysql user)"
case "${1:-}" in
  up) up ;;
  down) down ;;
  kill) kill_node "$(node_arg "${2:-}")" ;;
  start) start_node "$(node_arg "${2:-}")" ;;
  status) status ;;
  *) die "usage: scripts/galera.sh up|down|kill N|start N|status" ;;
esac
