/* Small blocks, of the size classes: spans of one class each, whose free blocks are bits
 * in their chunk's header, handed to thread caches and taken back in batches. */
#include "arena_internal.h"
#include "bin.h"

#include <string.h>

static uint8_t span_units[FM_NUM_SPAN_CLASSES + 1];  /* span length per class */
static uint8_t box_room[FM_NUM_SPAN_CLASSES + 1];    /* handed-over blocks a box holds */

/* The fewest units (at most FM_SPAN_UNITS_MAX) that waste at most 1/16 of the span; one
 * for strides over 4 KiB (5 to 15 blocks a span), so each of those classes holds few free
 * blocks in its partly used span: a program that keeps a few of them live touches less (the
 * unused tail of a span is never touched). */
void arena_small_init(void) {
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
    size_t size = size_class_stride[cls];
    unsigned units = 1;
    unsigned most = size > 4096 ? 1 : FM_SPAN_UNITS_MAX;
    while (units < most && (units * FM_UNIT_SIZE % size) * 16 > units * FM_UNIT_SIZE) units++;
    span_units[cls] = (uint8_t)units;
    size_t room = FM_HANDED_OVER_BOX_BYTES / size;
    box_room[cls] = (uint8_t)(room < 1 ? 1 : room > FM_HANDED_OVER_BOX ? FM_HANDED_OVER_BOX : room);
  }
}

static fm_span *arena_new_span(fm_arena *arena, unsigned cls) {
  fm_span *span = arena_reuse_or_take_span(arena, cls, span_units[cls]);
  if (!span) return NULL;
  span->scan = 0;   /* (a kept span's bits are all set: it is empty) */
  partial_push(arena, span);
  return span;
}

static unsigned handed_over_take_locked(fm_arena *arena, unsigned cls, void **out, unsigned room);

/* Tags the blocks of blocks[0 .. n) (taken from one span, highest first) that lie at or
 * above `issued`, the end of those handed out before in the span's life (see arena.h).
 * Once a heap stops growing none does: the loop ends at the first block. */
static void tag_fresh(void **blocks, uint32_t n, char *issued) {
  for (uint32_t i = 0; i < n && (char *)blocks[i] >= issued; i++)
    blocks[i] = (char *)blocks[i] + FM_BLOCK_FRESH;
}

unsigned arena_alloc_batch(fm_arena *arena, unsigned cls, unsigned want, unsigned room, void **out,
                           bool *zeroed, bool *took_span) {
  bool threaded = lock_threaded();
  lock_take(&arena->lock, threaded);
  unsigned handed = handed_over_take_locked(arena, cls, out, room);
  arena->counters.refills++;
  arena->counters.blocks_refilled += handed;
  arena->counters.blocks_flushed += handed;
  arena->counters.blocks_handed_over += handed;
  uint64_t spans_taken = arena->counters.spans_taken;
  size_t size = size_class_stride[cls];   /* distance between blocks */
  unsigned got = 0;
  if (zeroed) *zeroed = false;
  out += handed;   /* the rest from the spans, above those */
  want = handed < want ? want - handed : 0;
  while (got < want) {
    fm_span *span = arena->partial[cls];
    if (!span && !(span = arena_new_span(arena, cls))) break;
    /* Free blocks in address order, from the lowest bitmap word that has one. */
    uint64_t *bits = span_free_bits(span);
    uint32_t words = (span->capacity + 63) / 64, w = span->scan;
    if (zeroed && !got && !handed) {
      while (!bits[w]) w++;   /* (a listed span has a free block; the scan starts there) */
      if (w * 64 + (uint32_t)__builtin_ctzll(bits[w]) >= span->zeroed_from) {
        *zeroed = true;
        want = 1;
      }
    }
    /* out[] fills downward from out[want - got - 1]: the lowest block ends on top */
    void **next = out + (want - got);
    /* base: the block of bit 0 of word w, a local as the stores to out[] might alias
     * span->start; 32-bit offsets within a word, which need no sign extension */
    char *base = span->start + (size_t)w * 64 * size;
    uint32_t stride = (uint32_t)size;
    for (; w < words; w++, base += 64 * size) {
      uint64_t word = bits[w];
      if (next - out >= 64) {   /* room for the whole word: no count to check */
        for (; word; word &= word - 1) *--next = base + (uint32_t)__builtin_ctzll(word) * stride;
      } else {
        for (; word && next > out; word &= word - 1)
          *--next = base + (uint32_t)__builtin_ctzll(word) * stride;
      }
      bits[w] = word;
      if (next == out) break;
    }
    uint32_t taken = (uint32_t)(out + (want - got) - next);
    span->scan = (uint16_t)w;
    fm_assert(taken > 0);   /* a listed span has a free block */
    /* (the last block taken is the furthest one) */
    uint32_t last = (uint32_t)((char *)next[0] - span->start) / (uint32_t)size;
    if (last >= span->zeroed_from) span->zeroed_from = (uint16_t)(last + 1);
    if (!zeroed || !*zeroed) tag_fresh(next, taken, span->start + (size_t)span->issued * size);
    if (last >= span->issued) span->issued = (uint16_t)(last + 1);
    got += taken;
    span->used += taken;
    arena->counters.blocks_refilled += taken;
    if (span->used == span->capacity) partial_remove(arena, span);
  }
  if (took_span) *took_span = arena->counters.spans_taken != spans_taken;
  lock_release(&arena->lock, threaded);
  if (got < want) memmove(out, out + (want - got), got * sizeof(void *));
  return handed + got;
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
  if (fm_unlikely(!span_block_at(span, p, &index))) diag_fatal(DIAG_INVALID_FREE, p);
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

/* Ends a flush's visit to span: an emptied one is kept, or stays on its partial list as
 * its class's spare. */
static void span_flush_done(fm_arena *arena, fm_span *span) {
  if (span && span->used == 0) arena_span_emptied_or_spare(arena, span);
}

/* The span of a block a thread cache gives back. The cache took the block on the unit
 * map's word alone, and a bad pointer (an interior one, or a block freed twice) may no
 * longer lie in a span by now, its chunk even unmapped: reported before anything is read. */
static fm_span *cached_block_span(void *p) {
  unsigned cls = unit_map_class(p);
  if (fm_unlikely(cls == 0 || cls > FM_NUM_SPAN_CLASSES)) diag_fatal(DIAG_INVALID_FREE, p);
  return span_of(p);
}

/* Frees the blocks of `arena` among blocks[0 .. n), under its lock; the blocks of other
 * arenas move to the front of the array for a later pass, and their count is returned.
 * A block in the span of the block before it (a cache gives back runs of neighbours) costs
 * a range check, its index and its bit; only a block elsewhere looks its span up. A pointer
 * into a span's unused tail is looked up again, and reported. */
static size_t free_blocks_locked(fm_arena *arena, void **blocks, size_t n) {
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
      if (fm_unlikely(offset >= len)) diag_fatal(DIAG_INVALID_FREE, p);
    }
    uint32_t index;
    if (fm_unlikely(!block_at(offset, magic, size, &index))) diag_fatal(DIAG_INVALID_FREE, p);
    if (index / 64 != word_index) {
      word_store(bits, word_index, word);
      word_index = index / 64;
      word = bits[word_index];
      if (word_index < span->scan) span->scan = (uint16_t)word_index;
    }
    if (fm_unlikely(bit_test_and_set(&word, index))) diag_fatal(DIAG_DOUBLE_FREE, p);
    span->used--;
  }
  word_store(bits, word_index, word);
  span_flush_done(arena, span);
  arena->counters.flushes++;
  arena->counters.blocks_flushed += n - pending;
  return pending;
}

/* Small blocks that threads of other arenas freed, and those that a consumer among the
 * arena's own threads freed (tcache.c's flush_free_only), wait in a box per class: an
 * array of their pointers, each with FM_BLOCK_BOXED added (the block carries
 * FM_BOXED_MARK, bin.h), which the next refill of the class copies into its bin (under the
 * arena's lock, which guards the boxes; the count of each is the arena's boxed[cls]). A
 * linked list would make that refill follow each link, one block's line at a time from
 * the freeing thread's cache; the array's lines come in together, and so do the blocks'
 * marks the refill checks. */
typedef struct {
  void *blocks[FM_HANDED_OVER_BOX];
} handed_over_box;
static handed_over_box boxes[FM_ARENAS_MAX][FM_NUM_SPAN_CLASSES + 1];
_Static_assert(FM_HANDED_OVER_BOX <= UINT8_MAX, "box_room[] and boxed[] hold a box's size");

static handed_over_box *box_of(const fm_arena *arena, unsigned cls) {
  return &boxes[arena - arenas][cls];
}

/* Frees n (> 0) handed-over blocks of the arena, under its lock. */
static void free_unboxed_locked(fm_arena *arena, void **blocks, size_t n) {
  free_blocks_locked(arena, blocks, n);
  arena->counters.blocks_handed_over += n;
}

/* Hands the blocks of `arena` among blocks[0 .. n) over to it, under its lock: each,
 * checked to start a block of its span (the refill writes a mark into it), goes into the
 * box of its class; those a full box has no room for are freed as a flush frees them.
 * The blocks of other arenas move to the front, and their count is returned. */
static size_t hand_over_blocks(fm_arena *arena, void **blocks, size_t n, bool threaded) {
  size_t pending = 0, unboxed = 0;
  void *full[32];   /* blocks a full box has no room for, freed a few at a time */
  void **box = NULL;
  unsigned box_cls = 0;
  char *start = NULL;
  size_t len = 0, size = 0;
  uint32_t magic = 0;
  lock_take(&arena->lock, threaded);
  for (size_t i = 0; i < n; i++) {
    void *p = blocks[i];
    size_t offset = (uintptr_t)p - (uintptr_t)start;
    if (offset >= len) {
      fm_span *span = cached_block_span(p);
      if (span->arena != arena) {
        blocks[pending++] = p;
        continue;
      }
      if (in_abandoned_chunk(arena, p)) continue;   /* (dropped, as a flush drops it) */
      box_cls = span->cls;
      box = box_of(arena, box_cls)->blocks;
      start = span->start;
      len = span_blocks_len(span);
      size = span->block_size;
      magic = span->index_magic;
      offset = (size_t)((char *)p - start);
      if (fm_unlikely(offset >= len)) diag_fatal(DIAG_INVALID_FREE, p);
    }
    uint32_t index;
    if (fm_unlikely(!block_at(offset, magic, size, &index))) diag_fatal(DIAG_INVALID_FREE, p);
    if (fm_likely(arena->boxed[box_cls] < box_room[box_cls])) {
      mark_set(p, (const void *)FM_BOXED_MARK);
      box[arena->boxed[box_cls]++] = (char *)p + FM_BLOCK_BOXED;
      continue;
    }
    full[unboxed++] = p;
    if (unboxed == sizeof full / sizeof *full) {
      free_unboxed_locked(arena, full, unboxed);
      unboxed = 0;
    }
  }
  if (unboxed) free_unboxed_locked(arena, full, unboxed);
  lock_release(&arena->lock, threaded);
  return pending;
}

/* Frees the blocks in the arena's boxes, under its lock: each still carries the box's mark
 * (bin.h), which the spans' refills would not accept, and leaves with FM_FREED_MARK. */
void arena_free_handed_over_blocks(fm_arena *arena) {
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
    unsigned n = arena->boxed[cls];
    if (!n) continue;
    void **blocks = box_of(arena, cls)->blocks;
    for (unsigned i = 0; i < n; i++) {
      void *p = (char *)blocks[i] - FM_BLOCK_BOXED;
      if (FM_FREE_MARK && ((const uintptr_t *)p)[1] != FM_BOXED_MARK)
        diag_fatal(DIAG_FREE_BLOCK_CORRUPTED, p);
      mark_set(p, (const void *)FM_FREED_MARK);
      blocks[i] = p;
    }
    free_unboxed_locked(arena, blocks, n);
    arena->boxed[cls] = 0;
  }
}

/* At a refill of class cls, under the lock: the blocks in the class's box go straight
 * into out[0 ..), up to `room` (returns how many), the last boxed first, with no pass
 * through their spans' bitmaps (a consumer's blocks go back to its producer's bin). */
static unsigned handed_over_take_locked(fm_arena *arena, unsigned cls, void **out, unsigned room) {
  unsigned count = arena->boxed[cls], taken = count < room ? count : room;
  memcpy(out, box_of(arena, cls)->blocks + (count - taken), taken * sizeof(void *));
  arena->boxed[cls] = (uint8_t)(count - taken);
  return taken;
}

/* One pass per owning arena, under its lock: the blocks of another arena than the
 * thread's own are handed over to it (its refills take them as they are, and the flush
 * writes none of the bitmaps those refills read); those of its own are freed, or with
 * hand_over_home handed over too. */
void arena_free_blocks(void **blocks, size_t n, const fm_arena *home, bool hand_over_home) {
  bool threaded = lock_threaded();
  while (n) {
    fm_arena *arena = cached_block_span(blocks[0])->arena;
    if (threaded && home && (arena != home || hand_over_home)) {
      n = hand_over_blocks(arena, blocks, n, threaded);
      continue;
    }
    lock_take(&arena->lock, threaded);
    n = free_blocks_locked(arena, blocks, n);
    arena_unlock_after_free(arena, threaded);
  }
}

size_t arena_small_usable_size(const void *p, unsigned cls) {
  const fm_span *span = span_of(p);
  uint32_t index;
  if (span->cls != cls) return 0;
  return span_block_at(span, p, &index) ? size_class_size[cls] : 0;
}

bool arena_small_is_free(void *p) {
  fm_span *span = span_of(p);
  fm_arena *arena = span->arena;
  bool threaded = lock_threaded();
  lock_take(&arena->lock, threaded);
  arena_free_handed_over_blocks(arena);
  uint32_t index = span_block_index(span, p);
  bool is_free = !in_abandoned_chunk(arena, p) &&
                 (span_free_bits(span)[index / 64] >> (index % 64) & 1);
  lock_release(&arena->lock, threaded);
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
size_t arena_small_span_purge(fm_span *span) {
  size_t size = span->block_size, released = 0;
  char *base = span_base(span);
  size_t color = (size_t)(span->start - base);   /* no block lies below it */
  const uint64_t *bits = span_free_bits(span);
  size_t pages = (color + span_blocks_len(span)) / FM_PAGE_SIZE, run = 0, run_resident = 0;
  unsigned char resident[FM_SPAN_UNITS_MAX * FM_UNIT_SIZE / FM_PAGE_SIZE];
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
