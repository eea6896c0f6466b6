#!/usr/bin/env python3
"""Engine of bench/compare: runs every benchmark under every allocator, candidates interleaved
round by round, then prints the Markdown tables and writes raw results, summary and SVG charts.
bench/compare builds fastmalloc and finds the allocators first; it is the command to run."""

import argparse
import csv
import datetime
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

SYSTEM = "glibc"          # the allocator used when nothing is preloaded
MAIN = "fastmalloc"       # the allocator under test
NO_ST_FLAG = "fastmalloc-no-st-flag"  # variant built with -DFM_SINGLE_THREAD_FLAG=OFF
NO_MARK = "fastmalloc-no-mark"        # variant built with -DFM_FREE_MARK=OFF
VARIANTS = (NO_ST_FLAG, NO_MARK)      # builds measured for their own tables, not as candidates
SCENARIOS = (("st", "main_arena_st"), ("thr", "thread_arena_"), ("mt", "main_arena_mt"))
COUNTS = (25, 100, 400, 1600)
# The workload that, run alone, then goes on allocating a little for LINGER_MS without
# malloc_trim: what a freed heap's memory does meanwhile.
LINGER_JOB, LINGER_MS = "fragment-mix", 1000
# The workload programs, each naming its workloads with --list and printing bench-workload's
# JSON line: bench-cxx (C++) is built only where CMake found a C++ compiler.
WORKLOAD_PROGRAMS = ("bench-workload", "bench-cxx")
OPTIONAL_PROGRAMS = ("bench-cxx",)
MODES = {
    # simple sizes, thread counts (None: 1, 2, 4 ... up to every CPU), thread duration (s),
    # workload scale, workloads one copy / one copy per CPU (--parallel), rounds, timeout (s)
    "quick": dict(sizes=[16], threads=[1, 2], duration=0.5, scale=1, single=True, parallel=False,
                  rounds=3, timeout=120),
    "full": dict(sizes=[16, 64, 256, 1024, 4096], threads=[1, 2, 4], duration=3.0, scale=4,
                 single=True, parallel=True, rounds=5, timeout=600),
    "scaling": dict(sizes=[], threads=None, duration=1.0, scale=1, single=False, parallel=True,
                    rounds=3, timeout=300),
}


def thread_counts():
    """1, 2, 4 ... and the number of CPUs, for the scaling mode."""
    cpus = len(os.sched_getaffinity(0))
    counts = [1]
    while counts[-1] * 2 < cpus:
        counts.append(counts[-1] * 2)
    return counts + [cpus] if cpus > 1 else counts


def job_kind(key):
    """The kind of the benchmark named key (make_jobs names them so)."""
    if key.startswith("simple-"):
        return "simple"
    if key.startswith("thread-") and key[len("thread-"):].isdigit():
        return "thread"
    return "workload-par" if key.endswith("-par") else "workload"


@dataclass
class Job:
    key: str          # short name, used in tables and files; it says the kind (job_kind)
    argv: list
    allocators: list  # which candidates run it, in the order they run each round
    pinned: bool = False  # runs on one CPU (pinned_cpu), every candidate on the same one

    @property
    def kind(self):
        """simple | thread | workload | workload-par"""
        return job_kind(self.key)


@dataclass
class Results:
    raw: list = field(default_factory=list)       # (round, job, allocator, metric, unit, value)
    failures: dict = field(default_factory=dict)  # (job, allocator) -> [reason, ...]
    by_round: dict = field(default_factory=dict)  # (job, metric, allocator) -> {round: value}
    units: dict = field(default_factory=dict)     # (job, metric) -> unit
    metric_order: dict = field(default_factory=dict)  # job -> [metric, ...] in first-seen order

    def add(self, rnd, job, alloc, metric, unit, value):
        self.raw.append((rnd, job.key, alloc, metric, unit, value))
        self.by_round.setdefault((job.key, metric, alloc), {})[rnd] = value
        self.units[(job.key, metric)] = unit
        order = self.metric_order.setdefault(job.key, [])
        if metric not in order:
            order.append(metric)

    def values(self, job_key, metric, alloc):
        """alloc's figures, one a round it ran without failing."""
        return list(self.by_round.get((job_key, metric, alloc), {}).values())

    def median(self, job_key, metric, alloc):
        v = self.values(job_key, metric, alloc)
        return statistics.median(v) if v else None

    def failed(self, job_key, metric, peers, alloc=MAIN):
        """Whether a peer has the figure and alloc, which failed, has none."""
        return not self.values(job_key, metric, alloc) and any(
            self.values(job_key, metric, p) for p in peers)

    def ratio(self, job_key, metric, alloc, other, other_metric=None):
        """The median over the rounds of alloc's figure ÷ other's (other_metric's, if given) in
        the same round; None when no round has both. The candidates of a benchmark run back to
        back in a round, so a slow spell of the machine, which can last minutes and slow a
        process by half, falls on both figures of a ratio; a ratio of the two medians would
        compare rounds of one candidate with other rounds of the other."""
        a = self.by_round.get((job_key, metric, alloc), {})
        b = self.by_round.get((job_key, other_metric or metric, other), {})
        rs = [a[r] / b[r] for r in a if b.get(r)]
        return statistics.median(rs) if rs else None


def read_raw(rundir):
    """A finished run's Results and benchmarks, from its raw.csv (--from-raw)."""
    res, jobs = Results(), {}
    with open(os.path.join(rundir, "raw.csv"), newline="") as f:
        for row in csv.DictReader(f):
            key, alloc = row["benchmark"], row["allocator"]
            job = jobs.setdefault(key, Job(key, [], []))
            if alloc not in job.allocators:
                job.allocators.append(alloc)
            res.add(int(row["round"]), job, alloc, row["metric"], row["unit"], float(row["value"]))
    return res, list(jobs.values())


def log(msg, end="\n"):
    print(msg, end=end, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- running

def preload_env(lib):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if lib:
        env["LD_PRELOAD"] = lib
    return env


def verify_preloads(bindir, allocs):
    """Keeps the allocators whose preload really provides malloc (bench-which); says why not."""
    kept, notes, versions = {}, [], {}
    for name, lib in allocs.items():
        try:
            out = subprocess.run([os.path.join(bindir, "bench-which"), "-v"], env=preload_env(lib),
                                 capture_output=True, text=True, timeout=30)
            lines = out.stdout.splitlines()
            got = lines[0] if out.returncode == 0 and lines else ""
        except (OSError, subprocess.TimeoutExpired) as e:
            notes.append(f"{name}: bench-which failed ({e}); left out")
            continue
        if lib:
            ok = os.path.realpath(got) == os.path.realpath(lib)
        else:
            ok = os.path.basename(got).startswith("libc.so")
        if ok:
            kept[name] = lib
            for line in lines[1:]:
                if line.startswith("fastmalloc "):
                    versions[name] = line.split()[1]
            log(f"compare: {name:<22} malloc comes from {got}")
        else:
            why = got or out.stderr.strip() or "no output"
            notes.append(f"{name}: malloc comes from '{why}', not '{lib or 'libc.so.6'}'; left out")
            log(f"compare: {name}: preload NOT in effect ({why}); left out")
    return kept, notes, versions


def pinned_cpu():
    """The CPU bench-malloc-simple runs on, for every candidate: the last one we may use. Its
    cells last about a millisecond, and a virtual machine's CPUs run at different speeds from
    moment to moment: unpinned, a cell would measure which CPU it ran on."""
    return max(os.sched_getaffinity(0))


def list_workloads(bindir, notes):
    """[(program, workload name)] from each workload program's --list; a missing optional
    program is left out with a note."""
    found = []
    for prog in WORKLOAD_PROGRAMS:
        path = os.path.join(bindir, prog)
        if prog in OPTIONAL_PROGRAMS and not os.path.exists(path):
            notes.append(f"{prog} was not built (no C++ compiler?): its workloads are left out")
            continue
        listing = subprocess.run([path, "--list"], capture_output=True, text=True, check=True).stdout
        found += [(path, line.split()[0]) for line in listing.splitlines()]
    return found


def make_jobs(bindir, mode, allocs, notes):
    m = MODES[mode]
    # The flag-off build runs bench-malloc-simple only; the mark-off build runs everything.
    main_allocs = [a for a in allocs if a != NO_ST_FLAG]
    jobs = []
    for size in m["sizes"]:
        jobs.append(Job(f"simple-{size}",
                        [os.path.join(bindir, "bench-malloc-simple"), str(size)], list(allocs), pinned=True))
    for t in m["threads"] or thread_counts():
        jobs.append(Job(f"thread-{t}",
                        [os.path.join(bindir, "bench-malloc-thread"), str(t), "--duration", str(m["duration"])],
                        main_allocs))
    workloads = list_workloads(bindir, notes)
    if m["single"]:
        for prog, name in workloads:
            linger = ["--linger", str(LINGER_MS)] if name == LINGER_JOB else []
            jobs.append(Job(name, [prog, name, "--scale", str(m["scale"])] + linger,
                            main_allocs))
    if m["parallel"]:
        for prog, name in workloads:
            jobs.append(Job(f"{name}-par",
                            [prog, name, "--parallel", "--scale", str(m["scale"])], main_allocs))
    return jobs


def parse_output(job, stdout):
    """Returns [(metric, unit, value)] from a benchmark's JSON output."""
    d = json.loads(stdout)
    if job.kind == "simple":
        r = d["functions"]["malloc"][""]
        out = [(f"{short}/{count}", "ns", float(r[f"{key}_allocs_{count:04d}_time"]))
               for short, key in SCENARIOS for count in COUNTS]
        return out + [("peak_rss", "KiB", float(r["max_rss"]))]
    if job.kind == "thread":
        r = d["functions"]["malloc"][""]
        return [("time", "ns/iter", float(r["time_per_iteration"])), ("peak_rss", "KiB", float(r["max_rss"]))]
    out = [("time", "s", float(d["time_s"])), ("peak_rss", "KiB", float(d["peak_rss_kib"])),
           ("rss_start", "KiB", float(d["rss_start_kib"])), ("rss_end", "KiB", float(d["rss_end_kib"])),
           ("rss_trim", "KiB", float(d["rss_trim_kib"]))]
    if "rss_one_thread_kib" in d:
        out.append(("rss_one_thread", "KiB", float(d["rss_one_thread_kib"])))
    if "rss_linger_kib" in d:
        out.append(("rss_linger", "KiB", float(d["rss_linger_kib"])))
    return out


def parse_figures(job, stdout):
    """parse_output, with every figure finite and not negative (JSON has NaN)."""
    out = parse_output(job, stdout)
    bad = [m for m, _, v in out if not math.isfinite(v) or v < 0]
    if bad:
        raise ValueError(f"not a figure: {', '.join(bad)}")
    return out


def run_one(job, lib, timeout):
    """Runs one benchmark process; returns (metrics, None, "") or (None, reason, output to log)."""
    pin = (lambda: os.sched_setaffinity(0, {pinned_cpu()})) if job.pinned else None
    try:
        p = subprocess.run(job.argv, env=preload_env(lib), capture_output=True, text=True, timeout=timeout,
                           preexec_fn=pin)
    except subprocess.TimeoutExpired:
        return None, f"timeout after {timeout} s", ""
    if p.returncode != 0:
        why = (f"killed by {signal.Signals(-p.returncode).name}" if p.returncode < 0
               else f"exit status {p.returncode}")
        return None, why, p.stderr
    try:
        return parse_figures(job, p.stdout), None, ""
    except (ValueError, KeyError, TypeError) as e:   # TypeError: JSON of another shape
        return None, f"unreadable output ({e})", p.stdout + p.stderr


def run_all(jobs, allocs, rounds, timeout, failure_log):
    res = Results()
    total = len(jobs) * rounds
    started = time.monotonic()
    for rnd in range(1, rounds + 1):
        for i, job in enumerate(jobs, 1):
            done = (rnd - 1) * len(jobs) + i
            log(f"round {rnd}/{rounds} [{done:3d}/{total}] {job.key:<18}", end="")
            # Each round starts one candidate later, so none always runs first, right after
            # the previous benchmark's heaviest process.
            shift = (rnd - 1) % len(job.allocators)
            for alloc in job.allocators[shift:] + job.allocators[:shift]:
                t0 = time.monotonic()
                metrics, why, detail = run_one(job, allocs[alloc], timeout)
                if metrics is None:
                    res.failures.setdefault((job.key, alloc), []).append(why)
                    preload = f"LD_PRELOAD={allocs[alloc]} " if allocs[alloc] else ""
                    failure_log.write(f"== round {rnd} {job.key} under {alloc}: {why}\n"
                                      f"$ {preload}{' '.join(job.argv)}\n{detail[-4000:]}\n")
                    failure_log.flush()
                    log(f" {alloc} FAILED ({why})", end="")
                    continue
                for metric, unit, value in metrics:
                    res.add(rnd, job, alloc, metric, unit, value)
                log(f" {alloc} {time.monotonic() - t0:.1f}s", end="")
            log(f"  [{time.monotonic() - started:.0f} s]")
    return res


# ---------------------------------------------------------------- tables

def fmt_value(v, unit):
    if v is None:
        return "—"
    if unit == "s":
        return f"{v:.3f}"
    if unit == "KiB":
        return f"{v / 1024:.1f}"
    return f"{v:.2f}"


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def md_table(header, rows, align=None):
    align = align or ["---"] + ["---:"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def failure_cell(res, job_key, alloc):
    reasons = res.failures.get((job_key, alloc))
    return f"FAIL ({reasons[0]})" if reasons else "—"


def timed_metrics(res, job):
    """The job's timed figures (every metric but the RSS ones, in KiB), in their order."""
    return [m for m in res.metric_order.get(job.key, []) if res.units[(job.key, m)] != "KiB"]


def timed_rows(res, jobs):
    """[(job, metric, label, unit)] for every timed figure, in job order."""
    return [(job, metric, job.key if metric == "time" else f"{job.key} {metric}", res.units[(job.key, metric)])
            for job in jobs for metric in timed_metrics(res, job)]


def time_table(res, jobs, names):
    out = []
    for job, metric, label, unit in timed_rows(res, jobs):
        vals = {a: res.median(job.key, metric, a) for a in names}
        best = min((v for v in vals.values() if v is not None), default=None)
        cells = []
        for a in names:
            v = vals[a]
            if v is None:
                cells.append(failure_cell(res, job.key, a))
            else:
                cell = fmt_value(v, unit)
                cells.append(f"**{cell}**" if v == best else cell)
        out.append([label, unit] + cells)
    return md_table(["benchmark", "unit"] + names, out, ["---", "---"] + ["---:"] * len(names))


GROUPS = (("simple", "bench-malloc-simple"), ("thread", "bench-malloc-thread"),
          ("workload", "workloads"), ("workload-par", "workloads --parallel"))


def ratio_table(res, jobs, peers):
    """fastmalloc's time over the best peer's and over each peer's, with geometric means."""
    out, by_group, worst = [], {}, (0, None)
    for job, metric, label, unit in timed_rows(res, jobs):
        ratios = {p: res.ratio(job.key, metric, MAIN, p) for p in peers}
        have = {p: r for p, r in ratios.items() if r is not None}
        best_peer = max(have, key=have.get) if have else None   # the peer fastmalloc is slowest against
        best_ratio = have.get(best_peer) if best_peer else None
        failed = res.failed(job.key, metric, peers)
        by_group.setdefault(job.kind, []).append((best_ratio, ratios, failed))
        if failed or (best_ratio and best_ratio > worst[0]):
            worst = (math.inf if failed else best_ratio, label)
        out.append([label, fmt_num(best_ratio) + (f" ({best_peer})" if best_peer else "")] +
                   [fmt_num(ratios[p]) for p in peers])
    all_rows = []
    for kind, title in GROUPS:
        rows = by_group.get(kind)
        if not rows:
            continue
        all_rows += rows
        out.append(geomean_row(f"**geomean {title}**", rows, peers))
    out.append(geomean_row("**geomean all**", all_rows, peers))
    if worst[1]:
        out.append([f"**worst: {worst[1]}**", f"**{fmt_ratio(worst[0])}**"] + [""] * len(peers))
    return md_table(["benchmark", "vs best peer"] + [f"vs {p}" for p in peers], out)


def fmt_num(x, bold=False):
    """A figure to two places (bold: in bold), or "—" for a missing one."""
    if x is None:
        return "—"
    return f"**{x:.2f}**" if bold else f"{x:.2f}"


def fmt_ratio(r):
    return "failed" if r == math.inf else fmt_num(r)


def failed_note(n):
    """Marks a geometric mean that leaves out benchmarks fastmalloc failed on."""
    return f" ({n} failed)" if n else ""


def geomean_row(label, rows, peers):
    g = geomean([b for b, _, _ in rows])
    note = failed_note(sum(failed for _, _, failed in rows))
    return [label, fmt_num(g, bold=True) + note] + [fmt_num(geomean([r[p] for _, r, _ in rows]))
                                                            for p in peers]


def memory_table(res, jobs, names, peers):
    """Peak / end / after-trim RSS per process, and fastmalloc's peak over the smallest peer's."""
    out, ratios = [], []
    for job in jobs:
        cells = []
        for a in names:
            peak = res.median(job.key, "peak_rss", a)
            if peak is None:
                cells.append(failure_cell(res, job.key, a))
                continue
            end, trim = res.median(job.key, "rss_end", a), res.median(job.key, "rss_trim", a)
            cells.append(" / ".join(fmt_value(v, "KiB") for v in (peak, end, trim) if v is not None))
        r = over_best_peer(res, job.key, "peak_rss", peers)
        if res.failed(job.key, "peak_rss", peers):
            r = math.inf   # failed: no mean hides it
        ratios.append((r, job.key))
        out.append([job.key] + cells + [fmt_ratio(r)])
    g = geomean([r for r, _ in ratios if r != math.inf])
    note = failed_note(sum(r == math.inf for r, _ in ratios))
    out.append(["**geomean**"] + [""] * len(names) + [fmt_num(g, bold=True) + note])
    r, key = max(((r, k) for r, k in ratios if r), default=(None, None))
    if r:
        out.append([f"**worst: {key}**"] + [""] * len(names) + [f"**{fmt_ratio(r)}**"])
    return md_table(["benchmark"] + names + ["fm peak ÷ smallest peer"], out)


def over_best_peer(res, job_key, metric, peers, alloc=MAIN):
    """alloc's figure over the best peer's: the highest of its ratios to each peer
    (Results.ratio); None when alloc or every peer lacks the figure."""
    rs = [r for r in (res.ratio(job_key, metric, alloc, p) for p in peers) if r is not None]
    return max(rs) if rs else None


def fast_path_counts(path):
    """fastmalloc's instructions per pair (single, batch100) from bench/instr-count's table."""
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] == MAIN and len(cells) == 3:
                return float(cells[1]), float(cells[2])
    return None


def target_rows(res, jobs, peers, alloc, fast_path):
    """[(target, figure, holds)] for the speed and footprint targets; holds is None where
    this run has no figure for it. A benchmark alloc failed on fails its target."""
    rows = []
    mib = 1024.0

    def ratios_of(kinds=None, keys=None, metric=None):
        """[(label, ratio)] for the jobs picked: metric's figure, else every timed one."""
        picked = [j for j in jobs if (kinds is None or j.kind in kinds) and (keys is None or j.key in keys)]
        if metric:
            return [(j.key, over_best_peer(res, j.key, metric, peers, alloc)) for j in picked]
        return [(label, over_best_peer(res, j.key, m, peers, alloc)) for j, m, label, _ in timed_rows(res, picked)]

    def each_at_most(target, pairs, bound):
        if pairs:
            figure = ", ".join(f"{k} {r:.2f}" if r else f"{k} failed" for k, r in pairs)
            rows.append((target, figure, all(r and r <= bound for _, r in pairs)))

    def mean_at_most(target, pairs, bound):
        if pairs:
            g = geomean([r for _, r in pairs])
            failed = sum(r is None for _, r in pairs)
            rows.append((target, fmt_num(g) + failed_note(failed),
                         bool(g) and g <= bound and not failed))

    def none_over(target, pairs, bound, name_them):
        """The pairs over bound (or failed): named with their ratios, else counted with the worst."""
        if not pairs:
            return
        over = [(k, r) for k, r in pairs if not r or r > bound]
        if name_them:
            listed = ", ".join(f"{k} {fmt_ratio(r or math.inf)}" for k, r in over)
            figure = f"{len(over)} over: {listed}" if over else "none over"
        else:
            worst = max((r for _, r in pairs if r), default=None)
            figure = f"{len(over) or 'none'} over" + (f"; worst {worst:.2f}" if worst else "")
        rows.append((target, figure, not over))

    simple = ratios_of(kinds=("simple",))
    mean_at_most("bench-malloc-simple: geometric mean of the cells ≤ 0.80 × the best peer", simple, 0.80)
    none_over("bench-malloc-simple: no cell over 1.05 × the best peer", simple, 1.05, name_them=False)
    each_at_most("bench-malloc-thread: each thread count ≤ 0.85 × the best peer",
                 ratios_of(kinds=("thread",)), 0.85)
    each_at_most("cross-thread frees (message): ≤ the best peer",
                 ratios_of(keys=("message", "message-par"), metric="time"), 1.0)
    each_at_most("large blocks (realloc-grow, big-loop): ≤ the best peer",
                 ratios_of(keys=("realloc-grow", "big-loop", "realloc-grow-par", "big-loop-par"),
                           metric="time"), 1.0)
    for kind, title in GROUPS[2:]:
        mean_at_most(f"{title}: geometric mean ≤ 0.90 × the best peer", ratios_of(kinds=(kind,)), 0.90)
    if fast_path:
        rows.append(("fast path: ≤ 30 instructions a malloc+free pair (single, batch100)",
                     f"{fast_path[0]:.1f}, {fast_path[1]:.1f}", max(fast_path) <= 30))
    peaks = ratios_of(metric="peak_rss")
    mean_at_most("peak RSS: geometric mean ≤ 1.00 × the smallest peer's", peaks, 1.0)
    none_over("peak RSS: none over 1.25 × the smallest peer's", peaks, 1.25, name_them=True)
    # Back to where it started once everything is freed and trimmed: within 1 MiB + 5 % of peak.
    excess = []
    for job in (j for j in jobs if j.kind.startswith("workload")):
        start, trim, peak = (res.median(job.key, m, alloc) for m in ("rss_start", "rss_trim", "peak_rss"))
        if None not in (start, trim, peak):
            excess.append((job.key, (trim - start) / mib, trim - start <= mib + 0.05 * peak))
    if excess:
        worst = max(excess, key=lambda e: e[1])
        rows.append(("RSS after free and malloc_trim(0): start + 1 MiB + 5 % of peak at most",
                     f"{sum(not ok for *_, ok in excess) or 'none'} over; largest growth {worst[1]:+.2f} MiB "
                     f"({worst[0]})",
                     all(ok for *_, ok in excess)))
    one = res.median("thread-churn", "rss_one_thread", alloc)
    end = res.median("thread-churn", "rss_end", alloc)
    if one and end:
        rows.append(("thread churn: RSS after all threads ≤ after one + 2 MiB",
                     f"{(end - one) / mib:+.2f} MiB", end - one <= 2 * mib))
    return rows


def targets_table(res, jobs, peers, builds, fast_path):
    """Each target with fastmalloc's figure and verdict, per build (shipped, no mark)."""
    per_build = [target_rows(res, jobs, peers, b, fast_path if b == MAIN else None) for b in builds]
    out = []
    for target, *_ in per_build[0]:
        row = [target]
        for rows in per_build:
            hit = next(((fig, ok) for t, fig, ok in rows if t == target), None)
            row += [hit[0], "holds" if hit[1] else "**fails**"] if hit else ["—", ""]
        out.append(row)
    header = ["target"] + [h for b in builds for h in (b, "verdict")]
    return md_table(header, out, ["---"] + ["---:", "---"] * len(builds))


def st_flag_table(res, jobs):
    """bench-malloc-simple single-threaded vs after a thread, with and without the flag."""
    out = []
    for job in (j for j in jobs if j.kind == "simple"):
        for count in COUNTS:
            st, mt = f"st/{count}", f"mt/{count}"
            fm_st, fm_mt, off_st, off_mt, g_st, g_mt = (
                res.median(job.key, scen, alloc) for alloc in (MAIN, NO_ST_FLAG, SYSTEM) for scen in (st, mt))
            fm_mt_st, gain, g_mt_st = (res.ratio(job.key, mt, MAIN, MAIN, st),
                                       res.ratio(job.key, st, NO_ST_FLAG, MAIN),
                                       res.ratio(job.key, mt, SYSTEM, SYSTEM, st))
            out.append([f"{job.key} ×{count}"] + [fmt_value(v, "ns") for v in (fm_st, fm_mt)] +
                       [fmt_num(fm_mt_st)] + [fmt_value(v, "ns") for v in (off_st, off_mt)] +
                       [fmt_num(gain)] + [fmt_value(v, "ns") for v in (g_st, g_mt)] +
                       [fmt_num(g_mt_st)])
    return md_table(["size ×count", "fm st", "fm mt", "fm mt÷st", "flag-off st", "flag-off mt",
                     "gain (off st ÷ fm st)", "glibc st", "glibc mt", "glibc mt÷st"], out)


def mark_table(res, jobs, peers):
    """fastmalloc with and without the double-free mark, each against the best peer and the one
    against the other: time (the geometric mean of a benchmark's timed figures) and peak RSS."""
    out, groups, mem = [], {}, {MAIN: [], NO_MARK: []}

    def over_best(alloc, job, metrics):
        """geomean over metrics of alloc's figure ÷ the best (lowest) peer's."""
        rs = [over_best_peer(res, job.key, m, peers, alloc) for m in metrics]
        return geomean(rs) if rs and all(rs) else None

    def cost(job, metrics):
        """geomean over metrics of the shipped build's figure ÷ the no-mark build's."""
        rs = [res.ratio(job.key, m, MAIN, NO_MARK) for m in metrics]
        return geomean(rs) if rs and all(rs) else None

    for job in jobs:
        timed = timed_metrics(res, job)
        t = {a: over_best(a, job, timed) for a in (MAIN, NO_MARK)}
        t["cost"] = cost(job, timed)
        r = {a: over_best(a, job, ["peak_rss"]) for a in (MAIN, NO_MARK)}
        groups.setdefault(job.kind, []).append(t)
        for a in mem:
            mem[a].append(r[a])
        out.append([job.key] + [fmt_num(t[a]) for a in (MAIN, NO_MARK)] +
                   [fmt_num(t["cost"])] +
                   [fmt_value(res.median(job.key, "peak_rss", a), "KiB") for a in (MAIN, NO_MARK)] +
                   [fmt_num(r[a]) for a in (MAIN, NO_MARK)])
    for kind, title in GROUPS:
        rows = groups.get(kind)
        if rows:
            # Both builds over the same benchmarks: those where either failed are left
            # out, and counted.
            both = [row for row in rows if row[MAIN] and row[NO_MARK] and row["cost"]]
            g = {a: geomean([row[a] for row in both]) for a in (MAIN, NO_MARK, "cost")}
            note = failed_note(len(rows) - len(both))
            out.append([f"**geomean {title}**", fmt_num(g[MAIN], bold=True) + note,
                        fmt_num(g[NO_MARK], bold=True),
                        fmt_num(g["cost"], bold=True), "", "", "", ""])
    g = {a: geomean(mem[a]) for a in mem}
    out.append(["**geomean peak RSS**", "", "", "", "", ""] +
               [fmt_num(g[a], bold=True) for a in (MAIN, NO_MARK)])
    return md_table(["benchmark", "time ÷ best peer", "no mark: ÷ best peer", "mark's cost (time ÷ no-mark time)",
                     "peak RSS, MiB", "no mark: peak RSS", "peak ÷ smallest peer",
                     "no mark: ÷ smallest peer"], out)


def threads_table(res, names):
    out = []
    for a in names:
        one, end = res.median("thread-churn", "rss_one_thread", a), res.median("thread-churn", "rss_end", a)
        many = res.median("many-threads", "peak_rss", a)
        growth = f"{(end - one) / 1024:+.2f}" if one is not None and end is not None else "—"
        out.append([a, fmt_value(one, "KiB"), fmt_value(end, "KiB"), growth, fmt_value(many, "KiB")])
    return md_table(["allocator", "thread-churn RSS after 1 thread", "after all threads", "growth",
                     "many-threads peak RSS"], out)


def linger_table(res, names):
    out = []
    for a in names:
        start, peak, end, linger, trim = (res.median(LINGER_JOB, m, a) for m in
                                          ("rss_start", "peak_rss", "rss_end", "rss_linger", "rss_trim"))
        held = f"{(linger - start) / peak:.2f}" if None not in (start, peak, linger) else "—"
        out.append([a, fmt_value(start, "KiB"), fmt_value(peak, "KiB"), fmt_value(end, "KiB"),
                    fmt_value(linger, "KiB"), fmt_value(trim, "KiB"), held])
    return md_table(["allocator", "start", "peak", "after the frees", f"{LINGER_MS / 1000:g} s later",
                     "after malloc_trim(0)", "held (later - start) ÷ peak"], out)


# ---------------------------------------------------------------- files and charts

def write_files(res, jobs, rundir):
    with open(os.path.join(rundir, "raw.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["round", "benchmark", "allocator", "metric", "unit", "value"])
        w.writerows(res.raw)
    summary = []
    for job in jobs:
        for metric in res.metric_order.get(job.key, []):
            for a in job.allocators:
                v = res.values(job.key, metric, a)
                if v:
                    summary.append({"benchmark": job.key, "metric": metric, "unit": res.units[(job.key, metric)],
                                    "allocator": a, "median": statistics.median(v), "runs": v})
    with open(os.path.join(rundir, "summary.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["benchmark", "metric", "unit", "allocator", "median", "runs"])
        for s in summary:
            w.writerow([s["benchmark"], s["metric"], s["unit"], s["allocator"], s["median"], len(s["runs"])])
    failures = [{"benchmark": j, "allocator": a, "reasons": r} for (j, a), r in res.failures.items()]
    with open(os.path.join(rundir, "summary.json"), "w") as f:
        json.dump({"results": summary, "failures": failures}, f, indent=1)


def chart_rows(res, jobs, names, metric_of):
    """[(label, {alloc: value relative to glibc})] for a chart; simple-N uses the geomean of its cells."""
    rows = []
    for job in jobs:
        metrics = metric_of(job)
        vals = {}
        for a in names:
            rel = [res.ratio(job.key, m, a, SYSTEM) for m in metrics]
            vals[a] = geomean(rel) if rel and all(rel) else None
        rows.append((job.key, vals))
    return rows


def svg_chart(rows, names, title, ylabel, path_base):
    dat = path_base + ".dat"
    with open(dat, "w") as f:
        f.write("benchmark " + " ".join(names) + "\n")
        for label, vals in rows:
            f.write(label + " " + " ".join(f"{vals[a]:.4f}" if vals[a] else "?" for a in names) + "\n")
    script = f"""set terminal svg size 1200,520 dynamic font "sans,11" background "white"
set output "{path_base}.svg"
set title "{title}"
set ylabel "{ylabel}"
set logscale y 2
set grid ytics
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set key top left horizontal
set xtics rotate by 35 right nomirror
set datafile missing "?"
plot for [i=2:{len(names) + 1}] "{dat}" using i:xtic(1) title columnheader(i)
"""
    with open(path_base + ".gp", "w") as f:
        f.write(script)
    return subprocess.run(["gnuplot", path_base + ".gp"], capture_output=True, text=True)


def machine_info(versions):
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        with open("/etc/debian_version") as f:
            distro = "Debian " + f.read().strip()
    except OSError:
        distro = platform.platform()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    pkgs = []
    if shutil.which("dpkg-query"):
        for pkg in ("libc6", "libjemalloc2", "libtcmalloc-minimal4", "libmimalloc2.0"):
            p = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True, text=True)
            if p.returncode == 0 and p.stdout:
                pkgs.append(f"{pkg} {p.stdout}")
    fm = f"fastmalloc {versions.get(MAIN, '?')}"
    return (f"{datetime.date.today().isoformat()}, {cpu}, {os.cpu_count()} CPUs, {mem:.0f} GiB, "
            f"{distro}, kernel {platform.release()}; {fm}; " + ", ".join(pkgs))


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bindir", help="folder with the benchmark programs (needed but with --from-raw)")
    ap.add_argument("--rundir", required=True, help="folder for this run's results")
    ap.add_argument("--mode", choices=MODES, default="quick")
    ap.add_argument("--rounds", type=int, help="rounds (default: 5 full, else 3)")
    ap.add_argument("--alloc", action="append", default=[], metavar="NAME=LIB",
                    help="a candidate; LIB empty for the system allocator (repeat, in run order)")
    ap.add_argument("--instructions", help="Markdown file from bench/instr-count to include")
    ap.add_argument("--note", action="append", default=[], help="a line for the report's notes")
    ap.add_argument("--from-raw", action="store_true",
                    help="run nothing: write the report again from --rundir's raw.csv (the first "
                         "lines of its report.md, which say where it ran, are kept)")
    a = ap.parse_args()
    if a.from_raw:
        return report_from_raw(a)
    if not a.bindir:
        ap.error("--bindir is required")

    mode = MODES[a.mode]
    rounds = a.rounds or mode["rounds"]
    allocs = dict(x.split("=", 1) for x in a.alloc)
    allocs, notes, versions = verify_preloads(a.bindir, allocs)
    notes = a.note + notes
    if MAIN not in allocs:
        log("compare: fastmalloc's preload is not in effect; nothing to compare")
        return 1
    names = [n for n in allocs if n not in VARIANTS]
    peers = [n for n in names if n != MAIN]

    jobs = make_jobs(a.bindir, a.mode, allocs, notes)
    log(f"compare: {a.mode} mode, {rounds} rounds, {len(jobs)} benchmarks x {len(names)} allocators")
    t0 = time.monotonic()
    with open(os.path.join(a.rundir, "failures.log"), "w") as failure_log:
        res = run_all(jobs, allocs, rounds, mode["timeout"], failure_log)
    elapsed = time.monotonic() - t0

    write_files(res, jobs, a.rundir)
    header = [f"# fastmalloc vs {', '.join(peers)} — {a.mode} mode",
              "", f"Measured {machine_info(versions)}.",
              f"{rounds} rounds, candidates interleaved in each round ({' '.join(allocs)}; each round "
              f"starts one candidate later); bench-malloc-simple pinned to CPU {pinned_cpu()}; "
              f"{METHOD}; benchmarks ran for {elapsed:.0f} s.", ""]
    return write_report(a.rundir, res, jobs, list(allocs), header, notes, a.instructions)


# How the report's figures come from the rounds (Results.median, Results.ratio).
METHOD = "medians, and ratios as the median of the ratios within each round"


def report_from_raw(a):
    """--from-raw: the report of a finished run, recomputed from its raw.csv."""
    res, jobs = read_raw(a.rundir)
    allocs = []
    for job in jobs:
        allocs += [x for x in job.allocators if x not in allocs]
    peers = [n for n in allocs if n not in VARIANTS and n != MAIN]
    header = [f"# fastmalloc vs {', '.join(peers)}", "", "(where it ran: not recorded)", ""]
    old = os.path.join(a.rundir, "report.md")
    if os.path.exists(old):
        with open(old) as f:
            header = f.read().split("\n")[:5]
        header[3] = header[3].replace("; medians; ", f"; {METHOD}; ")
    notes = a.note + ["Recomputed from the run's raw.csv (bench/compare.py --from-raw)."]
    return write_report(a.rundir, res, jobs, allocs, header, notes, a.instructions)


def write_report(rundir, res, jobs, allocs, header, notes, instructions):
    """Writes rundir/report.md (and the charts) for the candidates `allocs`, and prints it."""
    names = [n for n in allocs if n not in VARIANTS]
    peers = [n for n in names if n != MAIN]
    builds = [b for b in (MAIN, NO_MARK) if b in allocs]
    report = list(header)
    report += ["## Targets", "", targets_table(res, jobs, peers, builds, fast_path_counts(instructions)), "",
               "A ratio to a peer is the median over the rounds of fastmalloc's figure ÷ the peer's "
               "in the same round; the best peer is the one this ratio is highest against. A "
               "benchmark that failed fails its target. RSS after trim: bench-workload's RSS after "
               "malloc_trim(0) less its RSS at start.", ""]
    report += ["## Time (median; lower is better; best in bold)", "", time_table(res, jobs, names), "",
               "simple-N: bench-malloc-simple with N-byte blocks, ns per malloc+free pair; st: main thread "
               "while single-threaded, thr: in a second thread, mt: main thread after that thread was "
               "joined; /C: C blocks allocated then freed. thread-T: bench-malloc-thread with T threads, "
               "ns per iteration. Other rows: workloads (bench-workload --list, bench-cxx --list), "
               "seconds; -par: --parallel.",
               ""]
    report += ["## fastmalloc's time ÷ each peer's (below 1: fastmalloc is faster)", "",
               ratio_table(res, jobs, peers), ""]
    report += ["## Memory: peak / end / after malloc_trim(0) RSS, MiB (median)", "",
               memory_table(res, jobs, names, peers), "",
               "peak: the process's peak RSS (VmHWM; getrusage's ru_maxrss would include the RSS of the "
               "driver that forked it); end: /proc/self/statm right after the workload freed everything; "
               "trim: after malloc_trim(0) (glibc's own when the preloaded allocator has none).", ""]
    if NO_ST_FLAG in allocs and any(j.kind == "simple" for j in jobs):
        report += ["## The single-threaded flag (bench-malloc-simple, ns per pair)", "",
                   st_flag_table(res, jobs), "",
                   "fm: normal build; flag-off: built with -DFM_SINGLE_THREAD_FLAG=OFF. gain above 1: the flag "
                   "makes the single-threaded case faster.", ""]
    if NO_MARK in allocs:
        report += ['## What the double-free check costs (docs/design.md, "The double-free check")', "",
                   mark_table(res, jobs, peers), "",
                   "fastmalloc as shipped, and built with -DFM_FREE_MARK=OFF: without the mark, free() "
                   "writes nothing into a freed block and a double free is caught only when the thread's "
                   "cache gives the block back to its span (not at all if malloc hands it out again "
                   "first). Time: the geometric mean of a benchmark's timed figures (for simple-N, its "
                   "12 cells), each over the best peer's in that figure; the mark's cost is the same "
                   "mean of the shipped build's figures over the no-mark build's.", ""]
    if any(j.key == "thread-churn" for j in jobs):
        report += ["## Threads: RSS, MiB", "", threads_table(res, names), ""]
    if any(j.key == LINGER_JOB for j in jobs):
        report += [f"## A freed heap, without malloc_trim: RSS, MiB ({LINGER_JOB})", "",
                   linger_table(res, names), "",
                   f"{LINGER_JOB} frees everything it allocated; then the program goes on for "
                   f"{LINGER_MS / 1000:g} s, mallocing, writing and freeing 256 blocks of 48 bytes every "
                   "10 ms, and reads its RSS; malloc_trim(0) comes after.", ""]
    if instructions and os.path.exists(instructions):
        with open(instructions) as f:
            report += ["## Fast path", "", f.read().strip(), ""]

    charts = []
    if shutil.which("gnuplot"):
        for base, title, ylabel, metric_of in (
                ("time", "Time relative to glibc (lower is better)", "time / glibc's",
                 lambda j: timed_metrics(res, j)),
                ("memory", "Peak RSS relative to glibc (lower is better)", "peak RSS / glibc's",
                 lambda j: ["peak_rss"])):
            p = svg_chart(chart_rows(res, jobs, names, metric_of), names, title, ylabel,
                          os.path.join(rundir, base))
            if p.returncode == 0:
                charts.append(f"{base}.svg")
            else:
                notes.append(f"gnuplot failed on {base}.svg: {p.stderr.strip()[:200]}")
    else:
        notes.append("gnuplot not found: no SVG charts (Debian package gnuplot-nox)")
    if res.failures:
        notes.append("some runs failed; see failures.log: " +
                     "; ".join(f"{j} under {al}: {r[0]} ({len(r)}x)" for (j, al), r in res.failures.items()))
    if charts:
        report += ["Charts: " + ", ".join(charts) + " (simple-N: geometric mean of its cells).", ""]
    if notes:
        report += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]

    text = "\n".join(report)
    with open(os.path.join(rundir, "report.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
