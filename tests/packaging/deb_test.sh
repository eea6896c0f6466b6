#!/bin/bash
# Builds the Debian package with CPack (cpack -G DEB in the build directory), checks its file
# name, contents and control fields, unpacks it into a scratch root (dpkg -x, nothing is
# installed) and runs the launcher and pkg-config consumers from there.
# Usage: deb_test.sh BUILD_DIR CPACK CC PRELOAD_PROBE VERSION LIBDIR
#   LIBDIR: the build's CMAKE_INSTALL_LIBDIR (lib, or lib/x86_64-linux-gnu for the prefix /usr)
set -eu
build=$1 cpack=$2 cc=$3 probe=$4 version=$5 libdir=$6
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=SCRIPTDIR/lib.sh
. "$here/lib.sh"

if [[ $libdir == /* ]]; then
  echo "SKIP: CMAKE_INSTALL_LIBDIR $libdir is absolute, outside the package's /usr"
  exit 77
fi

for tool in dpkg dpkg-deb; do
  if ! command -v $tool >/dev/null; then
    echo "SKIP: $tool not found: the Debian package is built and checked on Debian systems only"
    exit 77
  fi
done
command -v dpkg-shlibdeps >/dev/null ||
  echo "note: dpkg-shlibdeps not found (apt-get install dpkg-dev): Depends is set by hand"

if ! (cd "$build" && "$cpack" -G DEB -B "$tmp/cpack") >"$tmp/cpack.log" 2>&1; then
  cat "$tmp/cpack.log"
  echo "FAIL: cpack -G DEB in $build"
  exit 1
fi
arch=$(dpkg --print-architecture)
deb=$tmp/cpack/fastmalloc_${version}_$arch.deb
if [ ! -f "$deb" ]; then
  echo "FAIL: no $(basename "$deb"); cpack made: $(cd "$tmp/cpack" && echo *.deb)"
  exit 1
fi
ok "cpack made $(basename "$deb")"

# Contents: path and, for the launcher, its mode.
dpkg-deb -c "$deb" | awk '{ print $1, $6 }' >"$tmp/contents"
for want in "-rwxr-xr-x ./usr/bin/fastmalloc" "-rw-r--r-- ./usr/include/fastmalloc.h" \
    "-rw-r--r-- ./usr/$libdir/libfastmalloc.so.$version" \
    "lrwxrwxrwx ./usr/$libdir/libfastmalloc.so.${version%%.*}" \
    "lrwxrwxrwx ./usr/$libdir/libfastmalloc.so" "-rw-r--r-- ./usr/$libdir/libfastmalloc.a" \
    "-rw-r--r-- ./usr/$libdir/pkgconfig/fastmalloc.pc" \
    "-rw-r--r-- ./usr/$libdir/cmake/fastmalloc/fastmalloc-config.cmake" \
    "-rw-r--r-- ./usr/$libdir/cmake/fastmalloc/fastmalloc-config-version.cmake" \
    "-rw-r--r-- ./usr/$libdir/cmake/fastmalloc/fastmalloc-targets.cmake"; do
  grep -qxF -- "$want" "$tmp/contents" || fail "dpkg-deb -c: no '$want'"
done
grep -v ' \./usr/' "$tmp/contents" && fail "dpkg-deb -c: files outside /usr (above)"
ok "dpkg-deb -c: $(grep -c '^-' "$tmp/contents") files under /usr"

# Control fields.
field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = fastmalloc ] || fail "Package: $(field Package)"
[ "$(field Version)" = "$version" ] || fail "Version: $(field Version)"
[ "$(field Architecture)" = "$arch" ] || fail "Architecture: $(field Architecture)"
[[ $(field Maintainer) == *@* ]] || fail "Maintainer: $(field Maintainer)"
[[ $(field Depends) == *libc6* ]] || fail "Depends lacks libc6: $(field Depends)"
[ -n "$(field Description)" ] || fail "no Description"
ok "control: $(field Package) $(field Version) $(field Architecture), Depends: $(field Depends)"

# Unpacked: the paths written at install time name /usr, not CPack's staging directory.
root=$tmp/root
dpkg -x "$deb" "$root"
grep -qx 'prefix=/usr' "$root/usr/$libdir/pkgconfig/fastmalloc.pc" ||
  fail "fastmalloc.pc: $(grep '^prefix=' "$root/usr/$libdir/pkgconfig/fastmalloc.pc")"
grep -qx "abs_libdir='/usr/$libdir'" "$root/usr/bin/fastmalloc" ||
  fail "launcher: $(grep '^abs_libdir=' "$root/usr/bin/fastmalloc")"
if grep -rl "_CPack_Packages\|$tmp" "$root"; then fail "files above name the staging directory"; fi

if bash "$here/launcher_test.sh" "$root/usr/bin/fastmalloc" "$probe" "$version" "$cc" \
    >"$tmp/launcher.log" 2>&1; then
  ok "the package's launcher: $(grep -c '^ok:' "$tmp/launcher.log") checks"
else
  sed 's/^/    /' "$tmp/launcher.log"
  fail "the package's launcher"
fi
expect "the package's launcher preloads the package's library" 0 \
  "$root/usr/$libdir/libfastmalloc.so.1" \
  "$root/usr/bin/fastmalloc" sh -c 'printf "%s\n" "$LD_PRELOAD"'

# pkg-config on the unpacked root: its sysroot variable puts the root before /usr.
PKG_CONFIG_SYSROOT_DIR=$root PKG_CONFIG_LIBDIR=$root/usr/$libdir/pkgconfig PKG_CONFIG_PATH='' \
  pkgconfig_consumers deb "$root/usr/$libdir" "$cc" "$here/consumer.c" "$version"

finish
