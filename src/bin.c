/* The slow-path checks of bin.h's double-free protocol. */
#include "bin.h"

#include <string.h>

#include "arena.h"

const uintptr_t bin_sentinel[2];

/* A block whose mark does not name its slot: freed twice, or written into while free. */
void bin_mark_mismatch(void *p) { diag_fatal(DIAG_FREE_BLOCK_CORRUPTED, p); }

#define NO_UNIT UINTPTR_MAX   /* no block's unit: none checked yet */

/* Block p of bin cls in `slot`: it lies in a span of the bin's class (the cache took it
 * on the unit map's word, and a bad pointer's span may be gone by now: reported before
 * anything is read), and its mark names the slot. *unit: the unit last found in a span
 * of the class; a bin's blocks come in runs of neighbours, and a block in the same unit
 * needs no lookup (the map has one entry a unit; a block's two words lie in one unit). */
static fm_always_inline void block_check(void *p, void **slot, unsigned cls, uintptr_t *unit) {
  uintptr_t u = (uintptr_t)p >> FM_UNIT_SHIFT;
  if (u != *unit) {
    if (fm_unlikely(unit_map_class(p) != cls)) diag_fatal(DIAG_INVALID_FREE, p);
    *unit = u;
  }
  if (fm_unlikely(!mark_matches(p, slot))) bin_mark_mismatch(p);
}

void bin_blocks_leave(void **from, size_t n, unsigned cls) {
  if (!FM_FREE_MARK) return;   /* (arena_free_blocks checks the pointers themselves) */
  const void *freed = (const void *)FM_FREED_MARK;   /* (once: a mark's store might alias it) */
  uintptr_t unit = NO_UNIT;
  for (void **slot = from, **end = from + n; slot < end; slot++) {
    void *p = *slot;
    block_check(p, slot, cls, &unit);
    mark_set(p, freed);
  }
}

void bin_blocks_move(void **from, void **to, size_t n, unsigned cls) {
  if (!FM_FREE_MARK) {
    memmove(to, from, n * sizeof(void *));
    return;
  }
  uintptr_t unit = NO_UNIT;
  for (size_t k = 0; k < n; k++) {
    size_t i = to > from ? n - 1 - k : k;
    void *p = from[i];
    block_check(p, &from[i], cls, &unit);
    to[i] = p;
    mark_set(p, &to[i]);
  }
}

void bin_popped_check(void *p, void **slot) {
  if (!mark_matches(p, slot)) bin_mark_mismatch(p);
}
