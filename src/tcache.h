/* The per-thread cache and the malloc/free fast paths, inlined into the exported
 * functions. A hit is: no call, no lock, no atomic, no errno write, no "initialised?"
 * test. Every miss tail-calls a noinline slow path in tcache.c.
 *
 * A bin is a stack of block pointers in the cache's own memory, not a list linked through
 * the free blocks: a pop follows no link in a block (nothing a stray write into a free
 * block could redirect), and refill and flush move pointers. The one word the cache
 * writes into a free block is its mark, for the double-free check below.
 * Cost (x86-64, gcc 12, check on): malloc hit 13 instructions, free hit 15. */
#ifndef FM_TCACHE_H
#define FM_TCACHE_H

#include "arena.h"

/* The double-free check (FM_FREE_MARK). No block may be handed out twice, and every
 * double free is reported, at the latest when the duplicate is reached:
 * - free writes into the block's second word the address of the bin slot it pushes the
 *   block to, without reading the block;
 * - malloc pops a block only if its mark is the slot it pops it from: a block freed twice
 *   sits in two slots, one of which its mark cannot name (nor can a mark overwritten by a
 *   write into a free block);
 * - blocks leave a bin for their span only with the right mark (the flush checks them),
 *   carrying FM_FREED_MARK instead, and a refill that takes a block handed out before
 *   checks it still carries that (or zero, if its page was purged): so a block freed
 *   again after its first free reached the span is caught when the span would hand it
 *   out twice;
 * - a free that finds its block on top of the bin reports at once (free(p); free(p)).
 * An empty bin's top slot holds a sentinel block whose mark matches no slot, so malloc's
 * one compare also finds the bin empty. */
#define FM_FREED_MARK fm_mark

/* A thread's cache lives in the thread's static TLS, so the fast paths address it off
 * %fs directly: no load of a cache pointer. Its initial image is FM_TCACHE_BOOT: every bin
 * empty and full at once (all bounds at the one sentinel), so the first malloc and the
 * first free take the slow path, which sets the thread up. After the thread's exit its
 * cache goes back to that image, in state FM_TCACHE_DEAD: calls still arriving go to the
 * arenas. */
enum { FM_TCACHE_BOOT, FM_TCACHE_LIVE, FM_TCACHE_DEAD };

/* Requests up to this size find their class in the cache's own copy of the size table;
 * larger ones take one call more. The copy stops here to keep the cache small (about
 * 1.3 KiB of TLS): a dlopen'ed copy of the library then fits in glibc's spare static TLS. */
#define FM_TABLED_MAX 1024u

/* A thread's bins and cached page blocks, in memory of the allocator's own (mapped, and
 * marked FM_CLASS_BINS in the unit map, so a mark is known for a slot address without
 * reading a thread's TLS). Arrays are pooled when their threads end. */
typedef struct fm_bins_array {
  struct fm_bins_array *next, *prev;   /* every array, in use or pooled (tcache.c) */
  bool in_use;
  /* The thread's last freed page block of each length in pages (8-64 KiB, see arena.h),
   * for its next malloc of that length: without it, each malloc and free of such a
   * block took the arena's page span lists (about 200 instructions). One a length, so
   * the cache pins little: at most one block of each length, 0.53 MiB in all. A cached
   * block's second word holds FM_FREED_MARK; other threads search these slots for a page
   * block freed twice. */
  void *page_blocks[FM_PAGES_PER_UNIT + 1];
  void *slots[];   /* the bins, each after a slot holding the sentinel */
} fm_bins_array;

typedef struct fm_tcache {
  /* Bin cls holds the blocks at low[cls] .. top[cls] - 1, the newest on top, and has room
   * up to high[cls]; low[cls][-1] holds the sentinel. Free misses at top == high. In the
   * bins of class 0 and of the markers all three point just past the static sentinel, so
   * those always miss. The bins lie in class order in one array, each with room for its
   * limit or more. */
  void **top[FM_BINS];
  void **low[FM_BINS];
  void **high[FM_BINS];
  /* The start of fm_class_of_granule, up to FM_TABLED_MAX, so malloc indexes it off %fs
   * like the bins (one instruction less than a PIC global); all 0 before set-up and after
   * exit. */
  uint8_t class_of_granule[(FM_TABLED_MAX >> 4) + 1];
  uint8_t activity[FM_BINS]; /* BIN_REFILLED | BIN_OVERFLOWED since the last idle sweep */
  uint8_t state;             /* FM_TCACHE_BOOT, _LIVE or _DEAD */
  fm_arena *arena;
  fm_bins_array *bins;       /* room for every bin at its largest limit */
  void **layout_end;         /* the end of the last bin's room; a layout only ever grows,
                                so no slot above it was touched */
  size_t limit_bytes;        /* sum of limit * block size: held under the byte budget */
  uint32_t misses;           /* slow-path visits since the last idle sweep */
  uint32_t sweep_epoch;      /* the arena's purge tick count at the last idle sweep */
} fm_tcache;

extern fm_hidden __thread fm_tcache fm_tc __attribute__((tls_model("initial-exec")));

/* Never inlined (not even under LTO): the fast paths tail-call them. */
fm_noinline void *tcache_malloc_miss(size_t size, unsigned cls);   /* cls 0: by size */
fm_noinline void tcache_free_miss(void *p);
fm_noinline void *fm_malloc_untabled(size_t size);   /* size > FM_TABLED_MAX */
/* calloc of FM_CALLOC_PAGED_MIN .. FM_SMALL_MAX bytes: a block from the bin is cleared.
 * When the bin is empty, a block comes from the arena, cleared only if it may hold data:
 * one not handed out since its span's units were last zero is left as it is. A growing
 * heap's callocs then skip the clear, and the pages their callers never write stay out of
 * RSS, as glibc's do for memory fresh from the OS. (Not inline: a clear of a page or more
 * dwarfs the call.) */
#define FM_CALLOC_PAGED_MIN FM_PAGE_SIZE
fm_noinline void *tcache_calloc_paged(size_t size);

/* gcc would otherwise compute &fm_tc.top[cls] with one more instruction, to share it
 * between the load and the store of top: this hides that they share cls. */
#define FM_SPLIT_ADDRESS(cls) __asm__("" : "+r"(cls))
/* Makes gcc give the popped block a register of its own (the return value's), instead of
 * one it then copies there: one instruction. */
#define FM_OWN_REGISTER(value) __asm__("" : "+r"(value))

/* Whether block's mark names `slot` (always, without the check). */
static fm_always_inline bool mark_matches(const void *block, void *const *slot) {
  return !FM_FREE_MARK || ((void *const *const *)block)[1] == slot;
}
static fm_always_inline void mark_set(void *block, const void *mark) {
  if (FM_FREE_MARK) ((const void **)block)[1] = mark;
}

/* A block of class cls for a request of `size` bytes. A class from a size table
 * (by_size) is looked up again by size on a miss, after set-up: before it, the tables
 * read class 0, whose bin is always empty. Aligned requests pick their class otherwise. */
static fm_always_inline void *tcache_malloc_class(size_t cls, size_t size, bool by_size) {
  void **top = fm_tc.top[cls];
  void *block = top[-1];
  FM_OWN_REGISTER(block);
  void **slot = top - 1;
  bool empty_or_bad;
  if (FM_FREE_MARK) {
    empty_or_bad = !mark_matches(block, slot);
  } else {
    FM_SPLIT_ADDRESS(cls);
    empty_or_bad = slot + 1 == fm_tc.low[cls];
  }
  if (fm_unlikely(empty_or_bad)) return tcache_malloc_miss(size, by_size ? 0 : (unsigned)cls);
  FM_SPLIT_ADDRESS(cls);
  fm_tc.top[cls] = slot;
  return block;
}

static fm_always_inline void *tcache_malloc(size_t size) {
  if (fm_unlikely(size > FM_TABLED_MAX)) return fm_malloc_untabled(size);
  return tcache_malloc_class(fm_tc.class_of_granule[(size + 15) >> 4], size, true);
}

static fm_always_inline void tcache_free(void *p) {
  size_t cls = unit_map_class(p);   /* 0 for NULL and foreign pointers: bin 0 is full */
  void **top = fm_tc.top[cls];
  if (fm_unlikely(top == fm_tc.high[cls])) return tcache_free_miss(p);
  if (FM_FREE_MARK && fm_unlikely(top[-1] == p)) return tcache_free_miss(p);   /* twice */
  mark_set(p, top);
  *top = p;
  FM_SPLIT_ADDRESS(cls);
  fm_tc.top[cls]++;
}

/* What a block's mark says of small block p of class cls, live as far as its span can
 * tell, for the calls that must not take a freed block for a live one (realloc keeping
 * it in place would give it a second owner). */
typedef enum { BLOCK_LIVE, BLOCK_FREE, BLOCK_UNSURE } fm_block_state;
fm_block_state tcache_block_state(void *p, unsigned cls);

/* A block of size bytes (FM_SMALL_MAX .. FM_UNIT_SIZE) for malloc: the cached page block
 * of its length, else one from the thread's arena; NULL when the thread has no cache (not
 * set up, or exited) or the arena no memory. */
void *tcache_malloc_pages(size_t size);
/* Whether page block p, live as far as its span can tell, is freed: in a thread's cache.
 * Only a block whose second word holds FM_FREED_MARK can be: that test is inline, the
 * search of every cache is not. */
bool tcache_marked_page_block_is_free(const void *p);
static inline bool tcache_page_block_is_free(const void *p) {
  return FM_FREE_MARK && ((const uintptr_t *)p)[1] == FM_FREED_MARK &&
         tcache_marked_page_block_is_free(p);
}

/* Global set-up on the first call (before or without constructors); true when ready. */
bool fm_init(void);
/* The calling thread's arena for a large block, which bypasses the cache; the call also
 * runs the cache's idle sweep when a purge tick has passed since the last one. */
fm_arena *tcache_large_arena(void);
/* Flushes the calling thread's cache and purges every arena: malloc_trim(0). */
size_t tcache_trim(void);
/* Out of memory: flushes the calling thread's cache and unmaps every empty chunk, chunk
 * mapped ahead, cached large mapping and pooled bins' array, purging nothing (so it stays
 * cheap when memory stays short); true when something was unmapped, so one more try may
 * work. */
bool tcache_release_for_retry(void);

#endif
