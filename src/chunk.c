/* Chunks from the OS, split into spans of whole units, and the unit map that answers
 * "whose is this pointer, and of which class" in one load. No locking here: every
 * function runs under the lock of the arena that owns the chunk. */
#include "chunk.h"

#include <stdatomic.h>
#include <string.h>

#include "os.h"

#define FM_UNIT_MAP_BYTES ((size_t)1 << (FM_ADDRESS_BITS - FM_UNIT_SHIFT))
#define FM_UNIT_MAP_PAGES (FM_UNIT_MAP_BYTES / FM_PAGE_SIZE)
/* Under an address-space limit (ulimit -v) too small for the whole map, it covers this
 * much address space around its own mapping instead (a 16 MiB map): a process so limited
 * has all its mappings within a few GiB of each other. */
#define FM_UNIT_MAP_WINDOW_UNITS ((size_t)1 << (40 - FM_UNIT_SHIFT))

static const uint8_t fm_unit_map_boot[1];
const uint8_t *fm_unit_map = fm_unit_map_boot;
uintptr_t fm_mark;

/* The reservation behind fm_unit_map: it holds the entries of fm_unit_map_units units
 * from unit fm_unit_map_first (all of them unless the window had to do; none before
 * set-up, or when it failed). */
static uint8_t *map_start;
size_t fm_unit_map_first, fm_unit_map_units;

/* Which pages of the reservation have been made writable (one bit a page). */
static _Atomic uint64_t fm_unit_map_writable[FM_UNIT_MAP_PAGES / 64];

/* Where a windowed map goes when it can: far from everything the kernel places by itself
 * (the executable and brk near 0x55.. TiB, the mmap area and stacks just below
 * 0x7fff.. TiB). free() reads a foreign pointer's entry up to 2 GiB either side of the map
 * (the fast path does not check the window), so there it finds unmapped space and faults,
 * rather than a stray byte of another mapping that could pass for a size class. */
static const uintptr_t quiet_places[] = {0x200000000000, 0x300000000000, 0x100000000000};

/* Gives back a window at `at` and its zero page (see window_reserve_quiet). */
static void window_release(uint8_t *at, size_t first) {
  os_release_reserved(at, fm_unit_map_units);
  if (first >= FM_PAGE_SIZE) os_release_reserved(at - first, FM_PAGE_SIZE);
}

/* Reserves the map's window (fm_unit_map_units entries from unit `first`) at the first
 * quiet place free, with the read-only zero page where the fast path's indexing puts units
 * 0 .. 4095 (addresses below 256 MiB), so that free(NULL) reads "not ours" there (a window
 * from unit 0 holds those entries itself); NULL when no place is free. */
static uint8_t *window_reserve_quiet(size_t first) {
  for (unsigned i = 0; i < sizeof quiet_places / sizeof quiet_places[0]; i++) {
    uint8_t *at = (uint8_t *)quiet_places[i];
    if (!os_reserve_readonly_at(at, fm_unit_map_units)) continue;
    if (first < FM_PAGE_SIZE || os_reserve_readonly_at(at - first, FM_PAGE_SIZE)) return at;
    os_release_reserved(at, fm_unit_map_units);
  }
  return NULL;
}

/* The windowed map: the window centred where the kernel maps by itself (where the chunks
 * will be), the map in a quiet place; failing that, the map where the kernel put it, the
 * window moving by a page of units (256 MiB) at a time until the zero page's place is free. */
static bool unit_map_window(void) {
  fm_unit_map_units = FM_UNIT_MAP_WINDOW_UNITS;
  uint8_t *probe = os_reserve_readonly(fm_unit_map_units);
  if (!probe) return false;
  size_t centre = (uintptr_t)probe >> FM_UNIT_SHIFT;
  size_t first = centre > fm_unit_map_units / 2 ? centre - fm_unit_map_units / 2 : 0;
  if (first > FM_UNIT_MAP_BYTES - fm_unit_map_units)
    first = FM_UNIT_MAP_BYTES - fm_unit_map_units;
  first &= ~(size_t)(FM_PAGE_SIZE - 1);   /* so the zero page's place is page-aligned */
  map_start = window_reserve_quiet(first);
  if (map_start) {
    os_release_reserved(probe, fm_unit_map_units);
    fm_unit_map_first = first;
    return true;
  }
  map_start = probe;
  for (unsigned tries = 0; first >= FM_PAGE_SIZE; tries++, first -= FM_PAGE_SIZE) {
    if (tries == 64) {   /* set-up fails for good: the reservation can stay */
      map_start = NULL;
      return false;
    }
    if (os_reserve_readonly_at(map_start - first, FM_PAGE_SIZE)) break;
  }
  fm_unit_map_first = first;
  return true;
}

/* A window narrowed in place (map_start, fm_unit_map_first, fm_unit_map_units and the
 * writable bitmap already the window's) moves to a quiet place, as a windowed map set up
 * under a limit lies: the holes just given back around it are where new mappings, ours
 * among them, go, and a foreign pointer's entry would be read there. Its pages that hold
 * entries are copied; the old window and zero page go. Nothing changes when it cannot be
 * done. */
static void window_move_to_quiet_place(void) {
  uint8_t *at = window_reserve_quiet(fm_unit_map_first);
  if (!at) return;
  for (size_t page = 0; page < fm_unit_map_units / FM_PAGE_SIZE; page++) {
    uint64_t bits = atomic_load_explicit(&fm_unit_map_writable[page / 64], memory_order_relaxed);
    if (!(bits >> (page % 64) & 1)) continue;
    if (!os_make_writable(at + page * FM_PAGE_SIZE, FM_PAGE_SIZE)) {
      window_release(at, fm_unit_map_first);
      return;
    }
    memcpy(at + page * FM_PAGE_SIZE, map_start + page * FM_PAGE_SIZE, FM_PAGE_SIZE);
  }
  fm_unit_map = at - fm_unit_map_first;
  window_release(map_start, fm_unit_map_first);
  map_start = at;
}

bool fm_unit_map_init(void) {
  map_start = os_reserve_readonly(FM_UNIT_MAP_BYTES);
  if (map_start) {
    fm_unit_map_units = FM_UNIT_MAP_BYTES;
  } else if (!unit_map_window()) {
    fm_unit_map_units = 0;
    return false;
  }
  /* The fast path indexes fm_unit_map by unit number: a window's base lies before it. */
  fm_unit_map = (const uint8_t *)((uintptr_t)map_start - fm_unit_map_first);
  return true;
}

size_t fm_unit_map_narrow(void) {
  enum { WINDOW_PAGES = FM_UNIT_MAP_WINDOW_UNITS / FM_PAGE_SIZE };
  enum { ALL_WORDS = FM_UNIT_MAP_PAGES / 64, WINDOW_WORDS = WINDOW_PAGES / 64 };
  if (!map_start || fm_unit_map_units != FM_UNIT_MAP_BYTES || !os_address_space_limited())
    return 0;
  /* The pages holding entries: every mapping of ours. */
  size_t low = FM_UNIT_MAP_PAGES, high = 0;
  for (size_t w = 0; w < ALL_WORDS; w++) {
    uint64_t bits = atomic_load_explicit(&fm_unit_map_writable[w], memory_order_relaxed);
    if (!bits) continue;
    if (low == FM_UNIT_MAP_PAGES) low = w * 64 + (size_t)__builtin_ctzll(bits);
    high = w * 64 + 63 - (size_t)__builtin_clzll(bits);
  }
  if (low == FM_UNIT_MAP_PAGES) low = high = ((uintptr_t)map_start >> FM_UNIT_SHIFT) / FM_PAGE_SIZE;
  /* Centred on them, from a whole word of the writable bitmap. */
  size_t centre = (low + high) / 2;
  size_t first = centre > WINDOW_PAGES / 2 ? (centre - WINDOW_PAGES / 2) & ~(size_t)63 : 0;
  if (first > FM_UNIT_MAP_PAGES - WINDOW_PAGES) first = FM_UNIT_MAP_PAGES - WINDOW_PAGES;
  if (low < first || high >= first + WINDOW_PAGES) return 0;   /* spread too far */
  /* Page 0 stays: free(NULL) reads its entry. */
  size_t released = 0;
  if (first > 1) {
    os_release_reserved(map_start + FM_PAGE_SIZE, (first - 1) * FM_PAGE_SIZE);
    released += (first - 1) * FM_PAGE_SIZE;
  }
  size_t end = first + WINDOW_PAGES;
  if (end < FM_UNIT_MAP_PAGES) {
    os_release_reserved(map_start + end * FM_PAGE_SIZE, (FM_UNIT_MAP_PAGES - end) * FM_PAGE_SIZE);
    released += (FM_UNIT_MAP_PAGES - end) * FM_PAGE_SIZE;
  }
  for (size_t w = 0; w < ALL_WORDS; w++) {   /* the bitmap counts pages from the window's */
    uint64_t bits = 0;
    if (w < WINDOW_WORDS)
      bits = atomic_load_explicit(&fm_unit_map_writable[first / 64 + w], memory_order_relaxed);
    atomic_store_explicit(&fm_unit_map_writable[w], bits, memory_order_relaxed);
  }
  fm_unit_map_first = first * FM_PAGE_SIZE;
  map_start += fm_unit_map_first;
  fm_unit_map_units = FM_UNIT_MAP_WINDOW_UNITS;
  /* (The move takes as much address space as it gives back; when it cannot be made,
   * fm_unit_map stays: the entries keep their place.) */
  window_move_to_quiet_place();
  return released;
}

bool fm_unit_map_set(const void *start, size_t size, uint8_t cls) {
  if (!map_start) return false;   /* set-up failed: nothing is ours */
  size_t first = ((uintptr_t)start >> FM_UNIT_SHIFT) - fm_unit_map_first;
  size_t last = (((uintptr_t)start + size - 1) >> FM_UNIT_SHIFT) - fm_unit_map_first;
  if (first > last || last >= fm_unit_map_units) return false;   /* outside the window */
  for (size_t page = first / FM_PAGE_SIZE; page <= last / FM_PAGE_SIZE; page++) {
    uint64_t bit = (uint64_t)1 << (page % 64);
    if (atomic_load_explicit(&fm_unit_map_writable[page / 64], memory_order_acquire) & bit)
      continue;
    if (!os_make_writable(map_start + page * FM_PAGE_SIZE, FM_PAGE_SIZE)) return false;
    atomic_fetch_or_explicit(&fm_unit_map_writable[page / 64], bit, memory_order_release);
  }
  memset(map_start + first, cls, last - first + 1);
  return true;
}

fm_chunk *chunk_init(void *memory, struct fm_arena *arena) {
  fm_chunk *chunk = memory;
  /* Commit the unit-map page now so span set-up cannot fail later. */
  if (!fm_unit_map_set(chunk, FM_UNIT_SIZE, 0)) return NULL;
  chunk->arena = arena;
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

/* Lowest run of `units` set bits in mask, or -1. */
static int find_run(uint64_t mask, unsigned units) {
  uint64_t run = mask;
  for (unsigned i = 1; i < units && run; i++) run &= mask >> i;
  return run ? __builtin_ctzll(run) : -1;
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
 * the alignment its class promises, fm_size_class_aligned; none for strides of whole
 * pages). Spans start 64 KiB aligned and a refill hands out a span's lowest free blocks
 * first (arena_alloc_batch), so without it the blocks a program uses most, of every class,
 * would share the low bits of their addresses, by which the CPU's caches and its checks of
 * loads against earlier stores index them: churn took 1.10 x the time (30 interleaved
 * pairs). It costs a span at most 960 bytes of blocks (the exact-stride twins of the
 * 1-8 KiB classes: one block). */
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
  fm_unit_map_set((char *)chunk + (size_t)first * FM_UNIT_SIZE, (size_t)count * FM_UNIT_SIZE, (uint8_t)cls);
}

/* Units first .. first + count - 1 leave their span: free, and dirty unless purged. */
static void units_give_back(fm_chunk *chunk, unsigned first, unsigned count, bool purged) {
  uint64_t bits = unit_bits(first, count);
  fm_unit_map_set((char *)chunk + (size_t)first * FM_UNIT_SIZE, (size_t)count * FM_UNIT_SIZE, 0);
  chunk->free_units |= bits;
  if (!purged) chunk->dirty_units |= bits;
}

fm_span *chunk_take_span(fm_chunk *chunk, unsigned units, unsigned cls, bool resident_only) {
  /* Prefer units that are still resident: no page faults, no RSS growth. */
  int first = find_run(chunk->free_units & chunk->dirty_units, units);
  if (first < 0 && !resident_only) first = find_run(chunk->free_units, units);
  if (first < 0) return NULL;
  bool zeroed = !(unit_bits((unsigned)first, units) & chunk->dirty_units);
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
    span->free_pages = UINT16_MAX;
    span->run_starts = 0;
    span->clean_pages = zeroed ? UINT16_MAX : 0;
    span->touched_starts = 0;
    return span;
  }
  size_t block = fm_class_stride[cls] ? fm_class_stride[cls] : span_bytes(span);
  span_set_block_size(span, block);
  span->fresh = zeroed ? 0 : (uint16_t)span->capacity;
  if (cls <= FM_NUM_SPAN_CLASSES) span_set_all_free(span);
  return span;
}

void chunk_give_back_span(fm_span *span, bool purged) {
  fm_chunk *chunk = chunk_of(span);
  units_give_back(chunk, (unsigned)(span - chunk->spans), span->units, purged);
}

bool chunk_resize_large_span(fm_span *span, unsigned units) {
  fm_chunk *chunk = chunk_of(span);
  unsigned first = (unsigned)(span - chunk->spans);
  fm_assert(span->cls == FM_CLASS_SPAN_LARGE && units > 0);
  if (first + units > FM_UNITS_PER_CHUNK) return false;
  if (units > span->units) {
    uint64_t bits = unit_bits(first + span->units, units - span->units);
    if ((chunk->free_units & bits) != bits) return false;
    units_take(chunk, first, first + span->units, units - span->units, FM_CLASS_SPAN_LARGE);
  } else {
    units_give_back(chunk, first + units, span->units - units, false);
  }
  span->units = (uint8_t)units;
  span_set_block_size(span, span_bytes(span));
  return true;
}

size_t chunk_used_bytes(const fm_chunk *chunk) {
  size_t used = 0;
  for (unsigned unit = 1; unit < FM_UNITS_PER_CHUNK;) {
    if (chunk->free_units >> unit & 1) {
      unit++;
      continue;
    }
    const fm_span *span = &chunk->spans[unit];
    fm_assert(chunk->head_of[unit] == unit && span->units > 0);
    if (span->cls <= FM_NUM_SPAN_CLASSES) used += (size_t)span->used * fm_class_size[span->cls];
    else if (span->cls == FM_CLASS_PAGES) used += (size_t)span->used * FM_PAGE_SIZE;
    else if (span->used) used += span_bytes(span);   /* a large block: the whole span */
    unit += span->units;
  }
  return used;
}

size_t chunk_purge(fm_chunk *chunk, bool force) {
  size_t purged = 0;
  uint64_t dirty = chunk->dirty_units & chunk->free_units & (force ? ~(uint64_t)0 : chunk->stale_units);
  uint64_t refused = 0;   /* units whose pages the OS kept: still dirty */
  while (dirty) {
    unsigned first = (unsigned)__builtin_ctzll(dirty);
    unsigned len = (unsigned)__builtin_ctzll(~(dirty >> first));  /* run length */
    if (first + len > 64) len = 64 - first;
    if (os_purge((char *)chunk + (size_t)first * FM_UNIT_SIZE, (size_t)len * FM_UNIT_SIZE))
      purged += (size_t)len * FM_UNIT_SIZE;
    else
      refused |= unit_bits(first, len);
    dirty &= ~unit_bits(first, len);
  }
  chunk->dirty_units &= ~(force ? chunk->free_units : chunk->stale_units) | refused;
  chunk->stale_units = chunk->dirty_units & chunk->free_units;
  if (!force) chunk->sparse_ticks = chunk_mostly_free(chunk) ? (chunk->sparse_ticks ? 2 : 1) : 0;
  return purged;
}
