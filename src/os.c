/* Every call into the kernel: mappings, purging, time, randomness, futexes, the process
 * id and writes to stderr. Uses raw system calls or libc wrappers that never allocate;
 * keeps a count of mapped bytes. Every function keeps errno as it was, failing or not:
 * callers decide what a failure means (malloc sets ENOMEM; a fallback that works leaves
 * errno alone, as glibc's malloc does). */
#include "os.h"

#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static size_t os_mapped;   /* bytes mapped read-write (modular: shrinking adds its two's
                              complement) */

static size_t os_mapped_peak;   /* the most os_mapped has been */

static void mapped_add(size_t delta) {
  size_t now = __atomic_add_fetch(&os_mapped, delta, __ATOMIC_RELAXED);
  size_t peak = __atomic_load_n(&os_mapped_peak, __ATOMIC_RELAXED);
  while (now > peak && now < (size_t)1 << 62 &&   /* (a shrink is a wrapped add) */
         !__atomic_compare_exchange_n(&os_mapped_peak, &peak, now, true, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
  }
}

static void os_unmap_uncounted(void *addr, size_t size) {
  int saved = errno;
  munmap(addr, size);
  errno = saved;
}

static void *os_mmap(void *hint, size_t size, int prot, int flags) {
  int saved = errno;
  void *p = mmap(hint, size, prot, flags | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  errno = saved;
  return p == MAP_FAILED ? NULL : p;
}

void *os_map(size_t size) {
  void *p = os_mmap(NULL, size, PROT_READ | PROT_WRITE, 0);
  if (p) mapped_add(size);
  return p;
}

void os_advise_huge_pages(void *addr, size_t size, bool huge) {
  int saved = errno;
  madvise(addr, size, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  errno = saved;
}

void *os_map_sparse(size_t size) {
  void *p = os_map(size);
  if (p) os_advise_huge_pages(p, size, false);
  return p;
}

/* The kernel places mappings top-down, below the lowest one, usually one of ours: a
 * mapping of a multiple of the alignment then comes out aligned, in one system call.
 * Else it unmaps that, over-maps by the alignment and trims both ends: up to five calls.
 * (Each call takes the process's mapping lock, which other threads' mapping calls wait
 * for.) */
static void *os_mmap_aligned(size_t size, size_t align, int prot, int flags) {
  if (size + align < size) return NULL;
  char *p = os_mmap(NULL, size, prot, flags);
  if (!p || ((uintptr_t)p & (align - 1)) == 0) return p;
  os_unmap_uncounted(p, size);
  char *raw = os_mmap(NULL, size + align, prot, flags);
  if (!raw) return NULL;
  char *start = (char *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
  if (start > raw) os_unmap_uncounted(raw, (size_t)(start - raw));
  char *end = raw + size + align;
  if (end > start + size) os_unmap_uncounted(start + size, (size_t)(end - (start + size)));
  return start;
}

void *os_map_aligned(size_t size, size_t align) {
  void *p = os_mmap_aligned(size, align, PROT_READ | PROT_WRITE, 0);
  if (p) mapped_add(size);
  return p;
}

void os_unmap(void *addr, size_t size) {
  os_unmap_uncounted(addr, size);
  mapped_add(-size);
}

bool os_purge(void *addr, size_t size) {
  int saved = errno;
  bool purged = madvise(addr, size, MADV_DONTNEED) == 0;   /* refused for mlock'ed pages */
  errno = saved;
  return purged;
}

bool os_resident_pages(const void *addr, size_t size, unsigned char *vec) {
  int saved = errno;
  bool ok = mincore((void *)addr, size, vec) == 0;
  errno = saved;
  return ok;
}

static void *os_mremap(void *addr, size_t old_size, size_t new_size, int flags, void *dest) {
  int saved = errno;
  void *p = mremap(addr, old_size, new_size, flags, dest);
  errno = saved;
  return p == MAP_FAILED ? NULL : p;
}

void *os_remap(void *addr, size_t old_size, size_t new_size) {
  void *p = os_mremap(addr, old_size, new_size, 0, NULL);
  if (p) mapped_add(new_size - old_size);   /* modular: shrinking works too */
  return p;
}

void *os_remap_move(void *addr, size_t old_size, size_t new_size, void *dest) {
  void *p = os_mremap(addr, old_size, new_size, MREMAP_MAYMOVE | (dest ? MREMAP_FIXED : 0), dest);
  if (p) mapped_add(new_size - old_size);
  return p;
}

bool os_move(void *addr, size_t old_size, void *dest, size_t new_size) {
  /* Moving and growing at once leaves one mapping, so a later growth can happen in place;
   * the kernel checks the growth (RLIMIT_AS, a source split by mprotect) before it drops
   * dest, so on refusal the pages just move, without growing, onto dest's start. */
  int flags = MREMAP_MAYMOVE | MREMAP_FIXED;
  if (!os_mremap(addr, old_size, new_size, flags, dest) &&
      !os_mremap(addr, old_size, old_size, flags, dest))
    return false;
  mapped_add(-old_size);   /* dest's range was counted when it was mapped */
  return true;
}

size_t os_mapped_bytes(void) { return __atomic_load_n(&os_mapped, __ATOMIC_RELAXED); }

size_t os_mapped_peak_bytes(void) { return __atomic_load_n(&os_mapped_peak, __ATOMIC_RELAXED); }

unsigned os_cpu_count(void) {
  /* The raw system call: glibc's wrapper may allocate for large CPU sets. The kernel wants
   * room for every CPU it supports (cpu_set_t's 1024 are too few on some machines): 8192,
   * x86-64's most. Called once, at set-up. */
  static uint64_t set[8192 / 64];
  int saved = errno;
  long n = syscall(SYS_sched_getaffinity, 0, sizeof set, set);
  errno = saved;
  if (n <= 0) return 1;
  unsigned count = 0;
  for (long i = 0; i < n / 8; i++) count += (unsigned)__builtin_popcountll(set[i]);
  return count ? count : 1;
}

uint64_t os_random64(void) {
  uint64_t value = 0;
  int saved = errno;
  if (syscall(SYS_getrandom, &value, sizeof value, GRND_NONBLOCK) != (long)sizeof value) {
    /* No entropy yet (early boot), or no getrandom (a seccomp filter): mix the clock and
     * addresses, still per process. */
    value = os_now_ns() ^ ((uintptr_t)&value * 0x9E3779B97F4A7C15ull) ^ (uint64_t)getpid() << 32;
    errno = saved;
  }
  return value;
}

uint64_t os_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void os_sleep_ns(uint64_t ns) {
  struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000), .tv_nsec = (long)(ns % 1000000000)};
  int saved = errno;
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
  errno = saved;
}

const char *os_getenv(const char *name) {
  size_t len = strlen(name);
  for (char **e = environ; e && *e; e++) {
    if (strncmp(*e, name, len) == 0 && (*e)[len] == '=') return *e + len + 1;
  }
  return NULL;
}

unsigned os_getpid(void) { return (unsigned)syscall(SYS_getpid); }

void os_futex_wait(int *addr, int expected) {
  int saved = errno;   /* EAGAIN when the value already changed */
  syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
  errno = saved;
}

void os_futex_wake(int *addr, int count) {
  int saved = errno;
  syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
  errno = saved;
}

void os_write_stderr(const char *text, size_t len) {
  int saved = errno;
  while (len) {
    ssize_t w = write(STDERR_FILENO, text, len);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      break;
    }
    text += w;
    len -= (size_t)w;
  }
  errno = saved;
}

void os_abort(void) { abort(); }
