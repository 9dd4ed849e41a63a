#!/usr/bin/env bash
# Builds the TypeScript client and runs its tests against a live daemon.
#   clients/typescript/test.sh --binary PATH/TO/custos
# Needs node >= 18 and npm (the npm registry, for typescript and @types/node).
set -euo pipefail

usage() { echo "usage: $0 --binary PATH" >&2; exit 64; }
binary=""
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) [ $# -ge 2 ] || usage; binary="$2"; shift 2 ;;
    --binary=*) binary="${1#--binary=}"; shift ;;
    *) usage ;;
  esac
done
[ -n "$binary" ] || usage
[ -x "$binary" ] || { echo "$0: $binary is not an executable" >&2; exit 64; }

CUSTOS_BINARY="$(realpath "$binary")"  # before the cd: a relative path is the caller's
cd "$(dirname "$0")"
export CUSTOS_BINARY
# The sanitizer builds report leaks at exit; the daemon's exit status is not what is tested here.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}"

npm ci --quiet --no-audit --no-fund >/dev/null
rm -rf dist
npx --no-install tsc -p .
# One file at a time where node can be told so: each test file starts its own daemon.
concurrency=()
if node --help | grep -q -- '--test-concurrency'; then concurrency=(--test-concurrency=1); fi
node --test "${concurrency[@]}" dist/test/*.test.js
