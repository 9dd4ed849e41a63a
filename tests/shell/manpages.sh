#!/usr/bin/env bash
# The generated man pages render without a single groff warning (-ww: all of them), have their
# sections, and the gzipped copies the package installs hold the same bytes.
# Usage: manpages.sh BUILD_DIR SHELL_DOCS_DIR
set -uo pipefail
man_dir="$2/share/man"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
for page in man1/custos.1 man8/custos-daemon.8 man5/custos.toml.5; do
  f="$man_dir/$page"
  [ -s "$f" ] || { fail "missing $f"; continue; }
  warnings=$(groff -man -ww -z -Tutf8 "$f" 2>&1) || fail "groff failed on $page"
  [ -z "$warnings" ] || fail "$page: groff warnings:"$'\n'"$warnings"
  warnings=$(LC_ALL=C.UTF-8 MANROFFSEQ='' MANWIDTH=80 man --warnings -l "$f" 2>&1 >/dev/null)
  [ -z "$warnings" ] || fail "$page: man --warnings:"$'\n'"$warnings"
  text=$(groff -man -Tutf8 -P-c "$f" 2>/dev/null | col -bx)
  for sec in NAME SYNOPSIS DESCRIPTION "SEE ALSO"; do
    grep -q "^$sec" <<<"$text" || fail "$page has no $sec section"
  done
  zcat "$f.gz" | cmp -s - "$f" || fail "$page.gz differs from $page"
  echo "ok:   $page ($(wc -l <<<"$text") lines rendered)"
done
grep -q -- '--boundary' <<<"$(groff -man -Tutf8 -P-c "$man_dir/man8/custos-daemon.8" | col -bx)" \
  || fail "custos-daemon(8) does not render --boundary"
if [ "$fails" -ne 0 ]; then
  echo "man pages: $fails failure(s)"
  exit 1
fi
echo "man pages: all render cleanly"
