/* The process: set-up on the first call (before or without constructors), the fork
 * handlers, and the calls that give held memory back (malloc_trim, the retry out of
 * memory). A thread's first slow path calls init_process: the one call that goes up the
 * layers (tcache.c), since set-up must happen at first use. */
#ifndef FM_INIT_H
#define FM_INIT_H

#include "config.h"

/* Sets the process up once; true when ready. A failure is final: malloc answers ENOMEM. */
bool init_process(void);
/* Flushes the calling thread's cache and purges every arena: malloc_trim(0). Returns the
 * bytes given back. */
size_t init_trim(void);
/* Out of memory: flushes the calling thread's cache and unmaps every empty chunk, chunk
 * mapped ahead, cached mapping and pooled bins' array, purging nothing (so it stays cheap
 * when memory stays short); true when something was unmapped, so one more try may work. */
bool init_release_for_retry(void);

#endif
