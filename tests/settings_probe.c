/* Run with FASTMALLOC_PURGE_DELAY_MS=1000000 and FASTMALLOC_ARENAS=1 (ctest sets them): the
 * settings take effect. With one arena, two threads allocate from the same span. With a
 * purge delay of 1000 s, a heap that another thread built and freed stays resident through
 * 30 arena frees 20 ms apart (with the default 100 ms it goes within a few:
 * test_freed_heap_purged_at_few_arena_frees); and freed large mappings, kept that long,
 * still stay within the large-block cache's 64 MiB. Then the bins' arrays of threads: the
 * pages a thread's grown bins took go back at its exit (nothing else is purged meanwhile);
 * with one arena (so threads map no chunks of their own), finished threads' arrays are
 * pooled, at most 256 of them, and unmapped by malloc_trim. Exit 0 on success. */
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fastmalloc.h"
#include "probe_rss.h"

#define MIB ((size_t)1 << 20)

enum { HEAP_BLOCKS = 40000, HEAP_BLOCK = 1000 };
static void *heap[HEAP_BLOCKS];

static void *build_and_free_heap(void *arg) {
  for (int i = 0; i < HEAP_BLOCKS; i++) {
    if (!(heap[i] = malloc(HEAP_BLOCK))) return NULL;
    memset(heap[i], 1, HEAP_BLOCK);
  }
  for (int i = 0; i < HEAP_BLOCKS; i++) free(heap[i]);
  return arg;
}

static void *malloc_64(void *out) {
  *(void **)out = malloc(64);
  return NULL;
}

static pthread_barrier_t all_started;

/* A thread whose cache (so its bins' array) is set up while all the others' are. */
static void *cache_then_wait(void *arg) {
  free(malloc(64));
  pthread_barrier_wait(&all_started);
  return arg;
}

/* Runs n threads of cache_then_wait at once; returns fm_mapped_bytes() after they ended. */
static size_t mapped_after_threads(unsigned n) {
  static pthread_t threads[300];
  pthread_attr_t attr;
  if (n > 300 || pthread_attr_init(&attr) || pthread_attr_setstacksize(&attr, 64 << 10) ||
      pthread_barrier_init(&all_started, NULL, n))
    return 0;
  unsigned started = 0;
  while (started < n && pthread_create(&threads[started], &attr, cache_then_wait, NULL) == 0) started++;
  if (started < n) {
    printf("FAIL: %u of %u threads started\n", started, n);
    exit(1);
  }
  for (unsigned i = 0; i < n; i++) pthread_join(threads[i], NULL);
  pthread_barrier_destroy(&all_started);
  pthread_attr_destroy(&attr);
  return fm_mapped_bytes();
}

static pthread_barrier_t grown_and_measured;

/* Grows the thread's bins for every class up to 1 KiB (each bin doubles at a miss, within
 * the thread's byte budget), then waits while main measures. */
static void *grow_bins_then_wait(void *arg) {
  static void *blocks[2048];
  for (size_t size = 16; size <= 1024; size += 16)
    for (int round = 0; round < 12; round++) {
      for (int i = 0; i < 2048; i++)
        if (!(blocks[i] = malloc(size))) return NULL;
      for (int i = 0; i < 2048; i++) free(blocks[i]);
    }
  pthread_barrier_wait(&grown_and_measured);
  pthread_barrier_wait(&grown_and_measured);
  return arg;
}

/* The pages a thread's grown bins took in its bins' array go back when it ends (with a
 * purge delay of 1000 s, nothing else is purged meanwhile). */
static int check_grown_bins_given_back(void) {
  pthread_t t;
  static int grown;
  void *done = NULL;
  if (pthread_barrier_init(&grown_and_measured, NULL, 2) ||
      pthread_create(&t, NULL, grow_bins_then_wait, &grown))
    return 1;
  pthread_barrier_wait(&grown_and_measured);
  size_t alive = probe_rss();
  pthread_barrier_wait(&grown_and_measured);
  if (pthread_join(t, &done) || !done) return 1;
  size_t ended = probe_rss();
  if (ended + 128 * 1024 > alive) {
    printf("FAIL: RSS %zu after a thread with grown bins ended, %zu while it lived: its bins' "
           "array kept its pages\n", ended, alive);
    return 1;
  }
  return 0;
}

static int check_bins_array_pool(void) {
  void *keeper = malloc(64);   /* keeps the arena's chunk mapped through the trims */
  if (!keeper) return 1;
  malloc_trim(0);
  size_t before = fm_mapped_bytes(), eight = mapped_after_threads(8);
  if (eight < before + 8 * 4096) {
    printf("FAIL: %zu bytes mapped after 8 threads ended (%zu before): their bins' arrays are not "
           "pooled\n", eight, before);
    return 1;
  }
  size_t array = (eight - before) / 8;
  malloc_trim(0);
  size_t trimmed = fm_mapped_bytes();
  if (trimmed > before) {
    printf("FAIL: %zu bytes mapped after malloc_trim (%zu before the threads): the pooled bins' "
           "arrays stayed\n", trimmed, before);
    return 1;
  }
  size_t many = mapped_after_threads(300);
  if (many > before + 256 * array || many < before + 200 * array) {
    printf("FAIL: %zu bytes mapped after 300 threads ended (%zu before, an array is %zu): the pool "
           "does not keep 256\n", many, before, array);
    return 1;
  }
  free(keeper);
  return 0;
}

int main(void) {
  const char *delay = getenv("FASTMALLOC_PURGE_DELAY_MS");
  if (!delay || strcmp(delay, "1000000") != 0) {
    puts("FAIL: run with FASTMALLOC_PURGE_DELAY_MS=1000000 FASTMALLOC_ARENAS=1");
    return 1;
  }
  /* One arena: another thread's first block comes from the same span as main's (a span
   * holds hundreds of 64-byte blocks), so from the same 4 MiB chunk. */
  void *mine = malloc(64), *theirs = NULL;
  pthread_t other;
  if (!mine || pthread_create(&other, NULL, malloc_64, &theirs) != 0 || pthread_join(other, NULL) != 0 ||
      !theirs) {
    puts("FAIL: the 64-byte blocks");
    return 1;
  }
  if ((uintptr_t)mine >> 22 != (uintptr_t)theirs >> 22) {
    printf("FAIL: with one arena, two threads' blocks %p and %p lie in different chunks\n", mine, theirs);
    return 1;
  }
  free(mine);
  free(theirs);
  size_t rss0 = probe_rss();
  static int built;
  pthread_t t;
  void *done = NULL;
  if (pthread_create(&t, NULL, build_and_free_heap, &built) != 0 || pthread_join(t, &done) != 0 ||
      !done) {
    puts("FAIL: the heap thread");
    return 1;
  }
  for (int i = 0; i < 30; i++) {
    usleep(20 * 1000);
    void *p = malloc(100 << 10);   /* a chunk span's block: each free reaches the arena */
    if (!p) return 1;
    free(p);
  }
  size_t rss1 = probe_rss();
  if (rss1 < rss0 + 20 * MIB) {
    printf("FAIL: RSS %zu 600 ms after freeing a 40 MB heap (%zu before): purged before the delay\n",
           rss1, rss0);
    return 1;
  }
  size_t mapped0 = fm_mapped_bytes();
  void *big[8];
  for (int i = 0; i < 8; i++)
    if (!(big[i] = malloc(20 * MIB))) return 1;
  for (int i = 0; i < 8; i++) free(big[i]);
  size_t mapped1 = fm_mapped_bytes();
  if (mapped1 > mapped0 + 68 * MIB) {
    printf("FAIL: %zu bytes mapped after freeing 8 x 20 MiB (%zu before): over the cache's 64 MiB\n",
           mapped1, mapped0);
    return 1;
  }
  if (check_grown_bins_given_back() || check_bins_array_pool()) return 1;
  puts("the purge delay, the large-block cache's bound and the bins' array pool took effect");
  return 0;
}
