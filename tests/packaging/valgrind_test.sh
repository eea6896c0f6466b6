#!/bin/bash
# Runs valgrind_prog, linked with libfastmalloc.so and with libfastmalloc.a, under valgrind's
# memcheck with the options the README gives: a clean run reports no error, and a leak, an
# invalid write and a double free are each reported, so memcheck's malloc replaced fastmalloc's.
# Usage: valgrind_test.sh VALGRIND_PROG_SHARED VALGRIND_PROG_STATIC
set -eu
shared=$1 static=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$0")/lib.sh"

if ! command -v valgrind >/dev/null; then
  echo "SKIP: valgrind not found (apt-get install valgrind)"
  exit 77
fi
echo "valgrind: $(valgrind --version)"

# memcheck NAME SYNONYM PROG MODE STATUS TEXT...: PROG MODE under memcheck exits with STATUS
# (99: memcheck found errors) and its output holds each TEXT.
memcheck() {
  local name=$1 synonym=$2 prog=$3 mode=$4 want=$5 text
  shift 5
  expect "$name" "$want" "malloc's blocks are fastmalloc's: no" \
    valgrind --soname-synonyms=somalloc="$synonym" --leak-check=full --error-exitcode=99 \
    "$prog" "$mode"
  for text in "$@"; do
    [[ $out == *"$text"* ]] || fail "$name: no '$text' in memcheck's output"
  done
}

# -lfastmalloc: the synonym names the library; libfastmalloc.a: the executable (NONE).
for kind in shared static; do
  if [ "$kind" = shared ]; then
    prog=$shared synonym='libfastmalloc.so*'
  else
    prog=$static synonym=NONE
  fi
  expect "$kind: fastmalloc serves the program without valgrind" 0 \
    "malloc's blocks are fastmalloc's: yes" "$prog" clean
  memcheck "$kind: clean run" "$synonym" "$prog" clean 0 "ERROR SUMMARY: 0 errors"
  [[ $out != *"definitely lost"* ]] || fail "$kind: clean run reports a leak"
  memcheck "$kind: leak reported" "$synonym" "$prog" leak 99 \
    "100 bytes in 1 blocks are definitely lost" "ERROR SUMMARY: 1 errors"
  memcheck "$kind: invalid write reported" "$synonym" "$prog" overflow 99 \
    "Invalid write of size 1" "0 bytes after a block of size 100 alloc'd"
  memcheck "$kind: double free reported" "$synonym" "$prog" double-free 99 \
    "Invalid free()" "inside a block of size 100 free'd"
done

finish
