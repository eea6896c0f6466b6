# shellcheck shell=bash
# Shared by the packaging tests' scripts (sourced): failure accounting, command checks, and
# the build and run of consumer.c against an installed fastmalloc through pkg-config.
# A script sets up `tmp` (a scratch directory) before calling these; `expect` sets `out`.
# shellcheck disable=SC2154

failures=0
skipped=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }
skip() { echo "SKIP: $*"; skipped=$((skipped + 1)); }

# The script's exit status: 1 after a failure, 77 (ctest's skip code here) when a part was
# skipped and nothing failed, else 0.
finish() {
  if [ "$failures" -gt 0 ]; then
    echo "$failures check(s) failed"
    exit 1
  elif [ "$skipped" -gt 0 ]; then
    echo "all checks that ran passed; $skipped part(s) skipped"
    exit 77
  fi
  echo "all checks passed"
  exit 0
}

# expect NAME STATUS TEXT CMD...: CMD exits with STATUS and its stdout and stderr together
# contain TEXT (any output when TEXT is empty). Sets `out` to that output.
expect() {
  local name=$1 want=$2 text=$3 got
  shift 3
  out=$("$@" 2>&1) && got=0 || got=$?
  if [ "$got" != "$want" ]; then
    fail "$name: exit status $got, wanted $want; output:"
    printf '%s\n' "$out" | sed 's/^/    /'
  elif [[ $out != *"$text"* ]]; then
    fail "$name: output lacks '$text'; output:"
    printf '%s\n' "$out" | sed 's/^/    /'
  else
    ok "$name"
  fi
}

# needed_libfastmalloc FILE: whether the ELF FILE names libfastmalloc as a needed library.
needed_libfastmalloc() {
  readelf -d "$1" 2>/dev/null | grep -q 'NEEDED.*libfastmalloc'
}

# pkgconfig_consumers LABEL LIBDIR CC SOURCE VERSION: builds SOURCE (consumer.c) with the
# flags of the fastmalloc.pc that pkg-config finds now (PKG_CONFIG_* set by the caller) and
# the library in LIBDIR: shared, the static library in a dynamic executable, and fully static
# when libc.a is installed. Each must run with fastmalloc's malloc from where it was linked.
pkgconfig_consumers() {
  local label=$1 libdir=$2 cc=$3 source=$4 version=$5 flags static_flags exe
  if ! command -v pkg-config >/dev/null; then
    skip "$label: pkg-config not found (apt-get install pkg-config)"
    return
  fi
  if ! flags=$(pkg-config --cflags --libs fastmalloc); then
    fail "$label: pkg-config does not find fastmalloc"
    return
  fi
  static_flags=$(pkg-config --static --cflags --libs fastmalloc)
  expect "$label: pkg-config --modversion" 0 "$version" pkg-config --modversion fastmalloc
  [[ " $flags " == *" -L$libdir "* ]] || fail "$label: pkg-config --libs lacks -L$libdir: $flags"
  [[ " $static_flags " == *" -pthread "* ]] ||
    fail "$label: pkg-config --static --libs lacks -pthread: $static_flags"
  local defines=(-DFM_PACKAGE_VERSION="\"$version\"")

  exe=$tmp/$label-pc-shared
  # shellcheck disable=SC2086 # the flags are words
  if "$cc" "${defines[@]}" "$source" -o "$exe" $flags; then
    needed_libfastmalloc "$exe" || fail "$label: the shared consumer does not need libfastmalloc"
    expect "$label: pkg-config shared consumer" 0 "malloc from $libdir/libfastmalloc.so.1" \
      env LD_LIBRARY_PATH="$libdir" "$exe"
  else
    fail "$label: the shared consumer does not build with: $flags"
  fi

  exe=$tmp/$label-pc-static-lib
  # shellcheck disable=SC2046
  if "$cc" "${defines[@]}" "$source" -o "$exe" -Wl,-u,malloc $(pkg-config --cflags fastmalloc) \
      "$(pkg-config --variable=libdir fastmalloc)/libfastmalloc.a" \
      $(pkg-config --static --libs-only-other fastmalloc); then
    needed_libfastmalloc "$exe" && fail "$label: the static-library consumer needs libfastmalloc.so"
    expect "$label: pkg-config static library in a dynamic executable" 0 "malloc from $exe" "$exe"
  else
    fail "$label: the static-library consumer does not build"
  fi

  if [[ $("$cc" -print-file-name=libc.a) != /* ]]; then
    skip "$label: no libc.a for the fully static consumer (apt-get install libc6-dev)"
    return
  fi
  exe=$tmp/$label-pc-static
  # shellcheck disable=SC2086
  if "$cc" "${defines[@]}" -static "$source" -o "$exe" -Wl,-u,malloc $static_flags; then
    readelf -d "$exe" | grep -q 'no dynamic section' || fail "$label: $exe is not fully static"
    expect "$label: pkg-config --static fully static consumer" 0 \
      "consumer: ok, fastmalloc $version, malloc from (this executable)" "$exe"
  else
    fail "$label: the fully static consumer does not build (-static -Wl,-u,malloc $static_flags)"
  fi
}
