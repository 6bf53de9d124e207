#!/usr/bin/env bash
# The minimum supported Rust version: checks that no dependency in Cargo.lock asks for a
# newer Rust than the workspace's `rust-version`, and that the toolchain of exactly that
# version is installed; prints its name. .ci/run runs its lints (clippy, a full build of
# every target) with that toolchain, so the workspace is built with its oldest supported
# Rust, not only with whatever is newest.
set -euo pipefail
cd "$(dirname "$0")/.."
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
[ -n "$msrv" ] || { echo "msrv: no rust-version in Cargo.toml" >&2; exit 1; }
toolchain=$msrv
[[ $toolchain == *.*.* ]] || toolchain="$toolchain.0"

# Every package's declared rust-version is at most ours.
cargo metadata --format-version 1 --locked | python3 -c '
import json, sys
msrv = tuple(int(x) for x in sys.argv[1].split("."))
newer = []
for p in json.load(sys.stdin)["packages"]:
    wants = p.get("rust_version")
    if wants and tuple(int(x) for x in wants.split(".")) > msrv + (0,) * (3 - len(msrv)):
        newer.append(f"{p['"'"'name'"'"']} {p['"'"'version'"'"']} needs Rust {wants}")
if newer:
    sys.exit("msrv: dependencies need a newer Rust than rust-version " + sys.argv[1] + ":\n  " + "\n  ".join(newer))
' "$toolchain"

if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1; then
  echo "msrv: Rust $toolchain (rust-version in Cargo.toml) is not installed: rustup toolchain install $toolchain" >&2
  exit 1
fi
echo "$toolchain"
