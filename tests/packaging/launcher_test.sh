#!/bin/bash
# Checks a fastmalloc launcher (the build tree's, an installed one, the .deb's): it preloads
# the library into a program not linked with it, keeps LD_PRELOAD's entries, sets the
# environment from its options, rejects bad ones, and fails like a shell for missing commands.
# Usage: launcher_test.sh LAUNCHER PRELOAD_PROBE VERSION CC
set -eu
launcher=$1 probe=$2 version=$3 cc=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname "$0")/lib.sh"

[ -x "$launcher" ] || { echo "FAIL: no launcher at $launcher"; exit 1; }
[ -x "$probe" ] || { echo "FAIL: no probe at $probe"; exit 1; }
# The checks below set their own FASTMALLOC_* variables and LD_PRELOAD.
for var in $(compgen -e | grep '^FASTMALLOC_' || true); do unset "$var"; done
unset LD_PRELOAD

# The probe's malloc is fastmalloc's under the launcher only.
expect "probe without the launcher" 2 "fastmalloc absent" "$probe"
expect "probe under the launcher" 0 "fastmalloc in use" "$launcher" "$probe"
expect "probe after --" 0 "fastmalloc in use" "$launcher" --stats -- "$probe"

expect "--version" 0 "fastmalloc $version" "$launcher" --version
[ "$out" = "fastmalloc $version" ] || fail "--version prints '$out'"
expect "--help" 0 "Usage: fastmalloc [OPTION]... [--] COMMAND [ARG]..." "$launcher" --help
for word in --stats --verbose --purge-thread --purge-delay=MS --tcache-max=SIZE --arenas=N --version setuid; do
  [[ $out == *"$word"* ]] || fail "--help does not mention $word"
done

# The environment: each option's variable, and none without options.
fm_env() { "$launcher" "$@" env | grep '^FASTMALLOC_' | sort | tr '\n' ' '; }
got=$(fm_env --stats --verbose --purge-thread --purge-delay=250 --tcache-max=64K --arenas=3 --)
want="FASTMALLOC_ARENAS=3 FASTMALLOC_PURGE_DELAY_MS=250 FASTMALLOC_PURGE_THREAD=1 FASTMALLOC_STATS=1"
want+=" FASTMALLOC_TCACHE_MAX=64K FASTMALLOC_VERBOSE=1 "
if [ "$got" = "$want" ]; then
  ok "options to variables"
else
  fail "options to variables: got '$got'"
fi
got=$(fm_env --arenas 64 --tcache-max 1G --purge-delay 0)
want="FASTMALLOC_ARENAS=64 FASTMALLOC_PURGE_DELAY_MS=0 FASTMALLOC_TCACHE_MAX=1G "
if [ "$got" = "$want" ]; then
  ok "options with separate values"
else
  fail "separate values: got '$got'"
fi
for size in 123 64K 2M 1G 2m 0; do
  got=$(fm_env --tcache-max="$size")
  [ "$got" = "FASTMALLOC_TCACHE_MAX=$size " ] || fail "--tcache-max=$size: got '$got'"
done
got=$(fm_env)
if [ -z "$got" ]; then
  ok "no options, no variables"
else
  fail "no options, yet: $got"
fi
got=$(FASTMALLOC_ARENAS=7 fm_env --stats)
if [ "$got" = "FASTMALLOC_ARENAS=7 FASTMALLOC_STATS=1 " ]; then
  ok "variables already set are kept"
else
  fail "variables already set: got '$got'"
fi

# LD_PRELOAD: fastmalloc first, the entries already there kept and loaded too.
echo 'int fm_test_marker = 1;' >"$tmp/marker.c"
"$cc" -shared -fPIC "$tmp/marker.c" -o "$tmp/libmarker.so"
expect "LD_PRELOAD kept" 0 "libfastmalloc.so.1:$tmp/libmarker.so" \
  env LD_PRELOAD="$tmp/libmarker.so" "$launcher" sh -c 'printf "%s\n" "$LD_PRELOAD"'
[[ $out == /*/libfastmalloc.so.1:"$tmp/libmarker.so" ]] || fail "LD_PRELOAD is '$out'"
expect "both preloaded libraries mapped" 0 "$tmp/libmarker.so" \
  env LD_PRELOAD="$tmp/libmarker.so" "$launcher" cat /proc/self/maps
[[ $out == *libfastmalloc.so* ]] || fail "libfastmalloc is not mapped beside the kept entry"
expect "probe with LD_PRELOAD kept" 0 "fastmalloc in use" \
  env LD_PRELOAD="$tmp/libmarker.so" "$launcher" "$probe"

# The command: run by exec (same process), its arguments and exit status passed through, found
# through PATH and through a symbolic link to the launcher.
got=$(sh -c 'echo $$; exec "$0" sh -c "echo \$\$"' "$launcher" | uniq | wc -l)
if [ "$got" = 1 ]; then
  ok "exec: the command keeps the launcher's process"
else
  fail "exec: a new process"
fi
expect "arguments passed as given" 0 "[a b][][c*][-x]" "$launcher" printf '[%s]' 'a b' '' 'c*' -x
expect "exit status passed through" 42 "" "$launcher" sh -c 'echo out; exit 42'
mkdir "$tmp/bin"
ln -s "$(readlink -f "$launcher")" "$tmp/bin/fastmalloc"
expect "through PATH and a symbolic link" 0 "fastmalloc in use" \
  env PATH="$tmp/bin:$PATH" fastmalloc "$probe"
cp "$probe" "$tmp/bin/probe-in-path"
expect "command found through PATH" 0 "fastmalloc in use" \
  env PATH="$tmp/bin:$PATH" "$launcher" probe-in-path

# Bad options: status 2 and a message that names the problem.
expect "no command" 2 "fastmalloc: no command given" "$launcher"
expect "options but no command" 2 "no command given" "$launcher" --stats --
expect "unknown option" 2 "unknown option '--bogus'" "$launcher" --bogus true
expect "missing value" 2 "option '--arenas' needs a value" "$launcher" --arenas
for bad in 12Q K '' -1 1.5 ' 64K' 64KB; do
  expect "--tcache-max='$bad'" 2 "--tcache-max: '$bad' is not a size" \
    "$launcher" --tcache-max="$bad" true
done
for bad in 0 65 100 abc -3 ''; do
  expect "--arenas='$bad'" 2 "--arenas: '$bad' is not a number from 1 to 64" \
    "$launcher" --arenas="$bad" true
done
for bad in -5 1s x ''; do
  expect "--purge-delay='$bad'" 2 "--purge-delay: '$bad' is not a number of milliseconds" \
    "$launcher" --purge-delay="$bad" true
done

# Commands that cannot run: 127 when missing, 126 when not executable, as a shell says.
expect "command not found" 127 "fastmalloc: fm-no-such-command: command not found" \
  "$launcher" fm-no-such-command
expect "option-like command after --" 127 "fastmalloc: -x: command not found" "$launcher" -- -x
expect "missing file" 127 "fastmalloc: $tmp/missing: No such file or directory" \
  "$launcher" "$tmp/missing"
echo 'echo hi' >"$tmp/not-executable"
expect "file not executable" 126 "fastmalloc: $tmp/not-executable: Permission denied" \
  "$launcher" "$tmp/not-executable"
expect "directory" 126 "Permission denied" "$launcher" "$tmp"

# A setuid program runs, with a warning that it may ignore LD_PRELOAD.
cp "$(type -P true)" "$tmp/setuid-true"
chmod u+s "$tmp/setuid-true"
expect "setuid command" 0 "warning: $tmp/setuid-true is setuid or setgid" \
  "$launcher" "$tmp/setuid-true"

finish
