#!/usr/bin/env bash
# Runs every saved fuzz input (the files in the folders given) through the fuzz target once
# each; non-zero when one of them fails. Usage: tests/fuzz/replay.sh FUZZ_BINARY DIR...
set -euo pipefail
bin=$1
shift
shopt -s nullglob
files=()
for dir in "$@"; do files+=("$dir"/*); done
if [ ${#files[@]} -eq 0 ]; then
  echo "replay: no inputs in $*"
  exit 0
fi
exec "$bin" "${files[@]}"
