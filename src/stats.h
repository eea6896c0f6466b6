/* What the heap holds, for mallinfo, mallinfo2, malloc_stats and malloc_info. Reading takes
 * each arena's lock in turn; nothing is counted on a fast path. */
#ifndef FM_STATS_H
#define FM_STATS_H

#include <malloc.h>
#include <stdio.h>

#include "config.h"

/* arena: every byte mapped; hblks, hblkhd: the mapped blocks and their mappings' bytes;
 * uordblks: the bytes of every block out, blocks in thread caches and in arenas' boxes
 * (handed over) included, and of those mappings; fordblks: the rest of what is mapped. */
struct mallinfo2 stats_mallinfo2(void);
void stats_print(void);                          /* malloc_stats */
int stats_print_xml(int options_given, FILE *stream);  /* malloc_info */

#endif
