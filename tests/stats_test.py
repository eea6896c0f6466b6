#!/usr/bin/env python3
"""The statistics and settings of fastmalloc, through stats_probe under LD_PRELOAD:
malloc_stats() prints glibc's lines first (Arena N, system bytes, in use bytes, the totals,
max mmap regions and bytes) and then fastmalloc's report; malloc_info() writes XML in glibc's
shape; FASTMALLOC_STATS=1 adds the report at exit, FASTMALLOC_VERBOSE=1 the settings at
set-up; a malformed setting gets one warning line naming it and the default kept.
Usage: stats_test.py LIBFASTMALLOC STATS_PROBE"""
import os, re, subprocess, sys
import xml.etree.ElementTree as ET

lib, probe = sys.argv[1], sys.argv[2]
failures = []

def check(ok, what):
    if not ok:
        failures.append(what)

def run(*args, **settings):
    env = dict(os.environ, LD_PRELOAD=lib)
    env.update(settings)
    done = subprocess.run([probe, *args], env=env, capture_output=True, text=True, timeout=60)
    check(done.returncode == 0, f"{args} {settings}: exit status {done.returncode}: {done.stderr[-500:]}")
    return done.stdout, done.stderr

def number(pattern, text):
    m = re.search(pattern, text, re.M)
    return int(m.group(1)) if m else None

# malloc_stats: glibc's lines, in glibc's layout, then the report.
out, err = run("thread")
lines = err.splitlines()
check(lines[:2] and lines[0] == "Arena 0:" and re.fullmatch(r"system bytes     = +\d+", lines[1]),
      "malloc_stats does not start with glibc's Arena 0 lines: %r" % lines[:3])
check(re.search(r"^Arena 1:$", err, re.M), "malloc_stats: no line for the second arena")
for label in ("system bytes", "in use bytes", "max mmap regions", "max mmap bytes"):
    check(re.search(r"^%s +=\s+\d+$" % re.escape(label), err, re.M), f"malloc_stats: no '{label}' line")
total_at = err.find("Total (incl. mmap):")
check(total_at > 0, "malloc_stats: no 'Total (incl. mmap):'")
system = number(r"^Total \(incl\. mmap\):\nsystem bytes +=\s+(\d+)", err)
in_use = number(r"^Total \(incl\. mmap\):\nsystem bytes.*\nin use bytes +=\s+(\d+)", err)
check(system and in_use and 0 < in_use < system, f"malloc_stats totals: system {system}, in use {in_use}")
check((number(r"^max mmap regions =\s+(\d+)", err) or 0) >= 1, "malloc_stats: the mapped blocks' peak")
report_at = err.find("fastmalloc: mapped")
check(report_at > total_at, "malloc_stats: fastmalloc's report does not follow glibc's lines")
for what in ("refills", "flushes", "purged", "page blocks taken", "span blocks taken",
             "mapped blocks out", "class  size  spans  blocks out  blocks free", "page spans"):
    check(what in err[report_at:], f"the report lacks '{what}'")

# malloc_info: glibc's XML shape.
try:
    root = ET.fromstring(out)
    heaps = root.findall("heap")
    check(root.tag == "malloc" and root.get("version") == "1", "malloc_info: not <malloc version=\"1\">")
    check(len(heaps) >= 2 and heaps[0].get("nr") == "0", "malloc_info: a <heap nr> per arena")
    check(all(h.find("sizes") is not None for h in heaps), "malloc_info: <sizes> in each heap")
    sizes = [s for h in heaps for s in h.find("sizes").findall("size")]
    check(sizes and all(int(s.get("total")) == int(s.get("count")) * int(s.get("to")) for s in sizes),
          "malloc_info: <size from to total count/>")
    types = {(t.tag, t.get("type")) for t in root}
    for want in (("total", "fast"), ("total", "rest"), ("total", "mmap"), ("system", "current"),
                 ("system", "max"), ("aspace", "total")):
        check(want in types, f"malloc_info: no <{want[0]} type=\"{want[1]}\">")
    current = int(root.find("system[@type='current']").get("size"))
    check(current == system, f"malloc_info's system size {current} is not malloc_stats' {system}")
except ET.ParseError as e:
    failures.append(f"malloc_info: not XML ({e}): {out[:300]!r}")

# FASTMALLOC_STATS=1: the report again, at exit; FASTMALLOC_VERBOSE=1: the settings first.
out, err = run(FASTMALLOC_STATS="1", FASTMALLOC_VERBOSE="1", FASTMALLOC_ARENAS="3")
check(err.count("fastmalloc: mapped") == 2, "FASTMALLOC_STATS=1: no report at exit")
check(re.match(r"fastmalloc \d+\.\d+\.\d+: purge delay 100 ms, .*arenas 3", err),
      "FASTMALLOC_VERBOSE=1: the settings line: %r" % err[:200])
out, err = run()
check("fastmalloc 1" not in err and err.count("fastmalloc: mapped") == 1,
      "without the settings: neither the settings nor the report at exit")

# Malformed settings: one warning each, naming it and the default; the program runs on.
bad = {"FASTMALLOC_ARENAS": "zero", "FASTMALLOC_PURGE_DELAY_MS": "10s", "FASTMALLOC_TCACHE_MAX": "4X",
       "FASTMALLOC_STATS": "yes", "FASTMALLOC_VERBOSE": "2"}
out, err = run(**bad)
for name, value in bad.items():
    line = [l for l in err.splitlines() if l.startswith(f"fastmalloc: {name}={value} ignored")]
    check(len(line) == 1 and "the default" in line[0], f"no single warning for {name}={value}")
check(err.count("fastmalloc: mapped") == 1, "malformed FASTMALLOC_STATS turned the report at exit on")

for f in failures:
    print("FAIL:", f)
print("%d checks failed" % len(failures) if failures else "statistics and settings: ok")
sys.exit(1 if failures else 0)
