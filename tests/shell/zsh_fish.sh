#!/usr/bin/env bash
# The generated zsh and fish completions: both parse (zsh -n, fish -n); zsh's registers itself
# with compinit; fish's completes for real (complete -C).
# Usage: zsh_fish.sh BUILD_DIR SHELL_DOCS_DIR
set -uo pipefail
zsh_script="$2/share/zsh/vendor-completions/_custos"
fish_script="$2/share/fish/vendor_completions.d/custos.fish"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

zsh -n "$zsh_script" || fail "zsh -n $zsh_script"
fish -n "$fish_script" || fail "fish -n $fish_script"

home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
# Sourced after compinit, the script binds _custos to custos and defines one function per command.
got=$(HOME=$home ZDOTDIR=$home zsh -f -c "autoload -Uz compinit && compinit -u -D && source '$zsh_script' \
  && print -r -- \$_comps[custos] \${+functions[_custos_grant_add]} \${+functions[_custos_daemon]}" 2>&1)
[ "$got" = "_custos 1 1" ] || fail "zsh: compdef/functions: $got"

# fish_expect "WANTED" "COMMAND LINE": the completions (without descriptions), sorted.
fish_expect() {
  local got
  got=$(HOME=$home XDG_CONFIG_HOME=$home fish --no-config -c "source '$fish_script'; complete -C '$2'" \
    2>&1 | cut -f1 | sort | paste -sd' ')
  if [ "$got" != "$1" ]; then
    fail "fish: '$2' -> \"$got\", wanted \"$1\""
  else
    echo "ok:   fish '$2' -> $got"
  fi
}
fish_expect "grant" "custos gr"
fish_expect "add list revoke show" "custos grant "
fish_expect "auto cgroup marker" "custos daemon --boundary "
fish_expect "--sandbox --sandbox-profile" "custos run --sa"
fish_expect "--principal" "custos grant add --pr"
fish_expect "grant" "custos --socket /tmp/x.sock gr"
fish_expect "grant" "custos --json gr"
fish_expect "build" "custos run --sandbox-profile "

if [ "$fails" -ne 0 ]; then
  echo "zsh/fish completion: $fails failure(s)"
  exit 1
fi
echo "zsh/fish completion: all checks pass"
