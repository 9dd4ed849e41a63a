#!/usr/bin/env bash
# The Python client's suite: installs the package offline into a fresh venv (Debian's Python and
# build tools; no package index is reached) and runs its tests against a real daemon.
#
#   clients/python/test.sh --binary PATH [pytest args...]      (or $CUSTOS_BINARY)
set -euo pipefail

binary="${CUSTOS_BINARY:-}"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) [ $# -ge 2 ] || { echo "test.sh: --binary needs a path" >&2; exit 64; }
              binary="$2"; shift 2 ;;
    --binary=*) binary="${1#--binary=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ -z "$binary" ]; then
  echo "usage: $0 --binary PATH [pytest args...]   (or set CUSTOS_BINARY)" >&2
  exit 64
fi
binary="$(cd "$(dirname "$binary")" && pwd)/$(basename "$binary")"
[ -x "$binary" ] || { echo "test.sh: not an executable: $binary" >&2; exit 64; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Debian's packages, installed when missing (`python3` on PATH may be another Python without them).
packages=(python3-setuptools python3-wheel python3-pip python3-venv python3-pytest mypy)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "${missing[@]}" >/dev/null ||
    { apt-get update -qq >/dev/null && apt-get install -y -qq "${missing[@]}" >/dev/null; }
fi

tmp="$(mktemp -d -t custos-pyclient-venv.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 -m venv --system-site-packages "$tmp/venv"
# pip builds in the source tree it is given: build a copy, so the checkout stays clean.
cp -r "$here" "$tmp/src"
rm -rf "$tmp/src/build" "$tmp/src"/src/*.egg-info
"$tmp/venv/bin/python" -m pip install -q --no-index --no-build-isolation "$tmp/src"

cd "$here"
export PYTHONDONTWRITEBYTECODE=1
# The package is typed for its users: its annotations must hold, for the oldest Python it supports.
/usr/bin/python3 -m mypy --strict --python-version 3.9 --cache-dir "$tmp/mypy" src examples
"$tmp/venv/bin/python" -m pytest -q -p no:cacheprovider --basetemp "$tmp/pytest" tests \
  --binary "$binary" \
  ${args[@]+"${args[@]}"}
