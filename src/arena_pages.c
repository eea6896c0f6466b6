/* Page blocks: blocks of 12-64 KiB as runs of whole pages in page spans, a unit each, whose
 * free pages and block starts are masks in the span's header. */
#include "arena_internal.h"
#include "bin.h"

static uint8_t longest_in_byte[256];   /* the longest run of set bits in each byte value */

void arena_pages_init(void) {
  for (unsigned byte = 1; byte < 256; byte++) {
    unsigned n = 0;
    for (unsigned bits = byte; bits; n++) bits &= bits >> 1;
    longest_in_byte[byte] = (uint8_t)n;
  }
}

/* Blocks of every length share a unit's 16 pages, so a block's pages are all it touches
 * and no class keeps a partly used span of its own. A malloc takes the lowest free run that
 * holds the block in a span whose longest free run is the shortest that does, and prefers
 * a page that began a block before (touched_starts): a program that writes only the start
 * of its blocks then reaches few new pages. */

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
 * when it has no free page; an empty one goes off the lists, kept or as the page spans'
 * spare (which the next page-block malloc that fits in no listed span takes). */
static void page_span_relist(fm_arena *arena, fm_span *span) {
  fm_assert(!(span->free_pages & span->run_starts) && !(span->zeroed_pages & ~span->free_pages));
  fm_assert(span->used + (unsigned)__builtin_popcount(span->free_pages) == FM_PAGES_PER_UNIT);
  unsigned longest = longest_run(span->free_pages);
  if (longest == span->listed) return;
  page_span_unlist(arena, span);
  if (longest == 0) return;
  if (longest == FM_PAGES_PER_UNIT) return arena_span_emptied_or_spare(arena, span);
  LIST_PUSH(&arena->page_spans[longest], span);
  arena->page_span_runs |= 1u << longest;
  span->listed = (uint8_t)longest;
}

void *arena_alloc_pages(fm_arena *arena, size_t size, size_t align, bool *zeroed) {
  unsigned pages = size ? (unsigned)((size + FM_PAGE_SIZE - 1) / FM_PAGE_SIZE) : 1;
  unsigned align_pages = align > FM_PAGE_SIZE ? (unsigned)(align / FM_PAGE_SIZE) : 1;
  fm_assert(pages >= 1 && pages <= FM_PAGES_PER_UNIT && align_pages <= FM_PAGES_PER_UNIT);
  bool threaded = lock_threaded();
  lock_take(&arena->lock, threaded);
  arena_free_handed_over_page_blocks(arena);
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
  } else if (arena->spare[FM_CLASS_PAGES]) {
    span = arena->spare[FM_CLASS_PAGES];
    arena->spare[FM_CLASS_PAGES] = NULL;
  } else {
    span = arena_reuse_or_take_span(arena, FM_CLASS_PAGES, 1);
  }
  void *p = NULL;
  if (span) {
    uint32_t bits = page_bits((unsigned)first, pages);
    *zeroed = (span->zeroed_pages & bits) == bits;
    span->zeroed_pages &= (uint16_t)~bits;
    page_layout_set(span, span->free_pages & ~bits, span->run_starts | 1u << first);
    span->touched_starts |= (uint16_t)(1u << first);
    span->used += pages;
    page_span_relist(arena, span);
    p = span->start + (size_t)first * FM_PAGE_SIZE;
    arena->counters.page_blocks_taken++;
  }
  lock_release(&arena->lock, threaded);
  return p;
}

/* Frees page block p of span, whose arena's lock the caller holds; returns 1, or 0 for a
 * block of a chunk its arena abandoned (nothing to update). */
static fm_always_inline uint32_t page_block_free_locked(fm_arena *arena, fm_span *span, void *p) {
  if (in_abandoned_chunk(arena, p)) return 0;
  unsigned first = page_index(p);
  if (fm_unlikely(!page_block_at(span, p)))
    diag_fatal(span->cls == FM_CLASS_PAGES && !((uintptr_t)p & (FM_PAGE_SIZE - 1)) &&
                       (span->free_pages >> first & 1)
                   ? DIAG_DOUBLE_FREE
                   : DIAG_INVALID_FREE,
             p);
  unsigned pages = page_run_length(span, first);
  page_layout_set(span, span->free_pages | page_bits(first, pages),
                  span->run_starts & ~(1u << first));
  span->used -= pages;
  arena->counters.page_blocks_given++;
  page_span_relist(arena, span);
  return 1;
}

/* Checks p, the link from handed-over page block `from`: it must start a page of one of the
 * arena's page spans, else `from`'s link was overwritten; and carry the handed-over mark,
 * else it was written into. */
static void handed_over_page_check(const fm_arena *arena, void *p, void *from) {
  if (((uintptr_t)p & (FM_PAGE_SIZE - 1)) || unit_map_class_checked(p) != FM_CLASS_PAGES ||
      chunk_of(p)->arena != arena)
    diag_fatal(DIAG_FREE_BLOCK_CORRUPTED, from);
  if (FM_FREE_MARK && ((const uintptr_t *)p)[1] != FM_HANDED_OVER_MARK)
    diag_fatal(DIAG_FREE_BLOCK_CORRUPTED, p);
}

/* Frees the page blocks that threads of other arenas handed over, under the arena's lock;
 * returns how many. Each loses its mark on the way: a live block that kept it would cost
 * its free a look here. */
static fm_noinline uint32_t handed_over_page_blocks_free_locked(fm_arena *arena) {
  void *p = __atomic_exchange_n(&arena->handed_over_page_blocks, NULL, __ATOMIC_ACQUIRE);
  uint32_t freed = 0;
  while (p) {
    void *next = *(void **)p;
    if (next) handed_over_page_check(arena, next, p);
    mark_set(p, NULL);
    freed += page_block_free_locked(arena, span_of(p), p);   /* (a block twice: reported) */
    p = next;
  }
  return freed;
}

void arena_hand_over_page_block(fm_arena *owner, void *p) {
  mark_set(p, (const void *)FM_HANDED_OVER_MARK);
  handed_over_push(&owner->handed_over_page_blocks, p, p);
}

void arena_free_handed_over_page_blocks(fm_arena *arena) {
  if (__atomic_load_n(&arena->handed_over_page_blocks, __ATOMIC_RELAXED))
    arena->page_frees += handed_over_page_blocks_free_locked(arena);
}

bool arena_handed_over_page_block_is_free(void *p) {
  fm_span *span = span_of(p);
  fm_arena *arena = span->arena;
  bool threaded = lock_threaded();
  lock_take(&arena->lock, threaded);
  arena_free_handed_over_page_blocks(arena);
  bool freed = !page_block_at(span, p);
  lock_release(&arena->lock, threaded);
  return freed;
}

void arena_free_pages(void *p) {
  fm_span *span = span_of(p);
  fm_arena *arena = span->arena;
  bool threaded = lock_threaded();
  lock_take(&arena->lock, threaded);
  /* A purge tick reads the clock: every FM_TICK_PAGE_FREES of these frees looks whether
   * one is due. */
  arena->page_frees += page_block_free_locked(arena, span, p);
  if (arena->page_frees % FM_TICK_PAGE_FREES) lock_release(&arena->lock, threaded);
  else arena_unlock_after_free(arena, threaded);
}

bool arena_resize_pages(void *p, size_t size) {
  unsigned pages = (unsigned)((size + FM_PAGE_SIZE - 1) / FM_PAGE_SIZE);
  fm_span *span = span_of(p);
  fm_arena *arena = span->arena;
  bool threaded = lock_threaded();
  lock_take(&arena->lock, threaded);
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
      span->zeroed_pages &= (uint16_t)~more;
      span->used += pages - old;
    }
  }
  if (pages != old && resized) page_span_relist(arena, span);
  lock_release(&arena->lock, threaded);
  return resized;
}

/* Purges the free pages of a partly used page span that may be resident; returns their
 * bytes. */
size_t arena_page_span_purge(fm_span *span) {
  size_t released = 0;
  uint32_t dirty = (uint32_t)(span->free_pages & ~span->zeroed_pages);
  while (dirty) {
    unsigned first = (unsigned)__builtin_ctz(dirty);
    unsigned len = (unsigned)__builtin_ctz(~(dirty >> first));
    uint32_t bits = page_bits(first, len);
    if (os_purge(span->start + (size_t)first * FM_PAGE_SIZE, (size_t)len * FM_PAGE_SIZE)) {
      span->zeroed_pages |= (uint16_t)bits;
      span->touched_starts &= (uint16_t)~bits;
      released += (size_t)len * FM_PAGE_SIZE;
    }
    dirty &= ~bits;
  }
  return released;
}

size_t arena_pages_usable_size(const void *p) {
  fm_arena *arena = span_of(p)->arena;
  bool threaded = lock_threaded();
  lock_take(&arena->lock, threaded);   /* (other blocks of the span change its masks) */
  size_t usable = FM_PAGE_SIZE * page_block_pages(p);
  lock_release(&arena->lock, threaded);
  return usable;
}
