#!/bin/bash
# Real programs (sort, sh and bash pipelines, python3) run with and without
# LD_PRELOAD=libfastmalloc.so must print byte-identical output; the probe, python's ctypes and
# ld.so's own binding log prove fastmalloc really served them.
# Usage: preload_test.sh LIBFASTMALLOC PRELOAD_PROBE PRELOAD_WORK_PY
set -u
lib=$1 probe=$2 work=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
fail() { echo "FAIL: $*"; status=1; }

# same_output NAME CMD...: CMD's stdout, stderr and exit status must not change under the preload.
same_output() {
  local name=$1
  shift
  "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  local plain=$?
  LD_PRELOAD=$lib "$@" >"$tmp/$name.fm.out" 2>"$tmp/$name.fm.err"
  local preloaded=$?
  if [ "$plain" -ne "$preloaded" ]; then
    fail "$name: exit status $plain without the preload, $preloaded with it"
    cat "$tmp/$name.fm.err"
  elif ! cmp -s "$tmp/$name.out" "$tmp/$name.fm.out"; then
    fail "$name: output differs under the preload"
    diff "$tmp/$name.out" "$tmp/$name.fm.out" | head -20
  elif ! cmp -s "$tmp/$name.err" "$tmp/$name.fm.err"; then
    fail "$name: stderr differs under the preload"
    diff "$tmp/$name.err" "$tmp/$name.fm.err" | head -20
  elif [ ! -s "$tmp/$name.out" ]; then
    fail "$name: printed nothing (exit $plain)"
    cat "$tmp/$name.err"
  else
    echo "ok: $name: $(wc -c <"$tmp/$name.out") bytes identical"
  fi
}

# expect NAME WANTED_STATUS WANTED_LINE CMD...: CMD's exit status and last line of output.
expect() {
  local name=$1 want_status=$2 want_line=$3
  shift 3
  local out got_status
  out=$("$@" 2>&1)
  got_status=$?
  local got=${out##*$'\n'}
  if [ "$got_status" -ne "$want_status" ] || [ "$got" != "$want_line" ]; then
    fail "$name: exit $got_status, wanted $want_status; output:"
    echo "$out"
  else
    echo "ok: $name: $got"
  fi
}

# binds_to_fastmalloc NAME OBJECT SYMBOLS CMD...: ld.so's binding log of CMD shows each of
# OBJECT's SYMBOLS bound to libfastmalloc, and no object binding a heap function to libc.
binds_to_fastmalloc() {
  local name=$1 object=$2 symbols=$3
  shift 3
  LD_DEBUG=bindings LD_DEBUG_OUTPUT="$tmp/bind.$name" LD_PRELOAD=$lib "$@" >/dev/null 2>&1
  local log=("$tmp/bind.$name".*) sym ok=1
  local to_fm="to [^ ]*libfastmalloc[^ ]* \[0\]: normal symbol" to_libc="to [^ ]*libc\.so\.6 \[0\]"
  for sym in $symbols; do
    if ! grep -qE "binding file [^ ]*$object \[0\] $to_fm \`$sym'" "${log[@]}"; then
      fail "$name: $object's $sym is not bound to libfastmalloc"
      ok=0
    fi
  done
  if grep -E "$to_libc: normal symbol \`(malloc|free|calloc|realloc)'" "${log[@]}"; then
    fail "$name: the lines above bind the C heap to glibc"
    ok=0
  fi
  [ $ok = 1 ] && echo "ok: $name: $object binds $symbols to libfastmalloc, nothing to libc"
}

[ -f "$lib" ] || { echo "FAIL: no library at $lib"; exit 1; }

# The probe: loaded and in use under the preload, absent without it.
expect probe-plain 2 "fastmalloc absent" "$probe"
expect probe-preloaded 0 "fastmalloc in use" env LD_PRELOAD="$lib" "$probe"

# sort: a 300000-line generated file, in several modes, one with threads and temp files.
awk 'BEGIN { srand(42); letters = "abcdefghijklmnopqrstuvwxyz"
  for (i = 0; i < 300000; i++)
    printf "%d %s %d\n", int(rand() * 1000000), substr(letters, int(rand() * 22) + 1, 5), i }' \
  >"$tmp/big.txt"
export LC_ALL=C
same_output sort sort "$tmp/big.txt"
same_output sort-numeric sort -n "$tmp/big.txt"
same_output sort-keys sort -k2,2 -k1,1nr "$tmp/big.txt"
same_output sort-unique sort -u -k2,2 "$tmp/big.txt"
same_output sort-parallel sort --parallel=2 -S 1M -T "$tmp" -k3,3n "$tmp/big.txt"
binds_to_fastmalloc sort sort "malloc free calloc realloc" sort -n "$tmp/big.txt"
binds_to_fastmalloc libc libc.so.6 "malloc free" sort -n "$tmp/big.txt"

# sh and bash: pipelines, command substitution, big variables, associative arrays.
same_output sh-pipeline sh -c "tr a-z A-Z <'$tmp/big.txt' | sort | uniq -c | sort -rn | head -200"
same_output sh-substitution sh -c "x=\$(cat '$tmp/big.txt'); echo \${#x};
  for i in \$(seq 1 3000); do echo \"\$i \$((i * i))\"; done | awk '{ s += \$2 } END { print s }'"
same_output sh-gzip sh -c "gzip -c <'$tmp/big.txt' | gunzip | md5sum"
same_output bash-arrays bash -c 'declare -A m; for i in $(seq 1 20000); do m[k$i]=$((i * 3)); done
  echo ${#m[@]} ${m[k777]}; s=; for i in $(seq 1 5000); do s+=abc$i; done; echo ${#s}'
binds_to_fastmalloc sh sh "malloc free calloc realloc" sh -c 'echo $(seq 1 10)'

# python3: dict/str/thread work, once with pymalloc and once with every allocation via malloc.
if ! command -v python3 >/dev/null; then
  fail "python3 not found: install it (apt-get install -y python3) to run the preload test"
else
  same_output python3 python3 "$work"
  same_output python3-malloc env PYTHONMALLOC=malloc python3 "$work"
  expect python3-probe-plain 2 "fastmalloc absent" python3 "$work" --probe
  expect python3-probe 0 "fastmalloc owns python's memory" \
    env LD_PRELOAD="$lib" python3 "$work" --probe
fi

exit $status
