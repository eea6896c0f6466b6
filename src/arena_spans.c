/* Span blocks: blocks of 64 KiB to FM_SPAN_BLOCK_UNITS_MAX units, each a whole span of
 * units of a chunk, resized in place into the units that follow. */
#include "arena_internal.h"

void *arena_alloc_span_block(fm_arena *arena, size_t size, bool *zeroed) {
  *zeroed = false;
  size_t units = (size + FM_UNIT_SIZE - 1) >> FM_UNIT_SHIFT;
  if (units > FM_SPAN_BLOCK_UNITS_MAX) return NULL;
  bool threaded = lock_threaded();
  lock_take(&arena->lock, threaded);
  fm_span *span = arena_reuse_or_take_span(arena, FM_CLASS_SPAN_BLOCK, (unsigned)units);
  if (span) {
    *zeroed = span->zeroed_from == 0;   /* (never so for a kept span: it held a block) */
    span->zeroed_from = 1;
    span->used = 1;
    arena->counters.span_blocks_taken++;
  }
  lock_release(&arena->lock, threaded);
  return span ? span->start : NULL;
}

bool arena_resize_span_block(void *p, size_t size) {
  size_t units = (size + FM_UNIT_SIZE - 1) >> FM_UNIT_SHIFT;
  if (units > FM_SPAN_BLOCK_UNITS_MAX) return false;
  fm_span *span = span_of(p);
  fm_arena *arena = span->arena;
  fm_chunk *chunk = chunk_of(span);
  bool threaded = lock_threaded();
  lock_take(&arena->lock, threaded);
  fm_assert(p == span->start && span->used == 1 && span->cls == FM_CLASS_SPAN_BLOCK);
  bool was_full = !chunk->free_units;
  unsigned before = chunk_dirty_free_units(chunk);
  bool resized = !in_abandoned_chunk(arena, p) && chunk_resize_span_block(span, (unsigned)units);
  if (resized) {
    arena_count_dirty(arena, before, chunk_dirty_free_units(chunk));
    arena_relist_chunk(arena, chunk, was_full);
  }
  lock_release(&arena->lock, threaded);
  return resized;
}

void arena_free_span_block(void *p) {
  fm_span *span = span_of(p);
  fm_arena *arena = span->arena;
  bool threaded = lock_threaded();
  lock_take(&arena->lock, threaded);
  if (in_abandoned_chunk(arena, p)) return lock_release(&arena->lock, threaded);
  if (fm_unlikely(p != span->start || span->used != 1 || span->cls != FM_CLASS_SPAN_BLOCK))
    diag_fatal(p == span->start && span->used == 0 && span->cls == FM_CLASS_SPAN_BLOCK
                   ? DIAG_DOUBLE_FREE   /* a kept span: the block's second free */
                   : DIAG_INVALID_FREE,
             p);
  span->used = 0;
  arena_span_emptied(arena, span);
  arena_unlock_after_free(arena, threaded);
}

size_t arena_span_block_usable_size(const void *p) {
  const fm_span *span = span_of(p);
  return span->cls == FM_CLASS_SPAN_BLOCK && p == span->start && span->used ? span_bytes(span) : 0;
}
