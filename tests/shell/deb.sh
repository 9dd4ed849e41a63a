#!/usr/bin/env bash
# The .deb: cpack from this build tree into a temporary directory, then dpkg-deb shows every
# file the package must install, its control fields and its maintainer scripts and conffiles.
# The package is only inspected, never installed. cpack stages through DESTDIR: the host's /lib,
# /etc and /usr are checked to be untouched.
# Usage: deb.sh BUILD_DIR SHELL_DOCS_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

host_files=(/lib/systemd/system/custos.service /etc/custos/custos.toml
  /usr/share/bash-completion/completions/custos /usr/share/man/man1/custos.1.gz)
before=$(ls -l --time-style=full-iso "${host_files[@]}" 2>&1)

t0=$(date +%s%N)
if ! cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp" >"$tmp/cpack.log" 2>&1; then
  cat "$tmp/cpack.log"
  echo "FAIL: cpack"
  exit 1
fi
t1=$(date +%s%N)
version=$(sed -n 's/^set(CPACK_PACKAGE_VERSION "\(.*\)")$/\1/p' "$build/CPackConfig.cmake")
arch=$(dpkg --print-architecture)
deb="$tmp/custos_${version}_${arch}.deb"
[ -f "$deb" ] || { ls "$tmp"; echo "FAIL: no $deb"; exit 1; }
echo "ok:   cpack made $(basename "$deb") ($(du -h "$deb" | cut -f1)) in $(((t1 - t0) / 1000000)) ms"

contents=$(dpkg-deb -c "$deb" | awk '{print $1, $NF}')
for f in /usr/bin/custos /lib/systemd/system/custos.service /lib/systemd/system/custos.socket \
  /usr/lib/sysusers.d/custos.conf /usr/lib/tmpfiles.d/custos.conf /etc/custos/custos.toml \
  /usr/share/bash-completion/completions/custos /usr/share/zsh/vendor-completions/_custos \
  /usr/share/fish/vendor_completions.d/custos.fish /usr/share/man/man1/custos.1.gz \
  /usr/share/man/man5/custos.toml.5.gz /usr/share/man/man8/custos-daemon.8.gz \
  /usr/share/doc/custos/cli.md; do
  grep -q " \.$f\$" <<<"$contents" || fail "the package lacks $f"
done
grep -q '^-rwxr-xr-x \./usr/bin/custos$' <<<"$contents" || fail "/usr/bin/custos is not 0755"

field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = custos ] || fail "Package: $(field Package)"
[ "$(field Version)" = "$version" ] || fail "Version: $(field Version)"
[ "$(field Architecture)" = "$arch" ] || fail "Architecture: $(field Architecture)"
[ "$(field Section)" = admin ] || fail "Section: $(field Section)"
depends=$(field Depends)
# systemd as stated, and what dpkg-shlibdeps found the binary links (libc6 always).
for dep in systemd libc6 libsqlite3-0 libsystemd0 libseccomp2; do
  grep -Eq "(^|, )$dep( |,|$)" <<<"$depends" || fail "Depends lacks $dep: $depends"
done
echo "ok:   Depends: $depends"

dpkg-deb -e "$deb" "$tmp/control"
[ "$(cat "$tmp/control/conffiles")" = /etc/custos/custos.toml ] \
  || fail "conffiles: $(cat "$tmp/control/conffiles")"
for script in postinst prerm; do
  cmp -s "$tmp/control/$script" "$src/packaging/$script" || fail "$script differs from packaging/"
  [ -x "$tmp/control/$script" ] || fail "$script is not executable"
done
dpkg-deb -x "$deb" "$tmp/root"
zcat "$tmp/root/usr/share/man/man1/custos.1.gz" | grep -q '^\.TH CUSTOS 1' || fail "custos.1.gz"
cmp -s "$tmp/root/usr/share/bash-completion/completions/custos" \
  "$2/share/bash-completion/completions/custos" || fail "bash completion differs from the build's"

after=$(ls -l --time-style=full-iso "${host_files[@]}" 2>&1)
[ "$before" = "$after" ] || fail "cpack changed the host: $before -> $after"
if [ "$fails" -ne 0 ]; then
  echo "deb: $fails failure(s)"
  exit 1
fi
echo "deb: $(basename "$deb") has every file, field and script"
