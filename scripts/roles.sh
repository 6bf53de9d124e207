#!/usr/bin/env bash
# Creates rowbus's least-privilege database roles and grants them what they need, nothing
# more: notifier, listener, publisher, consumer, and monitor (read-only: rowbus stats,
# dead list, history). Idempotent: run it again after adding a
# queue table. The SQL is in crates/rowbus-chaos/roles/{postgres,mariadb}.sql (the chaos
# harness, `rowbus-chaos`, applies the same files); docs/operating.md lists the grants.
#
#   scripts/roles.sh postgres --password SECRET --queue jobs --queue app.mail
#   scripts/roles.sh mariadb  --password SECRET --notify-table rowbus_notify --queue jobs --listen-notify
#
# The tables must exist first (`rowbus deploy`, `Queue::deploy`). Connects as an
# administrator with psql or the mariadb client; their usual environment (PGPASSWORD,
# MYSQL_PWD) supplies an admin password.
set -euo pipefail

usage() {
  cat >&2 <<'USAGE'
usage: scripts/roles.sh postgres|mariadb [options]
  --password PW        password of the created roles (or ROWBUS_ROLE_PASSWORD); required
  --prefix P           role names are P + notifier|listener|publisher|consumer|monitor
                       [rowbus_]
  --host H             server host [127.0.0.1]
  --port N             server port [5432 | 3306]
  --admin USER         administrator to connect as [postgres | root]
  --database DB        database [test]
  --notify-table T     grant the notifier, listener and monitor on this notify table and
                       (monitor) its positions table, T_positions (MySQL/MariaDB)
  --queue T            grant the publisher, consumer and monitor on queue table T (repeatable;
                       schema-qualified as schema.table)
  --listen-notify      the queues use listen_notify: also grant the wake-up notifications
  --dry-run            print the SQL instead of running it
USAGE
  exit 2
}

[[ $# -ge 1 ]] || usage
db=$1; shift
case $db in postgres|mariadb) ;; *) usage ;; esac

password=${ROWBUS_ROLE_PASSWORD:-}
prefix=rowbus_
host=127.0.0.1
port=
admin=
database=test
notify_table=
queues=()
listen_notify=0
dry_run=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --password) password=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --host) host=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --admin) admin=$2; shift 2 ;;
    --database) database=$2; shift 2 ;;
    --notify-table) notify_table=$2; shift 2 ;;
    --queue) queues+=("$2"); shift 2 ;;
    --listen-notify) listen_notify=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    *) usage ;;
  esac
done

die() { echo "roles.sh: $*" >&2; exit 1; }
ident='^[A-Za-z_][A-Za-z0-9_]*$'
[[ -n $password ]] || die "a password is required (--password or ROWBUS_ROLE_PASSWORD)"
# Substituted into quoted SQL strings: no quotes, backslashes or other surprises.
[[ $password =~ ^[A-Za-z0-9_.,:+=@%-]+$ ]] || die "the password may hold only letters, digits and _.,:+=@%-"
[[ $prefix =~ $ident ]] || die "invalid prefix: $prefix"
[[ $database =~ $ident ]] || die "invalid database: $database"
[[ -z $notify_table || $notify_table =~ $ident ]] || die "invalid notify table: $notify_table"
if [[ $db == mariadb && $listen_notify == 1 && ${#queues[@]} -gt 0 && -z $notify_table ]]; then
  die "--listen-notify on MySQL/MariaDB needs --notify-table"
fi

sql_file="$(dirname "$0")/../crates/rowbus-chaos/roles/$db.sql"
# The statements of one section of the SQL file.
section() {
  awk -v want="$1" '/^-- @section /{ on = ($3 == want); next } on' "$sql_file"
}
# The password as the SQL shows it: masked in a dry run, which prints it.
shown_password=$password
[[ $dry_run == 1 ]] && shown_password='***'
# A section with its placeholders substituted.
render() { # section schema queue
  section "$1" | sed -e "s/@PREFIX@/$prefix/g" -e "s/@PASSWORD@/$shown_password/g" \
    -e "s/@DATABASE@/$database/g" -e "s/@SCHEMA@/$2/g" -e "s/@QUEUE@/$3/g" \
    -e "s/@NOTIFY@/$notify_table/g"
}

default_schema=public
[[ $db == mariadb ]] && default_schema=$database
{
  render roles "$default_schema" ""
  if [[ -n $notify_table ]]; then render notify "$default_schema" ""; fi
  for queue in "${queues[@]}"; do
    schema=$default_schema
    table=$queue
    if [[ $queue == *.* ]]; then schema=${queue%%.*}; table=${queue#*.}; fi
    [[ $schema =~ $ident && $table =~ $ident ]] || die "invalid queue table: $queue"
    render queue "$schema" "$table"
    if [[ $listen_notify == 1 ]]; then render queue-listen-notify "$schema" "$table"; fi
  done
} >"${TMPDIR:-/tmp}/rowbus-roles.$$.sql"
trap 'rm -f "${TMPDIR:-/tmp}/rowbus-roles.$$.sql"' EXIT
rendered="${TMPDIR:-/tmp}/rowbus-roles.$$.sql"

if [[ $dry_run == 1 ]]; then
  cat "$rendered"
  exit 0
fi
case $db in
  postgres)
    psql -X -q -v ON_ERROR_STOP=1 -h "$host" -p "${port:-5432}" -U "${admin:-postgres}" -d "$database" \
      -f "$rendered" ;;
  mariadb)
    mariadb -h "$host" -P "${port:-3306}" -u "${admin:-root}" "$database" <"$rendered" ;;
esac
echo "roles.sh: roles ${prefix}{notifier,listener,publisher,consumer,monitor} ready on $db ($database)" >&2
