"""Threads under an address-space limit (RLIMIT_AS, 1 GiB) the program sets itself: threads
started after it, or after it was set while another thread ran, must start and allocate.
Exit status 0 when both pass; run under LD_PRELOAD=libfastmalloc.so (and without: the control)."""
import resource
import subprocess
import sys
import threading

LIMIT = 1 << 30


def allocate_a_bit(results, index):
    try:
        blocks = [bytearray(n) for n in (10, 1000, 100000, 3 << 20)]
        blocks += [b"x" * 5000 for _ in range(200)]
        results[index] = sum(len(b) for b in blocks) > 0
    except MemoryError:
        results[index] = False


def start_threads(count):
    """Starts `count` threads that allocate; returns a failure message or None."""
    results = [None] * count
    threads = []
    for i in range(count):
        t = threading.Thread(target=allocate_a_bit, args=(results, i))
        try:
            t.start()
        except RuntimeError as e:   # "can't start new thread": its stack could not be mapped
            return "thread %d of %d did not start: %s" % (i + 1, count, e)
        threads.append(t)
    for t in threads:
        t.join()
    if not all(results):
        return "a thread's allocations failed: %s" % results
    return None


def set_limit():
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]   # kept: it cannot be raised again
    soft = LIMIT if hard == resource.RLIM_INFINITY else min(LIMIT, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def limit_then_thread():
    set_limit()
    return start_threads(1) or start_threads(4)


def limit_while_thread_runs():
    """The limit set while another thread is running; then new threads start."""
    started, go_on = threading.Event(), threading.Event()
    results = [None]

    def runner():
        started.set()
        go_on.wait()
        allocate_a_bit(results, 0)

    t = threading.Thread(target=runner)
    t.start()
    started.wait()
    set_limit()
    go_on.set()
    failure = start_threads(4)
    t.join()
    if not failure and not results[0]:
        failure = "the thread running before the limit could not allocate"
    return failure


CASES = {"limit-then-thread": limit_then_thread,
         "limit-while-thread-runs": limit_while_thread_runs}


def main():
    # Each case in a process of its own: a lowered hard limit cannot be raised again, and
    # the first case's threads would change what the second one tests.
    failed = 0
    for name in sys.argv[1:] or list(CASES):
        if name not in CASES:
            print("rlimit_thread: unknown case", name)
            return 2
        failed += subprocess.run([sys.executable, __file__, "--case", name]).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--case":
        failure = CASES[sys.argv[2]]()
        if failure:
            print("rlimit_thread %s: FAIL: %s (RLIMIT_AS %d MiB)" % (sys.argv[2], failure, LIMIT >> 20))
            sys.exit(1)
        print("rlimit_thread %s: ok" % sys.argv[2])
        sys.exit(0)
    sys.exit(main())
