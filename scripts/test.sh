#!/usr/bin/env bash
# The test command: starts the database services if they are down, then runs every test
# of the workspace against them (PostgreSQL and MariaDB on 127.0.0.1, SQLite in temp files).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
cargo test --workspace "$@"
