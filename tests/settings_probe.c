/* Run with FASTMALLOC_PURGE_DELAY_MS=1000000 and FASTMALLOC_ARENAS=1 (ctest sets them): the
 * settings take effect. With one arena, two threads allocate from the same span. With a
 * purge delay of 1000 s, a heap that another thread built and freed stays resident through
 * 30 arena frees 20 ms apart (with the default 100 ms it goes within a few:
 * test_freed_heap_purged_at_few_arena_frees); and freed large mappings, kept that long,
 * still stay within the large-block cache's 64 MiB. Exit 0 on success. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fastmalloc.h"

#define MIB ((size_t)1 << 20)

static size_t rss(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long size = 0, resident = 0;
  if (f) {
    if (fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
    fclose(f);
  }
  return resident * (size_t)sysconf(_SC_PAGESIZE);
}

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
  size_t rss0 = rss();
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
  size_t rss1 = rss();
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
  puts("the purge delay and the large-block cache's bound took effect");
  return 0;
}
