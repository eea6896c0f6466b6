#!/usr/bin/env bash
# Fuzzes fastmalloc's fm_ API for a bounded time: builds tests/fuzz/fuzz_heap.c with clang in
# its own ASan build, replays the saved inputs, fuzzes; non-zero on a crash (the input is left in
# <build-dir>/fuzz-artifacts/). Usage: tests/fuzz/run-fuzz.sh [seconds] [build-dir] (60 build-fuzz)
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
build=${2:-build-fuzz}

if ! command -v clang >/dev/null || [ ! -d /usr/lib/llvm-14/lib/clang ] ||
   ! ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq clang libclang-rt-14-dev >/dev/null
  else
    echo "run-fuzz: needs clang and libclang-rt-14-dev (run as root or install them)" >&2
    exit 1
  fi
fi

cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFM_DEBUG=ON \
  -DFM_SANITIZE=address -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link \
  -DFASTMALLOC_BUILD_TESTS=ON -DFASTMALLOC_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j2 --target fuzz_heap
fuzzer=$build/tests/fuzz/fuzz_heap

# What was found before must still pass.
if ! tests/fuzz/replay.sh "$fuzzer" tests/fuzz/regressions tests/fuzz/corpus >"$build/replay.log" 2>&1; then
  cat "$build/replay.log" >&2
  echo "run-fuzz: a saved input fails (above)" >&2
  exit 1
fi

# New inputs go to a corpus in the build folder; the seeds are only read.
mkdir -p "$build/fuzz-corpus" "$build/fuzz-artifacts"
status=0
"$fuzzer" -max_total_time="$seconds" -timeout=60 -max_len=4096 -print_final_stats=1 \
  -artifact_prefix="$build/fuzz-artifacts/" "$build/fuzz-corpus" tests/fuzz/corpus || status=$?
if [ "$status" != 0 ]; then
  echo "run-fuzz: the fuzzer failed (status $status). To keep the input as a regression:" >&2
  echo "  $fuzzer -minimize_crash=1 -runs=10000 <artifact>" >&2
  echo "  then copy the smallest one to tests/fuzz/regressions/" >&2
fi
exit "$status"
