/* Helpers shared by the fastmalloc tests: cmocka (never with UNIT_TESTING), the size-class
 * boundaries, payload patterns, RSS, and running code in a forked child.
 * Everything here is static inline so each test executable stays one translation unit. */
#ifndef FM_TEST_H
#define FM_TEST_H

#ifdef UNIT_TESTING
#error "UNIT_TESTING makes cmocka replace malloc/free: the tests would not test fastmalloc"
#endif

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <fastmalloc.h>

#include "probe_rss.h"

#define FMT_KIB ((size_t)1 << 10)
#define FMT_MIB ((size_t)1 << 20)
#define FMT_MAX_CLASSES 64

/* qsort's order for elements that start with a pointer: by that pointer's address. */
static inline int fmt_compare_addresses(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return x < y ? -1 : x > y;
}

/* Hides a pointer's origin from the compiler, so it cannot reason about a free or a
 * deliberate misuse (and cannot delete a malloc/free pair). */
static inline void *fmt_launder(void *p) {
  __asm__ volatile("" : "+r"(p));
  return p;
}

/* Writes byte over block p from offset `from` to its usable size. Through fmt_launder:
 * with _FORTIFY_SOURCE=3 (Ubuntu's default) the compiler bounds p by the size asked for,
 * and would stop a write into the slack that malloc_usable_size grants. */
static inline void fmt_fill_usable(void *p, size_t from, int byte) {
  memset((char *)fmt_launder(p) + from, byte, malloc_usable_size(p) - from);
}

/* The class sizes of docs/design.md ("Memory layout"), in increasing order: 16-byte steps
 * to 128, then four classes per power of two up to 8 KiB, then 10 and 12 KiB (blocks of
 * 12-64 KiB are page blocks, runs of whole pages). Returns the count. */
static inline unsigned fmt_class_sizes(size_t out[FMT_MAX_CLASSES]) {
  unsigned n = 0;
  for (size_t s = 16; s <= 128; s += 16) out[n++] = s;
  for (size_t p = 128; p < 16384; p *= 2)
    for (size_t k = 1; k <= 4 && p + k * (p / 4) <= 12288; k++) out[n++] = p + k * (p / 4);
  return n;
}

/* Every class size s as s-1, s, s+1, then sizes served by page blocks and large blocks.
 * Returns the count. */
static inline unsigned fmt_boundary_sizes(size_t out[3 * FMT_MAX_CLASSES + 8]) {
  size_t cls[FMT_MAX_CLASSES];
  unsigned nc = fmt_class_sizes(cls), n = 0;
  for (unsigned i = 0; i < nc; i++) {
    out[n++] = cls[i] - 1;
    out[n++] = cls[i];
    out[n++] = cls[i] + 1;
  }
  /* Blocks of whole pages (above the classes, up to 64 KiB), then large blocks. */
  const size_t large[] = {20 * FMT_KIB + 1, 40000, 64 * FMT_KIB, 64 * FMT_KIB + 1,
                          256 * FMT_KIB - 1, FMT_MIB - 1, FMT_MIB + 1, 4 * FMT_MIB + 1};
  for (unsigned i = 0; i < sizeof large / sizeof large[0]; i++) out[n++] = large[i];
  return n;
}

/* A 64-bit pseudo-random generator (xorshift64*); state must be non-zero. */
static inline uint64_t fmt_rand(uint64_t *state) {
  uint64_t x = *state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1DULL;
}

static inline uint64_t fmt_seed_state(uint64_t seed) {
  uint64_t s = (seed + 0x9E3779B97F4A7C15ULL) * 0xBF58476D1CE4E5B9ULL;
  return s ? s : 1;
}

/* Fills n bytes with the pattern of `seed`. The pattern of a prefix does not depend on n,
 * so a block can be checked up to any length after realloc. */
static inline void fmt_fill(void *p, size_t n, uint64_t seed) {
  unsigned char *b = p;
  uint64_t s = fmt_seed_state(seed);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t w = fmt_rand(&s);
    memcpy(b + i, &w, n - i < 8 ? n - i : 8);
  }
}

/* True when the first n bytes hold the pattern of `seed`. */
static inline bool fmt_check(const void *p, size_t n, uint64_t seed) {
  const unsigned char *b = p;
  uint64_t s = fmt_seed_state(seed);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t w = fmt_rand(&s);
    if (memcmp(b + i, &w, n - i < 8 ? n - i : 8) != 0) return false;
  }
  return true;
}

static inline bool fmt_is_zero(const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i]) return false;
  return true;
}

static inline bool fmt_aligned(const void *p, size_t align) {
  return ((uintptr_t)p & (align - 1)) == 0;
}

/* Resident set size in bytes (probe_rss.h); fails the test when it cannot be read. */
static inline size_t fmt_rss(void) {
  size_t rss = probe_rss();
  assert_true(rss > 0);
  return rss;
}

/* Grows the calling thread's cache as far as the budgets allow: mallocs and frees
 * FMT_GROW_BLOCKS blocks of 1 KiB and as many of 1.5 KiB, in step, a few times (to 3.5 MiB
 * of bins under the default 4 MiB budget). Both bins keep missing, so they stay grown (an
 * idle sweep halves a bin that did not; grown one after the other, the first would be swept
 * while the second grew). Returns how many bytes the cache holds afterwards, as mallinfo2
 * counts them (cached blocks count as in use): meaningful while no other thread allocates. */
enum { FMT_GROW_BLOCKS = 2048 };
static inline size_t fmt_grow_cache(void) {
  static __thread void *blocks[2][FMT_GROW_BLOCKS];
  size_t before = mallinfo2().uordblks;
  for (int round = 0; round < 4; round++) {
    for (int i = 0; i < FMT_GROW_BLOCKS; i++)
      if (!(blocks[0][i] = malloc(1024)) || !(blocks[1][i] = malloc(1536))) return 0;
    for (int i = 0; i < FMT_GROW_BLOCKS; i++) {
      free(blocks[0][i]);
      free(blocks[1][i]);
    }
  }
  size_t after = mallinfo2().uordblks;
  return after > before ? after - before : 0;
}

/* Asserts that this process's malloc is fastmalloc's: its blocks are owned, libc's own
 * allocations (strdup) are owned, and the symbol `malloc` resolves into libfastmalloc. */
static inline void fmt_assert_uses_fastmalloc(void) {
#ifdef FM_API_NAMES
  /* Built to call the fm_ names (fm_api_names.h): libc's malloc is someone else's. */
  void *q = malloc(24);
  assert_non_null(q);
  assert_true(fm_owns(q));
  free(q);
  return;
#endif
  void *p = malloc(24);
  char *s = strdup("fastmalloc");
  assert_non_null(p);
  assert_non_null(s);
  assert_true(fm_owns(p));
  assert_true(fm_owns(s));
  free(p);
  free(s);
  Dl_info info;
  assert_true(dladdr(dlsym(RTLD_DEFAULT, "malloc"), &info) != 0);
  assert_non_null(info.dli_fname);
  assert_non_null(strstr(info.dli_fname, "libfastmalloc"));
}

/* Runs fn(arg) in a forked child (stderr captured into err, core dumps off, SIGABRT at its
 * default, killed by SIGALRM after timeout_s) and returns its wait status, or -1 when the
 * child could not be run. The child ends with _exit(0) when fn returns; fn reports failure
 * with _exit(non-zero). Safe in any thread: it never calls cmocka. */
static inline int fmt_run_child(void (*fn)(void *), void *arg, unsigned timeout_s, char *err,
                                size_t errlen) {
  int fds[2];
  err[0] = 0;
  if (pipe(fds)) return -1;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    signal(SIGABRT, SIG_DFL);
    close(fds[0]);
    dup2(fds[1], STDERR_FILENO);
    close(fds[1]);
    alarm(timeout_s);
    fn(arg);
    _exit(0);
  }
  close(fds[1]);
  size_t used = 0;
  for (;;) {
    char tmp[256];
    ssize_t r = read(fds[0], tmp, sizeof tmp);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    size_t take = (size_t)r < errlen - 1 - used ? (size_t)r : errlen - 1 - used;
    memcpy(err + used, tmp, take);
    used += take;
  }
  err[used] = 0;
  close(fds[0]);
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return status;
}

/* Asserts that a child status from fmt_run_child means success, printing what went wrong. */
static inline void fmt_assert_child_ok(int status, const char *err) {
  if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  if (status == -1)
    print_error("could not run the child: %s\n", strerror(errno));
  else if (WIFSIGNALED(status))
    print_error("child killed by signal %d%s\n", WTERMSIG(status),
                WTERMSIG(status) == SIGALRM ? " (timeout: deadlock?)" : "");
  else
    print_error("child exited with status %d\n", WEXITSTATUS(status));
  print_error("child stderr: %s\n", err);
  fail();
}

#endif
