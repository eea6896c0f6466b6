/* Helpers shared by the benchmark programs: a monotonic clock, RSS readings, a pointer
 * barrier that keeps the compiler from deleting allocations, and a seeded random generator.
 * Header-only; the benchmarks link against nothing but libc, so LD_PRELOAD picks the allocator. */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Nanoseconds from CLOCK_MONOTONIC. */
static inline uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The compiler must assume p is read and memory changed: allocations stay. */
static inline void bench_escape(void *p)
{
    __asm__ volatile("" : : "g"(p) : "memory");
}

/* Reads a /proc/self file into buf with open/read: the measurement itself allocates nothing. */
static inline int bench_read_proc(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    return 0;
}

/* Peak resident set of this process image, KiB: VmHWM from /proc/self/status, -1 if unreadable.
 * Not getrusage's ru_maxrss: Linux carries that across exec from the process that forked us
 * (a Python driver's 18 MiB would hide every small benchmark's own peak). */
static inline long bench_peak_rss_kib(void)
{
    char buf[4096];
    long kib;
    if (bench_read_proc("/proc/self/status", buf, sizeof buf) != 0)
        return -1;
    const char *line = strstr(buf, "VmHWM:");
    return line && sscanf(line + 6, "%ld", &kib) == 1 ? kib : -1;
}

/* Resident set now, KiB, from /proc/self/statm (second field, in pages); -1 if unreadable. */
static inline long bench_rss_kib(void)
{
    char buf[256];
    long pages_total, pages_resident;
    if (bench_read_proc("/proc/self/statm", buf, sizeof buf) != 0 ||
        sscanf(buf, "%ld %ld", &pages_total, &pages_resident) != 2)
        return -1;
    return pages_resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* xorshift64*: small, fast, and the same sequence on every allocator for a given seed. */
typedef struct {
    uint64_t s;
} bench_rng;

static inline void bench_rng_seed(bench_rng *r, uint64_t seed)
{
    r->s = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    if (r->s == 0)
        r->s = 1;
}

static inline uint64_t bench_rng_next(bench_rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}

/* Uniform in [0, n). */
static inline uint64_t bench_rng_below(bench_rng *r, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)bench_rng_next(r) * n) >> 64);
}

/* Uniform in [0, 1). */
static inline double bench_rng_unit(bench_rng *r)
{
    return (double)(bench_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

#endif /* BENCH_COMMON_H */
