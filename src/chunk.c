/* Chunks from the OS, split into spans of whole units whose classes the unit map records.
 * No locking here: every function runs under the lock of the arena that owns the chunk. */
#include "chunk.h"

#include <stdatomic.h>
#include <string.h>

#include "os.h"

fm_chunk *chunk_init(void *memory, struct fm_arena *arena, uint32_t generation) {
  fm_chunk *chunk = memory;
  /* The unit map's leaf now, so span set-up cannot fail later. */
  if (!unit_map_prepare(chunk, FM_CHUNK_SIZE)) return NULL;
  chunk->arena = arena;
  chunk->generation = generation;
  chunk->free_units = FM_CHUNK_ALL_UNITS;
  chunk->dirty_units = 0;
  chunk->stale_units = 0;
  chunk->sparse_ticks = 0;
  return chunk;
}

void chunk_delete(fm_chunk *chunk) {
  fm_assert(chunk->free_units == FM_CHUNK_ALL_UNITS);
  os_unmap(chunk, FM_CHUNK_SIZE);
}

/* Bits first .. first + units - 1: those units of a chunk. */
static uint64_t unit_bits(unsigned first, unsigned units) {
  return (units == 64 ? ~(uint64_t)0 : (((uint64_t)1 << units) - 1)) << first;
}

/* Lowest run of `units` set bits in mask, or -1: from the bits, the starts of runs of 2,
 * 4 ... units, then of `units` (two runs of a power of two that overlap). */
static int find_run(uint64_t mask, unsigned units) {
  uint64_t starts = mask;
  unsigned run = 1;
  for (; run * 2 <= units && starts; run *= 2) starts &= starts >> run;
  if (run < units) starts &= starts >> (units - run);
  return starts ? __builtin_ctzll(starts) : -1;
}

/* Marks every block of a small-class span free. */
static void span_set_all_free(fm_span *span) {
  uint64_t *bits = span_free_bits(span);
  uint32_t full = span->capacity / 64, rest = span->capacity % 64;
  for (uint32_t w = 0; w < full; w++) bits[w] = ~(uint64_t)0;
  if (rest) bits[full] = ((uint64_t)1 << rest) - 1;
  span->scan = 0;
}

/* Where a span of small blocks puts its first block: 0-960 bytes in, by class (rounded up
 * to a multiple of the largest power of two that divides the stride, so every block keeps
 * the alignment its class promises, size_class_aligned; none for strides of whole
 * pages). Spans start 64 KiB aligned and a refill hands out a span's lowest free blocks
 * first (arena_alloc_batch), so without it the blocks a program uses most, of every class,
 * would share the low bits of their addresses, by which the CPU's caches and its checks of
 * loads against earlier stores index them. It costs a span at most 960 bytes of blocks (the
 * exact-stride twins of the 1-8 KiB classes: one block). */
static size_t span_color(unsigned cls, size_t stride) {
  size_t align = stride & (~stride + 1);
  if (cls > FM_NUM_SPAN_CLASSES || align >= FM_PAGE_SIZE) return 0;
  size_t color = (size_t)(cls * 5 % 16) * 64;
  return (color + align - 1) & ~(align - 1);
}

/* The span's stride, the blocks it holds after its colour, and the reciprocal that finds
 * a block's index. */
static void span_set_block_size(fm_span *span, size_t block) {
  size_t color = span_color(span->cls, block);
  span->start = span_base(span) + color;
  span->capacity = (uint32_t)((span_bytes(span) - color) / block);
  span->block_size = (uint32_t)block;
  /* offset / 16 < 2^15 and block / 16 <= 2^11: a 32-bit reciprocal is exact here. */
  span->index_magic = (uint32_t)((((uint64_t)1 << 31) + block / 16 - 1) / (block / 16));
}

/* Free units first .. first + count - 1 join the span of class cls whose first unit is
 * head; their unit-map entries follow. */
static void units_take(fm_chunk *chunk, unsigned head, unsigned first, unsigned count, unsigned cls) {
  uint64_t bits = unit_bits(first, count);
  chunk->free_units &= ~bits;
  chunk->dirty_units &= ~bits;
  chunk->stale_units &= ~bits;
  for (unsigned u = first; u < first + count; u++) chunk->head_of[u] = (uint8_t)head;
  unit_map_set((char *)chunk + (size_t)first * FM_UNIT_SIZE, (size_t)count * FM_UNIT_SIZE, (uint8_t)cls);
}

/* Units first .. first + count - 1 leave their span: free, and dirty unless purged. */
static void units_give_back(fm_chunk *chunk, unsigned first, unsigned count, bool purged) {
  uint64_t bits = unit_bits(first, count);
  unit_map_set((char *)chunk + (size_t)first * FM_UNIT_SIZE, (size_t)count * FM_UNIT_SIZE, 0);
  chunk->free_units |= bits;
  if (!purged) chunk->dirty_units |= bits;
}

fm_span *chunk_take_span(fm_chunk *chunk, unsigned units, unsigned cls, bool resident_only,
                         unsigned *clean) {
  /* Prefer units that are still resident: no page faults, no RSS growth. */
  int first = find_run(chunk->free_units & chunk->dirty_units, units);
  if (first < 0 && !resident_only) first = find_run(chunk->free_units, units);
  if (first < 0) return NULL;
  *clean = (unsigned)__builtin_popcountll(unit_bits((unsigned)first, units) & ~chunk->dirty_units);
  bool zeroed = *clean == units;
  units_take(chunk, (unsigned)first, (unsigned)first, units, cls);
  fm_span *span = &chunk->spans[first];
  span->units = (uint8_t)units;
  span->cls = (uint8_t)cls;
  span->arena = chunk->arena;
  span->listed = 0;
  span->used = 0;
  span->next = span->prev = NULL;
  span->start = (char *)chunk + (size_t)first * FM_UNIT_SIZE;
  if (cls == FM_CLASS_PAGES) {
    span->block_size = FM_PAGE_SIZE;
    page_layout_set(span, UINT16_MAX, 0);
    span->zeroed_pages = zeroed ? UINT16_MAX : 0;
    span->touched_starts = 0;
    return span;
  }
  size_t block = size_class_stride[cls] ? size_class_stride[cls] : span_bytes(span);
  span_set_block_size(span, block);
  span->zeroed_from = zeroed ? 0 : (uint16_t)span->capacity;
  span->issued = 0;
  if (cls <= FM_NUM_SPAN_CLASSES) span_set_all_free(span);
  return span;
}

void chunk_give_back_span(fm_span *span, bool purged) {
  fm_chunk *chunk = chunk_of(span);
  units_give_back(chunk, (unsigned)(span - chunk->spans), span->units, purged);
}

bool chunk_resize_span_block(fm_span *span, unsigned units) {
  fm_chunk *chunk = chunk_of(span);
  unsigned first = (unsigned)(span - chunk->spans);
  fm_assert(span->cls == FM_CLASS_SPAN_BLOCK && units > 0);
  if (first + units > FM_UNITS_PER_CHUNK) return false;
  if (units > span->units) {
    uint64_t bits = unit_bits(first + span->units, units - span->units);
    if ((chunk->free_units & bits) != bits) return false;
    units_take(chunk, first, first + span->units, units - span->units, FM_CLASS_SPAN_BLOCK);
  } else {
    units_give_back(chunk, first + units, span->units - units, false);
  }
  span->units = (uint8_t)units;
  span_set_block_size(span, span_bytes(span));
  return true;
}

unsigned chunk_dirty_free_units(const fm_chunk *chunk) {
  return (unsigned)__builtin_popcountll(chunk->free_units & chunk->dirty_units);
}

unsigned chunk_purge_highest(fm_chunk *chunk, unsigned most, bool *refused) {
  uint64_t dirty = chunk->free_units & chunk->dirty_units;
  unsigned purged = 0;
  while (dirty && purged < most) {
    unsigned end = 64 - (unsigned)__builtin_clzll(dirty);   /* past the highest run */
    unsigned len = (unsigned)__builtin_clzll(~(dirty << (64 - end)));   /* (unit 0 is never free) */
    if (len > most - purged) len = most - purged;
    uint64_t bits = unit_bits(end - len, len);
    if (!os_purge((char *)chunk + (size_t)(end - len) * FM_UNIT_SIZE, (size_t)len * FM_UNIT_SIZE)) {
      *refused = true;   /* the OS kept them: they stay dirty */
      break;
    }
    chunk->dirty_units &= ~bits;
    chunk->stale_units &= ~bits;
    purged += len;
    dirty &= ~bits;
  }
  return purged;
}

size_t chunk_purge(fm_chunk *chunk, bool force, unsigned *keep) {
  size_t purged = 0;
  uint64_t dirty = chunk->dirty_units & chunk->free_units & (force ? ~(uint64_t)0 : chunk->stale_units);
  uint64_t stay_dirty = 0;   /* units kept, or whose pages the OS refused to purge */
  for (; dirty && *keep; --*keep) {
    stay_dirty |= dirty & -dirty;
    dirty &= dirty - 1;
  }
  while (dirty) {
    unsigned first = (unsigned)__builtin_ctzll(dirty);
    unsigned len = (unsigned)__builtin_ctzll(~(dirty >> first));  /* run length */
    if (first + len > 64) len = 64 - first;
    if (os_purge((char *)chunk + (size_t)first * FM_UNIT_SIZE, (size_t)len * FM_UNIT_SIZE))
      purged += (size_t)len * FM_UNIT_SIZE;
    else
      stay_dirty |= unit_bits(first, len);
    dirty &= ~unit_bits(first, len);
  }
  chunk->dirty_units &= ~(force ? chunk->free_units : chunk->stale_units) | stay_dirty;
  chunk->stale_units = chunk->dirty_units & chunk->free_units;
  if (!force) chunk->sparse_ticks = chunk_mostly_free(chunk) ? (chunk->sparse_ticks ? 2 : 1) : 0;
  return purged;
}
