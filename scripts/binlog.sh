#!/usr/bin/env bash
# A throwaway MariaDB that writes a binary log, on 127.0.0.1:3361 (data under
# $BINLOG_DIR, /tmp/rowbus-binlog): what a listener's push path reads on MySQL/MariaDB
# (the shared server on 3306 runs without log_bin). A `test` database; root without a
# password, as on the shared server. Needs root (it runs mariadbd as `mysql`).
#
#   scripts/binlog.sh up       start it when it is down (a fresh data directory) and wait
#                              until it answers
#   scripts/binlog.sh down     stop it and remove the data
#   scripts/binlog.sh status   running or not, log_bin, binlog_format
#
# BINLOG_FORMAT (ROW, the default, or MIXED, STATEMENT) picks the server's binlog_format.
set -euo pipefail

DIR=${BINLOG_DIR:-/tmp/rowbus-binlog}
PORT=${BINLOG_PORT:-3361}
FORMAT=${BINLOG_FORMAT:-ROW}
WAIT=${BINLOG_WAIT:-60}

die() { echo "binlog: $*" >&2; exit 1; }

sql() { mariadb -h 127.0.0.1 -P "$PORT" -u root -N -B -e "$1" 2>/dev/null; }

pid_of() { # the server's pid, if it runs
  local f pid
  for f in "$DIR/mysqld.pid" "$DIR/launched.pid"; do
    [ -s "$f" ] || continue
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then echo "$pid"; return 0; fi
  done
  return 1
}

config() {
  cat >"$DIR/my.cnf" <<EOF
[mysqld]
user = mysql
datadir = $DIR/data
socket = $DIR/mysqld.sock
pid-file = $DIR/mysqld.pid
log-error = $DIR/error.log
bind-address = 127.0.0.1
port = $PORT
skip-name-resolve
character-set-server = utf8mb4
collation-server = utf8mb4_general_ci
max_connections = 300
innodb_buffer_pool_size = 64M
innodb_log_file_size = 48M
server_id = 1
log_bin = $DIR/data/binlog
binlog_format = $FORMAT
expire_logs_days = 1
# Per-connection counters (performance_schema.status_by_thread): what one listener reads.
performance_schema = ON
[client]
socket = $DIR/mysqld.sock
EOF
}

up() {
  command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || die "mariadbd is not installed (Debian's mariadb-server)"
  if pid_of >/dev/null; then
    echo "binlog: already runs on 127.0.0.1:$PORT" >&2
  else
    rm -rf "$DIR"
    mkdir -p "$DIR/data"
    chmod 755 "$DIR"
    config
    chown -R mysql:mysql "$DIR"
    mariadb-install-db --defaults-file="$DIR/my.cnf" --auth-root-authentication-method=normal \
      --skip-test-db >"$DIR/install.log" 2>&1 || { cat "$DIR/install.log" >&2; die "mariadb-install-db failed"; }
    # setsid: the server outlives the shell (and the test process) that started it; not
    # being a group leader, it execs mariadbd in place, so $! is the server.
    setsid /usr/sbin/mariadbd --defaults-file="$DIR/my.cnf" </dev/null >>"$DIR/console.log" 2>&1 &
    echo $! >"$DIR/launched.pid"
  fi
  for _ in $(seq 1 "$WAIT"); do
    if [ "$(sql 'SELECT @@log_bin')" = 1 ]; then
      sql "CREATE DATABASE IF NOT EXISTS test" || die "cannot create the test database"
      echo "binlog: MariaDB with log_bin ($(sql 'SELECT @@binlog_format')) on 127.0.0.1:$PORT" >&2
      return 0
    fi
    pid_of >/dev/null || break
    sleep 0.5
  done
  tail -n 30 "$DIR/error.log" >&2 || true
  die "the server did not come up"
}

down() {
  local pid
  if pid=$(pid_of); then
    kill -TERM "$pid" || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -rf "$DIR"
  echo "binlog: stopped" >&2
}

status() {
  if pid_of >/dev/null; then
    echo "127.0.0.1:$PORT: running, log_bin $(sql 'SELECT @@log_bin' || echo '?'), binlog_format $(sql 'SELECT @@binlog_format' || echo '?')"
  else
    echo "127.0.0.1:$PORT: down"
  fi
}

[ "$(id -u)" = 0 ] || die "run as root (the server runs as the mysql user)"
case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) die "usage: scripts/binlog.sh up|down|status" ;;
esac
