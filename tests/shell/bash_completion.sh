#!/usr/bin/env bash
# The generated bash completion, driven for real: source it in bash and call its completion
# function as readline would (COMP_WORDS/COMP_CWORD), then compare COMPREPLY.
# Usage: bash_completion.sh BUILD_DIR SHELL_DOCS_DIR
set -uo pipefail
script="$2/share/bash-completion/completions/custos"
[ -f "$script" ] || { echo "missing $script" >&2; exit 1; }
# shellcheck source=/dev/null
source "$script"
fails=0

# expect "WANTED REPLIES" WORD...: the words of the command line, the last one under the cursor.
expect() {
  local want=$1
  shift
  COMP_WORDS=("$@")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMP_LINE="$*"
  COMP_POINT=${#COMP_LINE}
  COMPREPLY=()
  _custos custos "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
  local got
  got=$(printf '%s\n' "${COMPREPLY[@]}" | sort | paste -sd' ')
  if [ "$got" != "$want" ]; then
    printf 'FAIL: %s<TAB> -> "%s", wanted "%s"\n' "$*" "$got" "$want"
    fails=$((fails + 1))
  else
    printf 'ok:   %s<TAB> -> %s\n' "$*" "${got:-(none: file names)}"
  fi
}

[[ $(complete -p custos) == *"-F _custos"* ]] || { echo "FAIL: complete -p custos"; fails=$((fails + 1)); }
expect "grant" custos gr
expect "daemon doctor" custos d
expect "--sandbox --sandbox-profile" custos run --sa
expect "auto cgroup marker" custos daemon --boundary ""
expect "cgroup" custos daemon --boundary = c
expect "auto cgroup marker" custos daemon --boundary =
expect "warning" custos daemon --log-level w
expect "cancel detach" custos daemon --config /etc/custos/custos.toml --shutdown ""
expect "add list revoke show" custos grant ""
expect "--principal" custos grant add --pr
expect "build" custos run --sandbox-profile ""
expect "grant" custos --socket /tmp/x.sock gr
expect "grant" custos --json gr
expect "--read-only" custos run --pty --clean-env --rea
expect "--json" custos --socket /tmp/x.sock grant list --js
expect "--follow" custos logs --fo
expect "--config --follow --help --json --socket -f -h" custos logs -
expect "" custos run --cwd ""
expect "" custos run -- ""
expect "acquire" custos lease a
expect "--all" custos lease list --a
if [ "$fails" -ne 0 ]; then
  echo "bash completion: $fails failure(s)"
  exit 1
fi
echo "bash completion: all cases pass"
