/* A page block's length read without its arena's lock while another thread allocates and frees
 * the block after it: the length must never come out longer, or the block is cached and handed
 * out as a longer one. Usage: page_run_race [--seconds N] (run with FASTMALLOC_ARENAS=1). */
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
#define SMALL (5 * PAGE - 100)   /* p: 5 pages */
#define NEXT (11 * PAGE - 100)   /* the neighbour: the 11 pages after p, to the unit's end */
#define WHOLE (16 * PAGE - 100)  /* the length p reads as while the neighbour's bits change */

static atomic_int stop, ready, placed;
static char *p;
static atomic_ulong neighbour_ops;

/* Fills its cache's place for 11-page blocks with x for good, so that the neighbour's frees go
 * back to the arena; aligned_alloc takes the neighbour from the arena (it skips the cache). */
static void *neighbour(void *arg) {
  while (!atomic_load(&ready)) continue;
  char *y = malloc(NEXT), *x = malloc(NEXT);
  atomic_store(&placed, y == p + 5 * PAGE ? 1 : -1);
  free(x);
  free(y);
  while (!atomic_load(&stop)) {
    free(aligned_alloc(PAGE, NEXT));
    atomic_fetch_add(&neighbour_ops, 1);
  }
  return arg;
}

static uint64_t now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec;
}

int main(int argc, char **argv) {
  unsigned seconds = argc == 3 && !strcmp(argv[1], "--seconds") ? (unsigned)atoi(argv[2]) : 10;
  p = malloc(SMALL);
  pthread_t t;
  if (!p || pthread_create(&t, NULL, neighbour, NULL)) return 1;
  atomic_store(&ready, 1);
  while (!atomic_load(&placed)) usleep(1000);
  if (atomic_load(&placed) < 0) {
    /* The allocator placed the blocks otherwise: this test says nothing then. */
    printf("page_run_race: the neighbour is not right after p: skipped\n");
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    return 77;
  }
  /* p goes to this thread's cache and comes back, its length read on each free; when it comes
   * back as another block, the one p became is asked for at the length it may have read as. */
  unsigned long rounds = 0, moved = 0, failures = 0;
  for (uint64_t end = now_s() + seconds; now_s() < end;) {
    for (int k = 0; k < 100000; k++, rounds++) {
      free(p);
      char *again = malloc(SMALL);
      if (!again) return 1;
      if (again != p) {
        moved++;
        char *r = malloc(WHOLE);
        size_t usable = r ? malloc_usable_size(r) : 0;
        if (usable < WHOLE) {
          failures++;
          fprintf(stderr, "page_run_race: FAIL: malloc(%d) gave %p with %zu usable bytes "
                  "(the 5-page block %s)\n", WHOLE, (void *)r, usable,
                  r == p ? "freed while its neighbour changed" : "?");
        }
        free(r);
      }
      p = again;
    }
  }
  atomic_store(&stop, 1);
  pthread_join(t, NULL);
  free(p);
  printf("page_run_race: %lu frees of p, %lu neighbour allocations, p moved %lu times: %s\n",
         rounds, atomic_load(&neighbour_ops), moved, failures ? "FAIL" : "ok");
  return failures ? 1 : 0;
}
