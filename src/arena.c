/* Arenas: span lists per size class, batch refill and flush, blocks of 8-64 KiB as runs of
 * pages in page spans, large blocks carved from chunk spans, and the purge that returns
 * empty spans to the OS after a delay.
 * Every entry point takes the arena lock itself (skipped while single-threaded). */
#include "arena.h"

#include <string.h>

#include "large.h"
#include "options.h"

fm_arena fm_arenas[FM_MAX_ARENAS];
unsigned fm_arena_count = 1;

static uint8_t span_units[FM_NUM_SPAN_CLASSES + 1];  /* span length per class */
static uint8_t longest_in_byte[256];   /* the longest run of set bits in each byte value */

#define FM_SPAN_LARGE_MAX_UNITS 16   /* large blocks up to 1 MiB come from chunk spans */
#define FM_SPAN_MAX_UNITS 8          /* the longest span of a size class */
#define FM_EMPTY_CHUNKS_KEPT 2        /* empty chunks an arena keeps mapped between ticks */

void arena_init_all(void) {
  unsigned wanted = fm_options.arenas ? fm_options.arenas : os_cpu_count();
  fm_arena_count = wanted < FM_MAX_ARENAS ? wanted : FM_MAX_ARENAS;
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
    size_t size = fm_class_stride[cls];
    unsigned units = 1;
    /* The fewest units that waste at most 1/16 of the span; one for strides over 4 KiB
     * (7 to 15 blocks a span), so each of those classes holds few free blocks in its
     * partly used span: a program that keeps a few of them live touches less (the unused
     * tail of a span is never touched). */
    unsigned most = size > 4096 ? 1 : FM_SPAN_MAX_UNITS;
    while (units < most && (units * FM_UNIT_SIZE % size) * 16 > units * FM_UNIT_SIZE) units++;
    span_units[cls] = (uint8_t)units;
  }
  for (unsigned byte = 1; byte < 256; byte++) {
    unsigned n = 0;
    for (unsigned bits = byte; bits; n++) bits &= bits >> 1;
    longest_in_byte[byte] = (uint8_t)n;
  }
}

/* The lists of spans and of chunks, doubly linked through their next and prev fields. */
#define LIST_PUSH(list, node)                 \
  do {                                        \
    (node)->prev = NULL;                      \
    (node)->next = *(list);                   \
    if (*(list)) (*(list))->prev = (node);    \
    *(list) = (node);                         \
  } while (0)

/* Inserts node where the list, kept in address order, has room for it. */
#define LIST_INSERT_BY_ADDRESS(list, node)                    \
  do {                                                        \
    __typeof__(node) *link_ = (list), before_ = NULL;         \
    while (*link_ && *link_ < (node)) {                       \
      before_ = *link_;                                       \
      link_ = &before_->next;                                 \
    }                                                         \
    (node)->prev = before_;                                   \
    (node)->next = *link_;                                    \
    if (*link_) (*link_)->prev = (node);                      \
    *link_ = (node);                                          \
  } while (0)

#define LIST_REMOVE(list, node)                              \
  do {                                                       \
    if ((node)->prev) (node)->prev->next = (node)->next;     \
    else *(list) = (node)->next;                             \
    if ((node)->next) (node)->next->prev = (node)->prev;     \
    (node)->next = (node)->prev = NULL;                      \
  } while (0)

/* Whether p lies in a chunk its arena abandoned in a fork child (arena_abandon): frees
 * there are dropped, since the chunk's spans may have been cut off mid-update. */
static bool in_abandoned_chunk(const fm_arena *arena, const void *p) {
  return fm_unlikely(chunk_of(p)->generation != arena->generation);
}

/* The partial lists: spans with a free block; `listed` says whether a span is on one. */
static void partial_push(fm_arena *arena, fm_span *span) {
  LIST_PUSH(&arena->partial[span->cls], span);
  span->listed = 1;
}

static void partial_remove(fm_arena *arena, fm_span *span) {
  LIST_REMOVE(&arena->partial[span->cls], span);
  span->listed = 0;
}

/* The empty spans an arena keeps a while, per class, in address order: pushed in the
 * purge epoch they emptied in, so a purge tick can tell how long they have waited. */
static void kept_push(fm_arena *arena, fm_span *span) {
  span->empty_since = (uint32_t)arena->purge_epoch;
  LIST_INSERT_BY_ADDRESS(&arena->empty[span->cls], span);
  arena->empty_count[span->cls]++;
}

static void kept_remove(fm_arena *arena, fm_span *span) {
  LIST_REMOVE(&arena->empty[span->cls], span);
  arena->empty_count[span->cls]--;
}

/* The lowest kept span of class cls and `units` units; NULL when there is none. */
static fm_span *kept_lowest(fm_arena *arena, unsigned cls, unsigned units) {
  fm_span *span = arena->empty[cls];
  while (span && span->units != units) span = span->next;
  return span;
}

/* Moves a chunk whose units were taken or given back to the list it now belongs on: a
 * chunk without a free unit waits on the full list, so searches never walk the (many)
 * full chunks of a big heap. The others are in address order: new spans take the lowest
 * room, so a heap that shrank gathers in its lowest chunks and the rest drain. */
static void arena_relist_chunk(fm_arena *arena, fm_chunk *chunk, bool was_full) {
  bool full = !chunk->free_units;
  if (full == was_full) return;
  if (full) {
    LIST_REMOVE(&arena->chunks, chunk);
    LIST_PUSH(&arena->full_chunks, chunk);
    chunk->sparse_ticks = 0;   /* (the full list's chunks see no tick) */
  } else {
    LIST_REMOVE(&arena->full_chunks, chunk);
    LIST_INSERT_BY_ADDRESS(&arena->chunks, chunk);
  }
}

/* A span of `units` units from chunk, which goes to the full list if it has no free unit
 * left; NULL when it has no room. */
static fm_span *arena_take_span_in(fm_arena *arena, fm_chunk *chunk, unsigned units, unsigned cls,
                                   bool resident_only) {
  fm_span *span = chunk_take_span(chunk, units, cls, resident_only);
  if (span) arena_relist_chunk(arena, chunk, false);
  return span;
}

/* A span of `units` units from the lowest chunk with room. */
static fm_span *arena_find_span(fm_arena *arena, unsigned units, unsigned cls, bool resident_only) {
  for (fm_chunk *chunk = arena->chunks; chunk; chunk = chunk->next) {
    fm_span *span = arena_take_span_in(arena, chunk, units, cls, resident_only);
    if (span) return span;
  }
  return NULL;
}

static void arena_give_back_span(fm_arena *arena, fm_span *span, bool purged) {
  fm_chunk *chunk = chunk_of(span);
  bool was_full = !chunk->free_units;
  chunk_give_back_span(span, purged);
  arena_relist_chunk(arena, chunk, was_full);
}

/* Gives one kept span back to its chunk, still resident, so a new span can take its
 * memory: the lowest of at least `units` units if any, else the lowest; false when none
 * is kept. Empty page spans (page_spans) or those of the other classes. */
static bool arena_drop_kept_span(fm_arena *arena, unsigned units, bool page_spans) {
  for (unsigned need = units;; need = 1) {
    fm_span *lowest = NULL;
    for (unsigned c = 1; c <= FM_CLASS_PAGES; c++) {
      if ((c == FM_CLASS_PAGES) != page_spans) continue;
      fm_span *span = arena->empty[c];
      while (span && span->units < need) span = span->next;
      if (span && (!lowest || span < lowest)) lowest = span;
    }
    if (lowest) {
      kept_remove(arena, lowest);
      arena_give_back_span(arena, lowest, false);
      return true;
    }
    if (need == 1) return false;
  }
}

/* Chunks are mapped several at a time, as many as the arena has already (at most
 * FM_CHUNK_BATCH): mmap and the munmaps that align it take the kernel's mapping lock, which
 * stalls every thread's page faults, while a small heap holds no address space ahead of
 * its needs (a program may lower its own RLIMIT_AS). */
#define FM_CHUNK_BATCH 8

/* Unmaps the chunks the arena mapped ahead and has not used; returns their bytes. */
static size_t arena_drop_reserve(fm_arena *arena) {
  size_t bytes = (size_t)(arena->reserve_end - arena->reserve);
  if (bytes) os_unmap(arena->reserve, bytes);
  arena->reserve = arena->reserve_end = NULL;
  return bytes;
}

static fm_chunk *arena_new_chunk(fm_arena *arena) {
  if (arena->reserve == arena->reserve_end) {
    size_t count = arena->chunk_count < 1 ? 1 : arena->chunk_count;
    if (count > FM_CHUNK_BATCH) count = FM_CHUNK_BATCH;
    char *batch = os_map_aligned(count * FM_CHUNK_SIZE, FM_CHUNK_SIZE);
    if (!batch) {
      batch = os_map_aligned(FM_CHUNK_SIZE, FM_CHUNK_SIZE);   /* tight on address space */
      count = 1;
    }
    if (!batch) return NULL;
    arena->reserve = batch;
    arena->reserve_end = batch + count * FM_CHUNK_SIZE;
  }
  fm_chunk *chunk = chunk_init(arena->reserve, arena, arena->generation);
  if (!chunk) {   /* no unit-map leaf for it: out of memory */
    arena_drop_reserve(arena);
    return NULL;
  }
  arena->reserve += FM_CHUNK_SIZE;
  arena->chunk_count++;
  return chunk;
}

/* Memory already resident first, so the heap grows its RSS only when it must: free units
 * still resident, then the empty spans other classes keep, one at a time, then untouched
 * or purged units, then empty page spans, then a new chunk. (Empty page spans wait for
 * page blocks: so a page block freed twice finds its page free, not a block of another
 * class.) */
static fm_span *arena_take_span(fm_arena *arena, unsigned units, unsigned cls) {
  fm_span *span = arena_find_span(arena, units, cls, true);
  while (!span && arena_drop_kept_span(arena, units, false))
    span = arena_find_span(arena, units, cls, true);
  if (!span) span = arena_find_span(arena, units, cls, false);
  while (!span && arena_drop_kept_span(arena, units, true))
    span = arena_find_span(arena, units, cls, false);
  if (span) return span;
  fm_chunk *chunk = arena_new_chunk(arena);
  if (!chunk) return NULL;
  LIST_INSERT_BY_ADDRESS(&arena->chunks, chunk);
  return arena_find_span(arena, units, cls, false);
}

/* Whether a kept span should leave its chunk for a lower one with room: only from a chunk
 * that has been mostly free for a whole purge delay. So a heap that shrank gathers in its
 * lowest chunks while its spans cycle, and the others drain; a heap freed and built
 * again at once (or in use) keeps its resident spans. */
static bool kept_span_moves_down(fm_arena *arena, fm_span *kept) {
  fm_chunk *chunk = chunk_of(kept), *lowest = arena->chunks;
  return lowest && lowest < chunk && chunk->sparse_ticks == 2 && chunk_mostly_free(chunk);
}

/* A span of class cls and `units` units: a kept one, unless it moves down (then one from
 * the lowest chunk with room, and the kept one waits for its purge), else a new one. */
static fm_span *arena_reuse_or_take_span(fm_arena *arena, unsigned cls, unsigned units) {
  fm_span *kept = kept_lowest(arena, cls, units), *span = NULL;
  if (kept && kept_span_moves_down(arena, kept))
    span = arena_take_span_in(arena, arena->chunks, units, cls, false);
  if (span) return span;
  if (!kept) return arena_take_span(arena, units, cls);
  kept_remove(arena, kept);
  return kept;
}

static fm_span *arena_new_span(fm_arena *arena, unsigned cls) {
  fm_span *span = arena_reuse_or_take_span(arena, cls, span_units[cls]);
  if (!span) return NULL;
  span->scan = 0;   /* (a kept span's bits are all set: it is empty) */
  partial_push(arena, span);
  return span;
}

/* Tags the blocks of blocks[0 .. n) (taken from one span, highest first) that lie below
 * `issued`, the end of those handed out before in the span's life (see arena.h). */
static void tag_recycled(void **blocks, uint32_t n, char *issued) {
  for (uint32_t i = n; i-- > 0 && (char *)blocks[i] < issued;)
    blocks[i] = (char *)blocks[i] + FM_BLOCK_RECYCLED;
}

unsigned arena_alloc_batch(fm_arena *arena, unsigned cls, unsigned want, void **out, bool *zeroed) {
  bool threaded = fm_threaded();
  fm_lock(&arena->lock, threaded);
  size_t size = fm_class_stride[cls];   /* distance between blocks */
  unsigned got = 0;
  if (zeroed) *zeroed = false;
  while (got < want) {
    fm_span *span = arena->partial[cls];
    if (!span && !(span = arena_new_span(arena, cls))) break;
    /* Free blocks in address order, from the lowest bitmap word that has one. */
    uint64_t *bits = span_free_bits(span);
    uint32_t words = (span->capacity + 63) / 64, w = span->scan;
    if (zeroed && !got) {
      while (!bits[w]) w++;   /* (a listed span has a free block; the scan starts there) */
      if (w * 64 + (uint32_t)__builtin_ctzll(bits[w]) >= span->fresh) {
        *zeroed = true;
        want = 1;
      }
    }
    /* out[] fills downward from out[want - got - 1]: the lowest block ends on top */
    void **next = out + (want - got);
    /* base: the block of bit 0 of word w, a local as the stores to out[] might alias
     * span->start; 32-bit offsets within a word, which need no sign extension */
    char *base = span->start + (size_t)w * 64 * size;
    for (; w < words; w++, base += 64 * size) {
      uint64_t word = bits[w];
      while (word && next > out) {
        *--next = base + (uint32_t)__builtin_ctzll(word) * (uint32_t)size;
        word &= word - 1;
      }
      bits[w] = word;
      if (next == out) break;
    }
    uint32_t taken = (uint32_t)(out + (want - got) - next);
    span->scan = (uint16_t)w;
    fm_assert(taken > 0);   /* a listed span has a free block */
    /* (the last block taken is the furthest one) */
    uint32_t last = (uint32_t)((char *)next[0] - span->start) / (uint32_t)size;
    if (last >= span->fresh) span->fresh = (uint16_t)(last + 1);
    tag_recycled(next, taken, span->start + (size_t)span->issued * size);
    if (last >= span->issued) span->issued = (uint16_t)(last + 1);
    got += taken;
    span->used += taken;
    if (span->used == span->capacity) partial_remove(arena, span);
  }
  fm_unlock(&arena->lock, threaded);
  if (got < want) memmove(out, out + (want - got), got * sizeof(void *));
  return got;
}

/* Under the lock, from paths that free: every purge delay, a tick purges what stayed
 * empty for a whole tick. Each call reads the (coarse, vDSO) clock, about 3 ns: a program
 * that reaches its arena seldom still sees its memory go back on time. The same tick
 * visits the arenas that nobody frees into any more (a finished thread's), unless busy. */
static void arena_tick(fm_arena *arena, uint64_t now) {
  arena->next_purge_ns = now + fm_options.purge_delay_ns;
  /* (threads' idle sweeps read it without the lock) */
  __atomic_store_n(&arena->purge_epoch, arena->purge_epoch + 1, __ATOMIC_RELAXED);
  arena_purge(arena, FM_PURGE_STALE);
}

/* True when a tick ran. */
static bool arena_purge_tick(fm_arena *arena) {
  uint64_t now = os_now_ns();
  if (now < arena->next_purge_ns) return false;
  arena_tick(arena, now);
  bool threaded = fm_threaded();
  for (unsigned i = 0; i < fm_arena_count; i++) {
    fm_arena *idle = &fm_arenas[i];
    if (idle == arena || now < idle->next_purge_ns + fm_options.purge_delay_ns) continue;
    if (!fm_trylock(&idle->lock, threaded)) continue;
    arena_tick(idle, now);
    fm_unlock(&idle->lock, threaded);
  }
  return true;
}

/* Ends a call that freed into the arena: the purge tick when one is due, the unlock, and
 * after a tick the expiry of freed large mappings, outside the lock (munmap waits for the
 * kernel's mapping lock). */
static void arena_unlock_after_free(fm_arena *arena, bool threaded) {
  bool ticked = arena_purge_tick(arena);
  fm_unlock(&arena->lock, threaded);
  if (ticked) large_expire(false);
}

/* An empty span stays with its class for a purge tick (up to 4 MiB a size class, 16 spans
 * of large blocks or of pages), so a class whose spans keep emptying and refilling does
 * not churn through its chunk; then it is purged at once, having aged already. When the
 * class keeps its most, the highest of them and this one goes back to its chunk. (A page
 * span leaves its list first.) */
static void arena_span_emptied(fm_arena *arena, fm_span *span) {
  unsigned cls = span->cls;
  if (span->listed) partial_remove(arena, span);
  bool keep = cls > FM_NUM_SPAN_CLASSES
                  ? arena->empty_count[cls] < 16
                  : (size_t)arena->empty_count[cls] * span_bytes(span) < ((size_t)4 << 20);
  if (!keep) {
    fm_span *highest = arena->empty[cls];
    while (highest && highest->next) highest = highest->next;
    if (!highest || highest < span) {
      arena_give_back_span(arena, span, false);
      return;
    }
    kept_remove(arena, highest);
    arena_give_back_span(arena, highest, false);
  }
  kept_push(arena, span);
}

/* Whether a block starts at offset in a span of `size`-byte blocks (magic: the span's
 * index_magic), and its index in *index; the caller checks that offset lies below the
 * span's last block. */
static fm_always_inline bool block_at(size_t offset, uint32_t magic, size_t size,
                                      uint32_t *index) {
  *index = (uint32_t)(((offset >> 4) * magic) >> 31);
  return *index * size == offset;   /* which also proves offset a multiple of 16 */
}

/* The bytes of a span that its blocks take: its unused tail lies beyond. */
static size_t span_blocks_len(const fm_span *span) { return (size_t)span->capacity * span->block_size; }

/* Whether p starts a block of span, a small-class one, and its index in *index. */
static bool span_block_at(const fm_span *span, const void *p, uint32_t *index) {
  size_t offset = (size_t)((const char *)p - span->start);
  return span->cls <= FM_NUM_SPAN_CLASSES && offset < span_blocks_len(span) &&
         block_at(offset, span->index_magic, span->block_size, index);
}

/* Index of block p in its small-class span, or a fatal report if p is not a block. */
static uint32_t span_block_index(const fm_span *span, const void *p) {
  uint32_t index;
  if (fm_unlikely(!span_block_at(span, p, &index))) os_fatal("free(): invalid pointer", p);
  return index;
}

/* Sets bit `bit` of *word and says whether it was set already: one bts, where C would
 * build the mask, test and or it (this runs once for every block a cache gives back). */
static fm_always_inline bool bit_test_and_set(uint64_t *word, uint32_t bit) {
  bool was_set;
  __asm__("btsq %q2, %0" : "+r"(*word), "=@ccc"(was_set) : "r"(bit));
  return was_set;
}

#define NO_WORD UINT32_MAX   /* no bitmap word loaded yet */

/* Puts the bitmap word a flush keeps in a register back, if it loaded one. */
static fm_always_inline void word_store(uint64_t *bits, uint32_t word_index, uint64_t word) {
  if (word_index != NO_WORD) bits[word_index] = word;
}

/* Ends a flush's visit to span: an emptied span goes to the kept spans. */
static void span_flush_done(fm_arena *arena, fm_span *span) {
  if (span && span->used == 0) arena_span_emptied(arena, span);
}

/* The span of a block a thread cache gives back. The cache took the block on the unit
 * map's word alone, and a bad pointer (an interior one, or a block freed twice) may no
 * longer lie in a span by now, its chunk even unmapped: reported before anything is read. */
static fm_span *cached_block_span(void *p) {
  unsigned cls = unit_map_class(p);
  if (fm_unlikely(cls == 0 || cls > FM_NUM_SPAN_CLASSES)) os_fatal("free(): invalid pointer", p);
  return span_of(p);
}

/* One pass per owning arena, under its lock: the blocks of other arenas move to the front
 * of the array and wait for a later pass. A block in the span of the block before it (a
 * cache gives back runs of neighbours) costs a range check, its index and its bit; only a
 * block elsewhere looks its span up. A pointer into a span's unused tail is looked up
 * again, and reported. */
void arena_free_blocks(void **blocks, size_t n) {
  bool threaded = fm_threaded();
  while (n) {
    fm_arena *arena = cached_block_span(blocks[0])->arena;
    size_t pending = 0;
    /* The current span's fields the loop reads, and the bitmap word the last block fell
     * in, in locals, so in registers: most blocks a cache gives back share a word with the
     * one before, and then neither load nor store it. The word is stored when a block
     * falls in another, and when the span changes. A change of span is common (a tree's
     * nodes freed in key order fall in a span each): it costs the lookup and little more. */
    fm_span *span = NULL;
    char *start = NULL;
    size_t len = 0, size = 0;
    uint32_t magic = 0, word_index = NO_WORD;
    uint64_t *bits = NULL, word = 0;
    fm_lock(&arena->lock, threaded);
    for (size_t i = 0; i < n; i++) {
      void *p = blocks[i];
      size_t offset = (uintptr_t)p - (uintptr_t)start;   /* any p, before the first span */
      if (offset >= len) {
        fm_span *next = cached_block_span(p);
        if (next->arena != arena) {
          blocks[pending++] = p;
          continue;
        }
        if (in_abandoned_chunk(arena, p)) continue;
        word_store(bits, word_index, word);
        span_flush_done(arena, span);
        span = next;
        if (!span->listed) partial_push(arena, span);
        start = span->start;
        len = span_blocks_len(span);
        size = span->block_size;
        magic = span->index_magic;
        bits = span_free_bits(span);
        word_index = NO_WORD;
        offset = (size_t)((char *)p - start);
        if (fm_unlikely(offset >= len)) os_fatal("free(): invalid pointer", p);
      }
      uint32_t index;
      if (fm_unlikely(!block_at(offset, magic, size, &index))) os_fatal("free(): invalid pointer", p);
      if (index / 64 != word_index) {
        word_store(bits, word_index, word);
        word_index = index / 64;
        word = bits[word_index];
        if (word_index < span->scan) span->scan = (uint16_t)word_index;
      }
      if (fm_unlikely(bit_test_and_set(&word, index))) os_fatal("free(): double free detected", p);
      span->used--;
    }
    word_store(bits, word_index, word);
    span_flush_done(arena, span);
    arena_unlock_after_free(arena, threaded);
    n = pending;
  }
}

void *arena_alloc_span_large(fm_arena *arena, size_t size, bool *zeroed) {
  *zeroed = false;
  size_t units = (size + FM_UNIT_SIZE - 1) >> FM_UNIT_SHIFT;
  if (units > FM_SPAN_LARGE_MAX_UNITS) return NULL;
  bool threaded = fm_threaded();
  fm_lock(&arena->lock, threaded);
  fm_span *span = arena_reuse_or_take_span(arena, FM_CLASS_SPAN_LARGE, (unsigned)units);
  if (span) {
    *zeroed = span->fresh == 0;   /* (never so for a kept span: it held a block) */
    span->fresh = 1;
    span->used = 1;
  }
  fm_unlock(&arena->lock, threaded);
  return span ? span->start : NULL;
}

bool arena_resize_span_large(void *p, size_t size) {
  size_t units = (size + FM_UNIT_SIZE - 1) >> FM_UNIT_SHIFT;
  if (units > FM_SPAN_LARGE_MAX_UNITS) return false;
  fm_span *span = span_of(p);
  fm_arena *arena = span->arena;
  fm_chunk *chunk = chunk_of(span);
  bool threaded = fm_threaded();
  fm_lock(&arena->lock, threaded);
  fm_assert(p == span->start && span->used == 1 && span->cls == FM_CLASS_SPAN_LARGE);
  bool was_full = !chunk->free_units;
  bool resized = !in_abandoned_chunk(arena, p) && chunk_resize_large_span(span, (unsigned)units);
  if (resized) arena_relist_chunk(arena, chunk, was_full);
  fm_unlock(&arena->lock, threaded);
  return resized;
}

void arena_free_span_large(void *p) {
  fm_span *span = span_of(p);
  fm_arena *arena = span->arena;
  bool threaded = fm_threaded();
  fm_lock(&arena->lock, threaded);
  if (in_abandoned_chunk(arena, p)) return fm_unlock(&arena->lock, threaded);
  if (fm_unlikely(p != span->start || span->used != 1 || span->cls != FM_CLASS_SPAN_LARGE))
    os_fatal(p == span->start && span->used == 0 && span->cls == FM_CLASS_SPAN_LARGE
                 ? "free(): double free detected"   /* a kept span: the block's second free */
                 : "free(): invalid pointer",
             p);
  span->used = 0;
  arena_span_emptied(arena, span);
  arena_unlock_after_free(arena, threaded);
}

/* ---- page spans: blocks of 8-64 KiB as runs of whole pages ----
 * With a size class per span, each class up to 32 KiB kept its own partly used spans, and
 * a block of 32-64 KiB had a unit to itself, all of whose pages stayed resident once any
 * block there had touched them: medium (128 blocks of 8-64 KiB replaced at random) peaked
 * at 9.4 MiB where glibc's best fit of chunks peaks at 7.3. In a page span, blocks of any
 * length share the unit's 16 pages, and a malloc takes the lowest free run that holds it
 * in a span whose longest free run is the shortest that does: 8.2 MiB (8.7 with the
 * thread's cache of page blocks, see tcache.h). Yet blocks then start on any page, and a
 * program that writes only the start of its blocks reached a new page with nearly each
 * one (many-threads: 13.2 MiB, where a unit a block touched one page: 10.5). So a malloc
 * prefers a page that began a block before, in the first span of any list that holds it:
 * 11.8-12.1 MiB, medium unchanged. */

/* Bits first .. first + pages - 1 of a page span's masks. */
static uint32_t page_bits(unsigned first, unsigned pages) { return ((1u << pages) - 1) << first; }

/* The longest run of set bits in a page span's 16-bit mask: in its low byte, in its high
 * byte, or across the two (the low byte's top bits and the high byte's bottom ones). */
static unsigned longest_run(uint32_t mask) {
  uint32_t low = mask & 0xff, high = mask >> 8;
  unsigned across = (unsigned)__builtin_clz(~(low << 24)) + (unsigned)__builtin_ctz(~high);
  unsigned in_low = longest_in_byte[low], in_high = longest_in_byte[high];
  unsigned within = in_low > in_high ? in_low : in_high;
  return across > within ? across : within;
}

/* The pages where a block of `pages` pages may start among a page span's free pages, on
 * a page of align_starts (every page, or every 2nd ... 16th for an aligned block). */
static uint32_t page_fit_starts(const fm_span *span, unsigned pages, uint32_t align_starts) {
  /* from the free pages, the starts of free runs of 2, 4 ... pages, then of `pages` */
  uint32_t starts = span->free_pages;
  unsigned run = 1;
  for (; run * 2 <= pages; run *= 2) starts &= starts >> run;
  if (run < pages) starts &= starts >> (pages - run);
  return starts & align_starts;
}

/* Takes a page span off its list. */
static fm_always_inline void page_span_unlist(fm_arena *arena, fm_span *span) {
  unsigned runs = span->listed;
  if (!runs) return;
  LIST_REMOVE(&arena->page_spans[runs], span);
  if (!arena->page_spans[runs]) arena->page_span_runs &= ~(1u << runs);
  span->listed = 0;
}

/* Moves a page span whose free pages changed to the list of its longest free run: none
 * when it has no free page; an empty one goes to the kept spans. */
static void page_span_relist(fm_arena *arena, fm_span *span) {
  fm_assert(!(span->free_pages & span->run_starts) && !(span->clean_pages & ~span->free_pages));
  fm_assert(span->used + (unsigned)__builtin_popcount(span->free_pages) == FM_PAGES_PER_UNIT);
  unsigned longest = longest_run(span->free_pages);
  if (longest == span->listed) return;
  page_span_unlist(arena, span);
  if (longest == 0) return;
  if (longest == FM_PAGES_PER_UNIT) return arena_span_emptied(arena, span);
  LIST_PUSH(&arena->page_spans[longest], span);
  arena->page_span_runs |= 1u << longest;
  span->listed = (uint8_t)longest;
}

void *arena_alloc_pages(fm_arena *arena, size_t size, size_t align, bool *zeroed) {
  unsigned pages = size ? (unsigned)((size + FM_PAGE_SIZE - 1) / FM_PAGE_SIZE) : 1;
  unsigned align_pages = align > FM_PAGE_SIZE ? (unsigned)(align / FM_PAGE_SIZE) : 1;
  fm_assert(pages >= 1 && pages <= FM_PAGES_PER_UNIT && align_pages <= FM_PAGES_PER_UNIT);
  bool threaded = fm_threaded();
  fm_lock(&arena->lock, threaded);
  /* Where the block goes: the lowest page that began a block before, in the first span
   * of a list that holds it (an aligned block: the first span that does), the shortest
   * list first; else the lowest page in that span of the shortest list; else an empty
   * span. */
  uint32_t runs = arena->page_span_runs >> pages << pages;   /* lists of runs long enough */
  uint32_t align_starts = align_pages == 1 ? 0xffffu : 0xffffu / ((1u << align_pages) - 1);
  fm_span *span = NULL;
  uint32_t starts = 0;
  for (; runs; runs &= runs - 1) {
    fm_span *listed = arena->page_spans[__builtin_ctz(runs)];
    uint32_t fits = 0;
    while (listed && !(fits = page_fit_starts(listed, pages, align_starts))) listed = listed->next;
    if (!listed) continue;
    bool touched = fits & listed->touched_starts;
    if (touched || !span) {
      span = listed;
      starts = fits;
    }
    if (touched) break;
  }
  int first = 0;   /* (an empty span's run from page 0 has any alignment up to the unit) */
  if (span) {
    uint32_t resident = starts & span->touched_starts;
    first = __builtin_ctz(resident ? resident : starts);
  } else {
    span = arena_reuse_or_take_span(arena, FM_CLASS_PAGES, 1);
  }
  void *p = NULL;
  if (span) {
    uint32_t bits = page_bits((unsigned)first, pages);
    *zeroed = (span->clean_pages & bits) == bits;
    span->clean_pages &= (uint16_t)~bits;
    page_layout_set(span, span->free_pages & ~bits, span->run_starts | 1u << first);
    span->touched_starts |= (uint16_t)(1u << first);
    span->used += pages;
    page_span_relist(arena, span);
    p = span->start + (size_t)first * FM_PAGE_SIZE;
  }
  fm_unlock(&arena->lock, threaded);
  return p;
}

void arena_free_pages(void *p) {
  fm_span *span = span_of(p);
  fm_arena *arena = span->arena;
  bool threaded = fm_threaded();
  fm_lock(&arena->lock, threaded);
  if (in_abandoned_chunk(arena, p)) return fm_unlock(&arena->lock, threaded);
  unsigned first = page_index(p);
  if (fm_unlikely(!page_block_at(span, p)))
    os_fatal(span->cls == FM_CLASS_PAGES && !((uintptr_t)p & (FM_PAGE_SIZE - 1)) &&
                     (span->free_pages >> first & 1)
                 ? "free(): double free detected"
                 : "free(): invalid pointer",
             p);
  unsigned pages = page_run_length(span, first);
  page_layout_set(span, span->free_pages | page_bits(first, pages),
                  span->run_starts & ~(1u << first));
  span->used -= pages;
  page_span_relist(arena, span);
  /* A purge tick reads the clock: every 16th of these frees looks whether one is due. */
  if (++arena->page_frees % 16) fm_unlock(&arena->lock, threaded);
  else arena_unlock_after_free(arena, threaded);
}

bool arena_resize_pages(void *p, size_t size) {
  unsigned pages = (unsigned)((size + FM_PAGE_SIZE - 1) / FM_PAGE_SIZE);
  fm_span *span = span_of(p);
  fm_arena *arena = span->arena;
  bool threaded = fm_threaded();
  fm_lock(&arena->lock, threaded);
  fm_assert(page_block_at(span, p) && pages >= 1 && pages <= FM_PAGES_PER_UNIT);
  unsigned first = page_index(p), old = page_run_length(span, first);
  bool resized = true;
  if (in_abandoned_chunk(arena, p)) {
    resized = false;
  } else if (pages < old) {
    page_layout_set(span, span->free_pages | page_bits(first + pages, old - pages), span->run_starts);
    span->used -= old - pages;
  } else if (pages > old) {
    uint32_t more = first + pages <= FM_PAGES_PER_UNIT ? page_bits(first + old, pages - old) : 0;
    resized = more && (span->free_pages & more) == more;
    if (resized) {
      page_layout_set(span, span->free_pages & ~more, span->run_starts);
      span->clean_pages &= (uint16_t)~more;
      span->used += pages - old;
    }
  }
  if (pages != old && resized) page_span_relist(arena, span);
  fm_unlock(&arena->lock, threaded);
  return resized;
}

/* Purges the free pages of a partly used page span that may be resident; returns their
 * bytes. */
static size_t page_span_purge_free(fm_span *span) {
  size_t released = 0;
  uint32_t dirty = (uint32_t)(span->free_pages & ~span->clean_pages);
  while (dirty) {
    unsigned first = (unsigned)__builtin_ctz(dirty);
    unsigned len = (unsigned)__builtin_ctz(~(dirty >> first));
    uint32_t bits = page_bits(first, len);
    if (os_purge(span->start + (size_t)first * FM_PAGE_SIZE, (size_t)len * FM_PAGE_SIZE)) {
      span->clean_pages |= (uint16_t)bits;
      span->touched_starts &= (uint16_t)~bits;
      released += (size_t)len * FM_PAGE_SIZE;
    }
    dirty &= ~bits;
  }
  return released;
}

size_t arena_block_usable_size(const void *p, unsigned cls) {
  const fm_span *span = span_of(p);
  uint32_t index;
  if (cls == FM_CLASS_SPAN_LARGE)
    return span->cls == FM_CLASS_SPAN_LARGE && p == span->start && span->used ? span_bytes(span) : 0;
  if (cls == FM_CLASS_PAGES) {
    fm_arena *arena = span->arena;
    bool threaded = fm_threaded();
    fm_lock(&arena->lock, threaded);   /* (other blocks of the span change its masks) */
    size_t usable = FM_PAGE_SIZE * page_block_pages(p);
    fm_unlock(&arena->lock, threaded);
    return usable;
  }
  if (span->cls != cls) return 0;
  return span_block_at(span, p, &index) ? fm_class_size[cls] : 0;
}

bool arena_block_is_free(void *p) {
  fm_span *span = span_of(p);
  fm_arena *arena = span->arena;
  bool threaded = fm_threaded();
  fm_lock(&arena->lock, threaded);
  uint32_t index = span_block_index(span, p);
  bool is_free = !in_abandoned_chunk(arena, p) &&
                 (span_free_bits(span)[index / 64] >> (index % 64) & 1);
  fm_unlock(&arena->lock, threaded);
  return is_free;
}

/* True when blocks first..last (inclusive) of the span are all free. */
static bool blocks_all_free(const uint64_t *bits, uint32_t first, uint32_t last) {
  for (uint32_t i = first; i <= last;) {
    uint32_t w = i / 64, lo = i % 64, hi = (last / 64 == w) ? last % 64 : 63;
    uint64_t mask = (hi == 63 ? ~(uint64_t)0 : (((uint64_t)1 << (hi + 1)) - 1)) & (~(uint64_t)0 << lo);
    if ((bits[w] & mask) != mask) return false;
    i = w * 64 + hi + 1;
  }
  return true;
}

/* Purges the pages of a partly used span that hold only free blocks; returns the bytes
 * of those that were resident, so a second trim with nothing new to give back says so. */
static size_t span_purge_free_pages(fm_span *span) {
  size_t size = span->block_size, released = 0;
  char *base = span_base(span);
  size_t color = (size_t)(span->start - base);   /* no block lies below it */
  const uint64_t *bits = span_free_bits(span);
  size_t pages = (color + span_blocks_len(span)) / FM_PAGE_SIZE, run = 0, run_resident = 0;
  unsigned char resident[FM_SPAN_MAX_UNITS * FM_UNIT_SIZE / FM_PAGE_SIZE];
  if (!os_resident_pages(base, pages * FM_PAGE_SIZE, resident)) memset(resident, 1, pages);
  for (size_t page = 0; page <= pages; page++) {
    bool purgeable = false;
    if (page < pages) {
      /* the blocks' bytes on this page, from the span's start (a colour is under 4 KiB) */
      size_t end = (page + 1) * FM_PAGE_SIZE - color, from = page * FM_PAGE_SIZE;
      from = from > color ? from - color : 0;
      purgeable = blocks_all_free(bits, (uint32_t)(from / size), (uint32_t)((end - 1) / size));
    }
    if (purgeable) {
      run++;
      run_resident += resident[page] & 1;
    } else if (run) {
      if (run_resident) os_purge(base + (page - run) * FM_PAGE_SIZE, run * FM_PAGE_SIZE);
      released += run_resident * FM_PAGE_SIZE;
      run = run_resident = 0;
    }
  }
  return released;
}

size_t arena_purge(fm_arena *arena, fm_purge how) {
  bool all = how != FM_PURGE_STALE, pages = how != FM_UNMAP_EMPTY;
  size_t released = 0;
  for (unsigned cls = 1; cls <= FM_CLASS_PAGES; cls++) {
    for (fm_span *span = arena->empty[cls], *next; span; span = next) {
      next = span->next;
      if (all || (uint32_t)(arena->purge_epoch - span->empty_since) >= 2) {
        kept_remove(arena, span);
        bool purged = pages && os_purge(span_base(span), span_bytes(span));
        if (purged) released += span_bytes(span);
        arena_give_back_span(arena, span, purged);
      }
    }
    if (how == FM_PURGE_ALL && cls <= FM_NUM_SPAN_CLASSES)
      for (fm_span *partial = arena->partial[cls]; partial; partial = partial->next)
        released += span_purge_free_pages(partial);
  }
  if (how == FM_PURGE_ALL)
    for (unsigned runs = 1; runs < FM_PAGES_PER_UNIT; runs++)
      for (fm_span *span = arena->page_spans[runs]; span; span = span->next)
        released += page_span_purge_free(span);
  unsigned empty_kept = 0;
  bool shrank = false;   /* a tick unmapped an empty chunk */
  for (fm_chunk *chunk = arena->chunks, *next; chunk; chunk = next) {
    next = chunk->next;
    /* Trim and the retry unmap every empty chunk. A tick unmaps those beyond a small
     * reserve once purged, so the address space of a heap that shrank goes back too,
     * while a heap that breathes keeps a few: munmap and mmap hold the kernel's mapping
     * lock against every page fault of every thread, and a purged chunk costs no RSS. */
    bool empty = chunk->free_units == FM_CHUNK_ALL_UNITS;
    if (empty && (all || (!chunk->dirty_units && empty_kept++ >= FM_EMPTY_CHUNKS_KEPT))) {
      LIST_REMOVE(&arena->chunks, chunk);
      unit_map_set(chunk, FM_UNIT_SIZE, 0);
      chunk_delete(chunk);
      arena->chunk_count--;
      released += FM_CHUNK_SIZE;
      shrank |= !all;
      continue;
    }
    if (pages) released += chunk_purge(chunk, all);
  }
  /* The chunks mapped ahead go too when a tick found the heap shrunk, which needs none
   * of them, and when out of address space: an arena can hold seven unused (28 MiB),
   * which kept a shrunk heap's mapped bytes well above what its spans pin (1000-byte
   * rounds after a 153 MB heap was freed: 50.8 MB mapped, 25.6 MB without them). Trim
   * leaves them: trimming programs would map them again at their next allocation. */
  if (shrank || how == FM_UNMAP_EMPTY) released += arena_drop_reserve(arena);
  return released;
}

static size_t chunks_used_bytes(const fm_chunk *list) {
  size_t used = 0;
  for (const fm_chunk *chunk = list; chunk; chunk = chunk->next) used += chunk_used_bytes(chunk);
  return used;
}

size_t arena_used_bytes(void) {
  bool threaded = fm_threaded();
  size_t used = 0;
  for (unsigned i = 0; i < fm_arena_count; i++) {
    fm_arena *arena = &fm_arenas[i];
    fm_lock(&arena->lock, threaded);
    used += chunks_used_bytes(arena->chunks) + chunks_used_bytes(arena->full_chunks);
    fm_unlock(&arena->lock, threaded);
  }
  return used;
}

void arena_lock_all_for_fork(void) {
  for (unsigned i = 0; i < fm_arena_count; i++) fm_lock_for_fork(&fm_arenas[i].lock);
}

void arena_unlock_all_after_fork(void) {
  for (unsigned i = fm_arena_count; i-- > 0;) fm_lock_after_fork_parent(&fm_arenas[i].lock);
}

/* An arena whose lists a fork cut off mid-update starts again empty, in a new generation:
 * its chunks stay mapped, and the blocks the program holds there stay valid, but they are
 * never handed out again, and frees into them are dropped (in_abandoned_chunk). */
static void arena_abandon(fm_arena *arena) {
  fm_arena fresh = {.generation = arena->generation + 1,
                    .next_purge_ns = arena->next_purge_ns,
                    .purge_epoch = arena->purge_epoch};
  *arena = fresh;
}

void arena_after_fork_child(void) {
  for (unsigned i = 0; i < fm_arena_count; i++)
    if (fm_lock_after_fork_child(&fm_arenas[i].lock)) arena_abandon(&fm_arenas[i]);
}
