#!/usr/bin/env bash
# The test command: installs what the tests need (Debian packages, when root and missing),
# builds fastmalloc in Release with its tests, and runs them all with ctest; then the same for
# the build without the double-free mark (-DFM_FREE_MARK=OFF), in <build-dir>-no-mark, for
# the Debug build, whose assertions check the allocator's invariants, in <build-dir>-debug,
# and for that build under UndefinedBehaviorSanitizer (-DFM_UBSAN=ON: a failed check traps,
# no sanitizer runtime), in <build-dir>-ubsan.
# Usage: tests/run-tests.sh [build-dir]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v make >/dev/null || need+=(make)
command -v python3 >/dev/null || need+=(python3)
[ -f /usr/include/cmocka.h ] || need+=(libcmocka-dev pkg-config)
# The packaging tests (tests/packaging): pkg-config consumers, the .deb's dependencies, memcheck.
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v dpkg-shlibdeps >/dev/null || need+=(dpkg-dev)
command -v valgrind >/dev/null || need+=(valgrind)
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
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" --output-on-failure --no-tests=error -j2

# The build option that drops the double-free mark passes the same tests (test_misuse expects
# its double frees to be caught when the cache gives the blocks back).
cmake -S . -B "$build-no-mark" -DCMAKE_BUILD_TYPE=Release -DFASTMALLOC_BUILD_TESTS=ON \
  -DFASTMALLOC_BUILD_BENCH=OFF -DFM_FREE_MARK=OFF >/dev/null
cmake --build "$build-no-mark" -j"$(nproc)"
ctest --test-dir "$build-no-mark" --output-on-failure --no-tests=error -j2

cmake -S . -B "$build-debug" -DCMAKE_BUILD_TYPE=Debug -DFASTMALLOC_BUILD_TESTS=ON \
  -DFASTMALLOC_BUILD_BENCH=OFF >/dev/null
cmake --build "$build-debug" -j"$(nproc)"
ctest --test-dir "$build-debug" --output-on-failure --no-tests=error -j2

cmake -S . -B "$build-ubsan" -DCMAKE_BUILD_TYPE=Debug -DFASTMALLOC_BUILD_TESTS=ON \
  -DFASTMALLOC_BUILD_BENCH=OFF -DFM_UBSAN=ON >/dev/null
cmake --build "$build-ubsan" -j"$(nproc)"
ctest --test-dir "$build-ubsan" --output-on-failure --no-tests=error -j2
