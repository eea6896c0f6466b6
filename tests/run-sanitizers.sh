#!/usr/bin/env bash
# Builds fastmalloc under AddressSanitizer and ThreadSanitizer (FM_SANITIZE: the tests reach it
# through the fm_ names) and runs their tests, keeping every report in <prefix>-<sanitizer>/
# sanitizer-logs/ and listing the distinct ones. Usage: tests/run-sanitizers.sh [address|thread]...
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${FM_SANITIZE_PREFIX:-build}
kinds=("$@")
[ ${#kinds[@]} -gt 0 ] || kinds=(address thread)

# clang when there is one: its ASan build also replays the fuzz inputs (tests/fuzz).
cc=gcc
if command -v clang >/dev/null; then cc=clang; fi

status=0
for kind in "${kinds[@]}"; do
  build=$prefix-$kind
  # Debug assertions on, optimised: TSan at -O0 runs test_threads for many minutes.
  cmake -S . -B "$build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFM_DEBUG=ON \
    -DFM_SANITIZE="$kind" -DFASTMALLOC_BUILD_TESTS=ON -DFASTMALLOC_BUILD_BENCH=OFF >/dev/null
  cmake --build "$build" -j2
  logs=$(cd "$build" && pwd)/sanitizer-logs
  rm -rf "$logs" && mkdir -p "$logs"
  # Reports go to files (one per process, fork children included); the run carries on past
  # them, and a test with a report fails (exit code 66 for TSan).
  supp=$PWD/tests/tsan.supp
  export ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1"
  export TSAN_OPTIONS="log_path=$logs/tsan:halt_on_error=0:history_size=4:second_deadlock_stack=1:die_after_fork=0:suppressions=$supp"
  ctest --test-dir "$build" --output-on-failure --no-tests=error -j2 || status=1
  unset ASAN_OPTIONS TSAN_OPTIONS
  # One line per distinct report: its kind and the top frame of each access outside the
  # sanitizer's runtime, with how many times it came.
  python3 - "$logs" <<'EOF' || status=1
import collections, os, re, sys
logs = sys.argv[1]
runtime = re.compile(r'libsanitizer|compiler-rt|/lib/clang/|tsan_|asan_|sanitizer_common')
seen = collections.OrderedDict()
for name in sorted(os.listdir(logs)):
    text = open(os.path.join(logs, name), errors='replace').read()
    for report in re.split(r'\n=+\n', text):
        m = re.search(r'(?:WARNING|ERROR): (\w+Sanitizer): ([^(\n]*)', report)
        if not m:
            continue
        sections = re.split(r'\n  (?=\S)', report)
        tops = []
        for section in sections:
            head = section.split('\n', 1)[0]
            if not re.match(r'(previous |atomic |direct |indirect )*(read|write|leak)', head, re.I) \
                    and 'ERROR' not in head:
                continue
            frames = [f for f in re.findall(r'#\d+ \S+ in (\S+) (\S+)|#\d+ (\S+) (\S+:\d+)', section)]
            frames = [(a or c, b or d) for a, b, c, d in frames]
            frames = [f for f in frames if not runtime.search(f[1])]
            where = '%s %s' % frames[0] if frames else '(no frame)'
            where = where.replace(os.getcwd() + '/', '')
            kind = re.sub(r' at 0x[0-9a-f]+.*| of size \d+|^Previous ', '', head).strip().lower()
            tops.append('%s: %s' % (kind, where))
        key = (m.group(1), m.group(2).strip()) + tuple(sorted(tops[:2]))
        entry = seen.setdefault(key, [0, name])
        entry[0] += 1
if not seen:
    print('sanitizer reports: none')
    sys.exit(0)
print('sanitizer reports: %d distinct (logs in %s)' % (len(seen), logs))
for key, (count, first) in seen.items():
    print('%5d x %s: %s   [first in %s]' % (count, key[0], key[1], first))
    for access in key[2:]:
        print('          %s' % access)
sys.exit(1)
EOF
done
exit "$status"
