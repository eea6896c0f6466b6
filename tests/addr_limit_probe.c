/* Run under an address-space limit (ulimit -v 1000000). Small, span and mapped blocks
 * must all work there, without touching errno; a request beyond the limit must answer
 * NULL with ENOMEM; a stack pointer must not be taken for a block, and the free of a
 * global must be reported. Then the heap is filled up: a shrinking realloc must still
 * work, and once everything is freed a big block must fit again. Threads spread over the arenas, each of which maps chunks ahead: a request
 * that needs that address space must get it once the threads are gone. Then a realloc
 * that must move a block whose old and new size do not fit in the address space together,
 * and one that grows a block with the address space full but a chunk's units free.
 * Exit 0 on success. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <malloc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fastmalloc.h"

static int fail(const char *what, size_t n) {
  printf("FAIL: %s (size %zu, errno %d)\n", what, n, errno);
  return 1;
}

/* Fills the address space with small blocks, checks that shrinking realloc still works
 * (it needs no memory), frees them all, and asks for a big block again. */
static int exhaust_and_recover(void) {
  static void *blocks[1 << 20];
  char *large = malloc(200000);
  if (!large) return fail("malloc", 200000);
  size_t n = 0;
  while (n < sizeof blocks / sizeof *blocks && (blocks[n] = malloc(1000))) n++;
  if (n == sizeof blocks / sizeof *blocks) return fail("the heap never filled up", n);
  if (errno != ENOMEM) return fail("malloc at the limit", 1000);
  errno = 0;
  if (realloc(blocks[0], 10) != blocks[0]) return fail("shrinking realloc at the limit", 10);
  if (realloc(large, 100) != large) return fail("shrinking realloc at the limit", 100);
  if (errno != 0) return fail("shrinking realloc at the limit set errno", 100);
  for (size_t i = 0; i < n; i++) free(blocks[i]);
  free(large);
  size_t big = (size_t)512 << 20;   /* fits only if the freed heap's mappings went back */
  char *p = malloc(big);
  if (!p) return fail("malloc after freeing a full heap", big);
  memset(p, 1, big);
  free(p);
  return 0;
}

/* Address space still free under the limit, from /proc/self/statm. */
static size_t headroom(void) {
  struct rlimit limit;
  unsigned long pages = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  bool read = fscanf(f, "%lu", &pages) == 1;
  fclose(f);
  if (!read || getrlimit(RLIMIT_AS, &limit) != 0) return 0;
  size_t used = pages * 4096;
  return limit.rlim_cur > used ? limit.rlim_cur - used : 0;
}

/* Each thread allocates while all of them are alive, so they spread over the arenas.
 * Once they are gone, what fastmalloc still maps must be little (it holds no address space
 * ahead of its needs), and a request for nearly all the address space left must work. */
enum { SPREAD_THREADS = 8 };
static pthread_barrier_t all_allocated;

static void *allocate_in_own_arena(void *arg) {
  void *p = malloc(100);
  pthread_barrier_wait(&all_allocated);
  free(p);
  return arg;
}

static int arenas_given_back(void) {
  pthread_t t[SPREAD_THREADS];
  if (pthread_barrier_init(&all_allocated, NULL, SPREAD_THREADS)) return fail("barrier", 0);
  for (int i = 0; i < SPREAD_THREADS; i++)
    if (pthread_create(&t[i], NULL, allocate_in_own_arena, NULL)) return fail("thread", 0);
  for (int i = 0; i < SPREAD_THREADS; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&all_allocated);
  malloc_trim(0);
  size_t held = fm_mapped_bytes();
  if (held > ((size_t)16 << 20)) return fail("mapped after the threads and a trim", held);
  size_t big = headroom() - ((size_t)16 << 20);
  char *p = malloc(big);
  if (!p) {
    printf("FAIL: malloc(%zu) with %zu bytes of address space free and %zu held\n", big,
           headroom(), held);
    return 1;
  }
  free(p);
  return 0;
}

/* Grows a block to 0.7 x the free address space from 0.4 x: it cannot grow in place (the
 * mapping above it was there first), and old and new do not fit side by side, but the
 * growth alone does, as with glibc's mremap. */
static int realloc_moves_tightly(void) {
  size_t room = headroom(), from = room / 10 * 4, to = room / 10 * 7;
  if (room < ((size_t)100 << 20)) return fail("no room left to try", room);
  unsigned char *p = malloc(from);
  if (!p) return fail("malloc", from);
  for (size_t i = 0; i < from; i += 4096) p[i] = (unsigned char)(i >> 12);
  p[from - 1] = 0x5a;
  errno = 0;
  unsigned char *q = realloc(p, to);
  if (!q) return fail("realloc without room for old and new together", to);
  for (size_t i = 0; i < from; i += 4096)
    if (q[i] != (unsigned char)(i >> 12)) return fail("realloc lost the contents", i);
  if (q[from - 1] != 0x5a || errno != 0) return fail("realloc's tail or errno", from);
  memset(q, 1, to);
  free(q);
  return 0;
}

/* A block realloc grows past 256 KiB gets a mapping of its own, to grow further without a
 * copy; at the limit, where the OS refuses that mapping, it takes free units of a chunk
 * mapped already. The heap is filled with blocks of one unit (64 KiB) each, then 16 of
 * them allocated one after another, so side by side in a chunk, are freed. */
static int realloc_grows_into_chunk_at_limit(void) {
  static void *blocks[1 << 15];
  size_t n = 0, most = sizeof blocks / sizeof *blocks;
  while (n < most && (blocks[n] = malloc(40000))) n++;
  if (n == most || n < 64) return fail("the heap did not fill up with blocks of 40000", n);
  for (size_t i = n / 2; i < n / 2 + 16; i++) {
    free(blocks[i]);
    blocks[i] = NULL;
  }
  memset(blocks[0], 0x3c, 40000);
  errno = 0;
  unsigned char *q = realloc(blocks[0], 300000);
  if (!q) return fail("realloc growing a block at the limit", 300000);
  if (q[0] != 0x3c || q[39999] != 0x3c || errno != 0) return fail("realloc's contents or errno", 300000);
  memset(q, 1, 300000);
  blocks[0] = q;
  for (size_t i = 0; i < n; i++) free(blocks[i]);
  return 0;
}

/* free() of a pointer fastmalloc never handed out (a global here, far from its memory)
 * is reported, not followed: the child must die of SIGABRT, not of a fault. */
static int foreign_free_reported(void) {
  static char global[64];
  pid_t child = fork();
  if (child < 0) return fail("fork", 0);
  if (child == 0) {
    int devnull = open("/dev/null", O_WRONLY);   /* (the report is expected) */
    if (devnull >= 0) dup2(devnull, STDERR_FILENO);
    free(global + 16);
    _exit(0);
  }
  int status;
  if (waitpid(child, &status, 0) != child || !WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT)
    return fail("free of a global was not reported", 0);
  return 0;
}

int main(void) {
  errno = 0;
  for (unsigned i = 0; i < 2000; i++) {
    size_t n = 16 + (size_t)i * 97 % 70000;   /* small classes, spans and mapped blocks */
    char *p = malloc(n);
    if (!p) return fail("malloc", n);
    if (!fm_owns(p)) return fail("a block not from fastmalloc", n);
    memset(p, (int)i, n);
    char *q = realloc(p, n * 2);
    if (!q) return fail("realloc", n * 2);
    if (q[n - 1] != (char)i) return fail("realloc lost the contents", n * 2);
    free(q);
  }
  if (errno != 0) return fail("successful calls set errno", 0);
  size_t big = (size_t)256 << 20;   /* well inside the limit */
  char *p = malloc(big);
  if (!p) return fail("malloc", big);
  memset(p, 1, big);
  free(p);
  size_t too_big = (size_t)2 << 30;   /* over the limit */
  errno = 0;
  if (malloc(too_big) || errno != ENOMEM) return fail("malloc over the limit", too_big);
  int local;
  if (fm_owns(&local)) return fail("fm_owns(stack pointer)", 0);
  if (foreign_free_reported() || arenas_given_back() || exhaust_and_recover() || realloc_moves_tightly() ||
      realloc_grows_into_chunk_at_limit())
    return 1;
  puts("every request within the limit worked");
  return 0;
}
