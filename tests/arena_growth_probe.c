/* When one arena grows, the memory another arena's threads freed goes back: a thread on one
 * arena fills and frees 64 MiB of span blocks and ends, then the main thread, on another
 * arena, allocates 64 MiB of its own. With a purge delay far longer than the probe, only
 * the growth purges the first arena's freed pages, down to its slack (8 MiB): the RSS stays
 * near one heap's, not two. Run with FASTMALLOC_ARENAS=2 and FASTMALLOC_PURGE_DELAY_MS=60000.
 * Exit 0 on success, 1 on failure; 2 when the heap or the RSS cannot be had. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe_rss.h"

enum { BLOCKS = 128, BLOCK_SIZE = 512 << 10, MIB = 1 << 20 };
static void *blocks[BLOCKS];
static uintptr_t other_blocks[BLOCKS];   /* where the thread's blocks were */

/* Allocates the blocks and writes every byte; false when out of memory. */
static int fill(unsigned char value) {
  for (int i = 0; i < BLOCKS; i++) {
    if (!(blocks[i] = malloc(BLOCK_SIZE))) return 0;
    memset(blocks[i], value, BLOCK_SIZE);
  }
  return 1;
}

static void free_all(void) {
  for (int i = 0; i < BLOCKS; i++) free(blocks[i]);
}

static void *other_arena_heap(void *ok) {
  *(int *)ok = fill(0x5a);
  for (int i = 0; i < BLOCKS; i++) other_blocks[i] = (uintptr_t)blocks[i];
  if (*(int *)ok) free_all();
  return NULL;
}

int main(void) {
  free(malloc(16));   /* the main thread takes its arena first; the thread gets the other */
  size_t rss_start = probe_rss();
  int ok = 0;
  pthread_t thread;
  if (pthread_create(&thread, NULL, other_arena_heap, &ok) || pthread_join(thread, NULL)) return 2;
  size_t rss_freed = probe_rss();
  if (!ok || !fill(0xa5)) return 2;
  size_t rss_grown = probe_rss();
  bool same_arena = false;   /* then this heap reused the thread's: nothing to measure */
  for (int i = 0; i < BLOCKS; i++)
    for (int j = 0; j < BLOCKS; j++)
      same_arena |= (uintptr_t)blocks[i] < other_blocks[j] + BLOCK_SIZE &&
                    other_blocks[j] < (uintptr_t)blocks[i] + BLOCK_SIZE;
  free_all();
  if (!rss_start || !rss_grown) return 2;
  printf("arena growth: rss %zu KiB at start, %zu with the other arena's 64 MiB freed, %zu "
         "with this arena's 64 MiB\n",
         rss_start >> 10, rss_freed >> 10, rss_grown >> 10);
  if (same_arena) {
    printf("this thread's blocks took the other thread's places: one arena, nothing measured\n");
    return 2;
  }
  if (rss_freed < rss_start + 48 * (size_t)MIB) {
    printf("the freed heap was purged before this arena grew: the probe measures nothing\n");
    return 2;
  }
  /* One heap, the other arena's slack, the kept span blocks, and room for noise. */
  size_t bound = rss_start + (64 + 8 + 1 + 8) * (size_t)MIB;
  if (rss_grown > bound) {
    printf("FAIL: rss %zu KiB, more than %zu: the other arena kept its freed pages\n",
           rss_grown >> 10, bound >> 10);
    return 1;
  }
  return 0;
}
