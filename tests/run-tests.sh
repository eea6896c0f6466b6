#!/usr/bin/env bash
# The test command: installs what the tests need (Debian packages, when root and missing),
# then builds and runs the ctest suite in Release (<build-dir>), without the double-free check
# (-no-mark), in Debug (-debug), under UBSan (-ubsan), ASan (-address) and TSan (-thread,
# run-sanitizers.sh), and fuzzes for a minute (-fuzz, tests/fuzz/run-fuzz.sh).
# Every build runs even when one fails; the exit status says whether all passed.
# Usage: tests/run-tests.sh [build-dir]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v c++ >/dev/null || need+=(g++)   # the C++ operators' probe
command -v make >/dev/null || need+=(make)
command -v python3 >/dev/null || need+=(python3)
[ -f /usr/include/cmocka.h ] || need+=(libcmocka-dev pkg-config)
# The packaging tests (tests/packaging): pkg-config consumers, the .deb's dependencies, memcheck.
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v dpkg-shlibdeps >/dev/null || need+=(dpkg-dev)
command -v valgrind >/dev/null || need+=(valgrind)
# The ASan build and the fuzz inputs' replay: clang with its sanitizer runtimes.
command -v clang >/dev/null || need+=(clang)
ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 ||
  need+=(libclang-rt-14-dev)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing: ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing packages: ${need[*]} (run as root or install them)" >&2
    exit 1
  fi
fi

# The options are explicit, not left to the cache: bench/compare configures the same build
# directories without the tests.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFASTMALLOC_BUILD_TESTS=ON \
  -DFASTMALLOC_BUILD_BENCH=OFF >/dev/null
status=0
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" --output-on-failure --no-tests=error -j2 || status=1

# The build without the double-free check passes the same tests (test_double_free expects
# its double frees to be caught when the cache gives the blocks back), but for the timed runs
# (label long), which the other builds make. The packaging tests (the installed files, the
# Debian package, memcheck) run in the Release build only.
cmake -S . -B "$build-no-mark" -DCMAKE_BUILD_TYPE=Release -DFASTMALLOC_BUILD_TESTS=ON \
  -DFASTMALLOC_BUILD_BENCH=OFF -DFM_FREE_MARK=OFF >/dev/null
cmake --build "$build-no-mark" -j"$(nproc)"
ctest --test-dir "$build-no-mark" --output-on-failure --no-tests=error -j2 -LE "long|packaging" ||
  status=1

cmake -S . -B "$build-debug" -DCMAKE_BUILD_TYPE=Debug -DFASTMALLOC_BUILD_TESTS=ON \
  -DFASTMALLOC_BUILD_BENCH=OFF >/dev/null
cmake --build "$build-debug" -j"$(nproc)"
ctest --test-dir "$build-debug" --output-on-failure --no-tests=error -j2 -LE packaging || status=1

cmake -S . -B "$build-ubsan" -DCMAKE_BUILD_TYPE=Debug -DFASTMALLOC_BUILD_TESTS=ON \
  -DFASTMALLOC_BUILD_BENCH=OFF -DFM_UBSAN=ON >/dev/null
cmake --build "$build-ubsan" -j"$(nproc)"
ctest --test-dir "$build-ubsan" --output-on-failure --no-tests=error -j2 -LE packaging || status=1

# AddressSanitizer and ThreadSanitizer over the allocator's own code, through the fm_ names,
# then a minute of fuzzing the fm_ API (tests/fuzz) in its own ASan build.
FM_SANITIZE_PREFIX=$build tests/run-sanitizers.sh address thread || status=1
tests/fuzz/run-fuzz.sh 60 "$build-fuzz" || status=1
exit "$status"
