#!/bin/bash
# Installs the build into a scratch prefix (cmake --install --prefix) and checks what users get
# there: consumer programs built with pkg-config and with find_package(fastmalloc), shared and
# static, run on fastmalloc's malloc; the installed launcher works, also once the prefix moves.
# Usage: install_test.sh BUILD_DIR CMAKE CC PRELOAD_PROBE VERSION LIBDIR
#   LIBDIR: the build's CMAKE_INSTALL_LIBDIR (lib, lib64, lib/x86_64-linux-gnu)
set -eu
build=$1 cmake=$2 cc=$3 probe=$4 version=$5 libdir=$6
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=SCRIPTDIR/lib.sh
. "$here/lib.sh"

if [[ $libdir == /* ]]; then
  echo "SKIP: CMAKE_INSTALL_LIBDIR $libdir is absolute: an install cannot move to a scratch prefix"
  exit 77
fi

prefix=$tmp/prefix
if ! "$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1; then
  cat "$tmp/install.log"
  echo "FAIL: cmake --install $build --prefix $prefix"
  exit 1
fi
for file in bin/fastmalloc include/fastmalloc.h "$libdir"/libfastmalloc.so.1 \
    "$libdir"/libfastmalloc.so "$libdir"/libfastmalloc.a "$libdir"/pkgconfig/fastmalloc.pc \
    "$libdir"/cmake/fastmalloc/fastmalloc-config.cmake \
    "$libdir"/cmake/fastmalloc/fastmalloc-config-version.cmake \
    "$libdir"/cmake/fastmalloc/fastmalloc-targets.cmake; do
  [ -e "$prefix/$file" ] || fail "not installed: $file"
done
[ -x "$prefix/bin/fastmalloc" ] || fail "the installed launcher is not executable"
pc=$prefix/$libdir/pkgconfig/fastmalloc.pc
grep -qx "prefix=$prefix" "$pc" || fail "fastmalloc.pc names another prefix: $(grep ^prefix= "$pc")"

# pkg-config.
PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig \
  pkgconfig_consumers install "$prefix/$libdir" "$cc" "$here/consumer.c" "$version"

# find_package(fastmalloc CONFIG): both targets, in one consumer project.
consumer=$tmp/cmake-consumer
if "$cmake" -S "$here/consumer" -B "$consumer" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/consumer.log" 2>&1 &&
    "$cmake" --build "$consumer" --verbose >>"$tmp/consumer.log" 2>&1; then
  grep -q -- "-- fastmalloc $version in $prefix/$libdir/cmake/fastmalloc" "$tmp/consumer.log" ||
    fail "find_package found another fastmalloc: $(grep -- '-- fastmalloc' "$tmp/consumer.log")"
  needed_libfastmalloc "$consumer/consumer_shared" ||
    fail "consumer_shared (fastmalloc::fastmalloc) does not need libfastmalloc.so"
  expect "find_package: fastmalloc::fastmalloc" 0 \
    "consumer: ok, fastmalloc $version, malloc from $prefix/$libdir/libfastmalloc.so.1" \
    "$consumer/consumer_shared"
  needed_libfastmalloc "$consumer/consumer_static" &&
    fail "consumer_static (fastmalloc::fastmalloc_static) needs libfastmalloc.so"
  grep -q -- "-Wl,-u,malloc.*consumer_static" "$tmp/consumer.log" ||
    fail "consumer_static is not linked with -Wl,-u,malloc"
  expect "find_package: fastmalloc::fastmalloc_static" 0 \
    "consumer: ok, fastmalloc $version, malloc from $consumer/consumer_static" \
    "$consumer/consumer_static"
else
  cat "$tmp/consumer.log"
  fail "the find_package(fastmalloc) consumer project does not configure or build"
fi

# The installed launcher.
if bash "$here/launcher_test.sh" "$prefix/bin/fastmalloc" "$probe" "$version" "$cc" \
    >"$tmp/launcher.log" 2>&1; then
  ok "the installed launcher: $(grep -c '^ok:' "$tmp/launcher.log") checks"
else
  sed 's/^/    /' "$tmp/launcher.log"
  fail "the installed launcher"
fi

# A moved installation: the launcher finds the library relative to itself, and says clearly
# when it cannot preload it from there or cannot find it.
mv "$prefix" "$tmp/moved"
expect "moved prefix: launcher" 0 "fastmalloc in use" "$tmp/moved/bin/fastmalloc" "$probe"
expect "moved prefix: library path" 0 "$tmp/moved/$libdir/libfastmalloc.so.1" \
  "$tmp/moved/bin/fastmalloc" sh -c 'printf "%s\n" "$LD_PRELOAD"'
mv "$tmp/moved" "$tmp/moved here"
expect "prefix with a space" 127 "LD_PRELOAD cannot hold a path with a space or colon" \
  "$tmp/moved here/bin/fastmalloc" "$probe"
mv "$tmp/moved here" "$tmp/moved"
rm "$tmp/moved/$libdir/"libfastmalloc.so*
expect "moved prefix without the library" 127 "fastmalloc: cannot find libfastmalloc.so.1" \
  "$tmp/moved/bin/fastmalloc" "$probe"

finish
