/* Run-time options, read once from the environment at start-up without allocating.
 *   FASTMALLOC_PURGE_DELAY_MS  empty spans and cached large blocks older than this go back
 *                              to the OS (default 100; 0 purges at the next slow path)
 *   FASTMALLOC_TCACHE_MAX      byte budget of one thread's cache (default 4M; K/M suffix);
 *                              all threads' caches together grow past their small start
 *                              by at most 8 times this
 *   FASTMALLOC_ARENAS          number of arenas (default: the CPUs the process may run on;
 *                              at most 64): fewer to cap the footprint of many threads */
#ifndef FM_OPTIONS_H
#define FM_OPTIONS_H

#include "config.h"

typedef struct options {
  uint64_t purge_delay_ns;
  size_t tcache_max_bytes;
  unsigned arenas;   /* 0: one per CPU */
} options_t;

extern fm_hidden options_t options;

void options_init(void);

#endif
