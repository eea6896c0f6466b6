/* Run-time settings, read once from the environment at set-up, without allocating:
 *   FASTMALLOC_PURGE_DELAY_MS  empty spans and cached mappings older than this go back to
 *                              the OS (default 100; 0: at the next slow path)
 *   FASTMALLOC_TCACHE_MAX      byte budget of one thread's cache (default 4M; K, M, G);
 *                              all threads' caches together grow past their small start by
 *                              at most FM_GROWN_BUDGETS times this, and past that
 *                              many threads each to its share of it
 *   FASTMALLOC_ARENAS          number of arenas (default: the CPUs the process may run on;
 *                              at most FM_ARENAS_MAX): fewer to cap the footprint of many
 *                              threads
 *   FASTMALLOC_STATS           1: statistics to stderr at exit (stats.c)
 *   FASTMALLOC_VERBOSE         1: the settings in force to stderr at set-up
 *   FASTMALLOC_PURGE_THREAD    1: a thread that runs the purge ticks (init.c)
 *   FASTMALLOC_HUGE_PAGES      0: never ask for transparent huge pages (default 1: big
 *                              blocks' mappings, past FM_HUGE_PAGES_FROM mapped)
 * A malformed value gets one warning line naming it and the default kept. */
#ifndef FM_OPTIONS_H
#define FM_OPTIONS_H

#include "config.h"

typedef struct options {
  uint64_t purge_delay_ns;
  size_t tcache_max_bytes;
  unsigned arenas;   /* 0: one per CPU */
  bool stats;
  bool verbose;
  bool purge_thread;
  bool huge_pages;
} options_t;

extern fm_hidden options_t options;

void options_init(void);
/* Prints the settings in force (FASTMALLOC_VERBOSE), the number of arenas included. */
void options_print(unsigned arena_count);

#endif
