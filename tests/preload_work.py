"""Python work for the preload test: dict, str, bytes and thread work whose output is
deterministic, so a run under LD_PRELOAD=libfastmalloc.so must match a plain run byte for
byte. With --probe it instead reports whether fastmalloc owns memory Python allocated."""
import ctypes
import hashlib
import sys
import threading


def digest(text):
    return hashlib.sha256(text.encode()).hexdigest()


def dict_work():
    d = {}
    for i in range(200000):
        d["k%d" % i] = str(i) * (i % 7)
    for i in range(0, 200000, 3):
        del d["k%d" % i]
    return [len(d), sum(len(v) for v in d.values()), digest("".join(sorted(d)[:2000]))]


def str_work():
    text = " ".join("word%d" % (i * 7919 % 10007) for i in range(100000))
    counts = {}
    for w in text.split():
        counts[w] = counts.get(w, 0) + 1
    grown = bytearray()
    for i in range(2000):
        grown += bytes([i % 251]) * (i % 1500)
    return [len(counts), max(counts.values()), text.upper().count("WORD1"),
            digest(text.replace("word", "w")), hashlib.sha256(grown).hexdigest()]


def thread_work():
    results = [None] * 8

    def run(n):
        local = {(n, i): ("%d-%d" % (n, i)) * 3 for i in range(30000)}
        results[n] = digest("".join(local[(n, i)] for i in range(0, 30000, 7)))

    threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def probe():
    lib = ctypes.CDLL(None)
    if not hasattr(lib, "fm_owns"):
        print("fastmalloc absent")
        return 2
    lib.fm_owns.argtypes = [ctypes.c_void_p]
    lib.malloc.argtypes = [ctypes.c_size_t]
    lib.malloc.restype = ctypes.c_void_p
    lib.free.argtypes = [ctypes.c_void_p]
    p = lib.malloc(100)
    big = b"x" * 100000  # above pymalloc's limit, so it comes from malloc; id() is its address
    owned = lib.fm_owns(p) == 1 and lib.fm_owns(id(big)) == 1
    lib.free(p)
    print("fastmalloc owns python's memory" if owned else "python's memory is not fastmalloc's")
    return 0 if owned else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["--probe"]:
        sys.exit(probe())
    for value in dict_work() + str_work() + thread_work():
        print(value)
