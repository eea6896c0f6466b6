/* The per-thread cache and the malloc/free fast paths, inlined into the exported
 * functions. A hit is: no call, no lock, no atomic, no errno write, no "initialised?"
 * test. Every miss tail-calls a noinline slow path in tcache.c.
 *
 * A bin is a stack of block pointers in the cache's own memory, not a list linked through
 * the free blocks: a pop reads no block (so no dependent load, no cache miss on a cold
 * block, nothing a stray write into a free block could redirect), and refill and flush
 * move pointers without touching the blocks at all. The only word the cache writes into
 * a free block is the double-free mark.
 * Measured cost (x86-64, gcc 12, hardening on): malloc hit 13 instructions (17 from 1 KiB
 * to 8 KiB), free hit 15. */
#ifndef FM_TCACHE_H
#define FM_TCACHE_H

#include "arena.h"

/* A thread's cache lives in the thread's static TLS, so the fast paths address it off
 * %fs directly: no load of a cache pointer. Zero is a valid state, FM_TCACHE_BOOT: every
 * bin pointer NULL, so every bin is empty and full at once, and the first malloc and the
 * first free take the slow path, which sets the thread up. After the thread's exit its
 * cache is zeroed again, in state FM_TCACHE_DEAD: calls still arriving go to the arenas. */
enum { FM_TCACHE_BOOT, FM_TCACHE_LIVE, FM_TCACHE_DEAD };

/* Requests up to this size find their class in the cache's own copy of the size table;
 * larger ones take one call more. The copy stops here to keep the cache small (about
 * 1.4 KiB of TLS): a dlopen'ed copy of the library then fits in glibc's spare static TLS. */
#define FM_TABLED_MAX 1024u

typedef struct fm_tcache {
  /* Bin cls holds the blocks at low[cls] .. top[cls] - 1, the newest on top, and has room
   * up to high[cls]: malloc misses at top == low, free at top == high. All three are NULL
   * in the bins of class 0 and of the large markers, so those always miss. The bins lie
   * in class order in one array (`slots`), each with room for its limit or more. */
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
  void **slots;              /* the bins' array: room for every bin at its largest limit */
  void **layout_end;         /* the end of the last bin's room; a layout only ever grows,
                                so no slot above it was touched */
  size_t limit_bytes;        /* sum of limit * block size: held under the byte budget */
  uint32_t misses;           /* slow-path visits since the last idle sweep */
  uint32_t sweep_epoch;      /* the arena's purge tick count at the last idle sweep */
  /* The thread's last freed page block of each length in pages (8-64 KiB, see arena.h),
   * for its next malloc of that length: without it, each malloc and free of such a
   * block took the arena's page span lists (about 200 instructions). One a length, so
   * the cache pins little: at most one block of each length, 0.53 MiB in all. */
  void *page_blocks[FM_PAGES_PER_UNIT + 1];
  /* The list of live threads' caches (under tcache.c's pool_lock), which a free of a
   * marked block searches for a double free from another thread. */
  struct fm_tcache *live_next, *live_prev;
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

/* The double-free mark (DESIGN §6): a cached block's second word holds `mark` (fm_mark, a
 * random key: user data matches it by chance only). Builds without FM_FREE_MARK neither
 * write nor read it. */
static fm_always_inline bool mark_found(const void *block, uintptr_t mark) {
  return FM_FREE_MARK && ((const uintptr_t *)block)[1] == mark;
}
static fm_always_inline void mark_set(void *block, uintptr_t mark) {
  if (FM_FREE_MARK) ((uintptr_t *)block)[1] = mark;
}

/* Pops a block from a bin whose top (already loaded) is known to be above its low end. */
static fm_always_inline void *tcache_pop(size_t cls, void **top) {
  FM_SPLIT_ADDRESS(cls);
  fm_tc.top[cls]--;
  void *block = top[-1];
  mark_set(block, 0);
  return block;
}

/* Pushes freed block p, marked, onto bin cls, whose top (already loaded) is below its
 * high end. */
static fm_always_inline void tcache_push(size_t cls, void **top, void *p, uintptr_t mark) {
  mark_set(p, mark);
  *top = p;
  __asm__("" ::: "memory");   /* the slot before the top: other threads search the range */
  FM_SPLIT_ADDRESS(cls);
  fm_tc.top[cls]++;
}

/* A block of class cls for a request of `size` bytes. A class from a size table
 * (by_size) is looked up again by size on a miss, after set-up: before it, the tables
 * read class 0, whose bin is always empty. Aligned requests pick their class otherwise. */
static fm_always_inline void *tcache_malloc_class(size_t cls, size_t size, bool by_size) {
  void **top = fm_tc.top[cls];
  if (fm_unlikely(top == fm_tc.low[cls])) return tcache_malloc_miss(size, by_size ? 0 : (unsigned)cls);
  return tcache_pop(cls, top);
}

static fm_always_inline void *tcache_malloc(size_t size) {
  if (fm_unlikely(size > FM_TABLED_MAX)) return fm_malloc_untabled(size);
  return tcache_malloc_class(fm_tc.class_of_granule[(size + 15) >> 4], size, true);
}

static fm_always_inline void tcache_free(void *p) {
  size_t cls = unit_map_class(p);   /* 0 for NULL and foreign pointers: bin 0 is full */
  void **top = fm_tc.top[cls];
  if (fm_unlikely(top == fm_tc.high[cls])) return tcache_free_miss(p);
  uintptr_t mark = fm_mark;
  if (fm_unlikely(mark_found(p, mark))) return tcache_free_miss(p);   /* double free? */
  tcache_push(cls, top, p, mark);
}

/* Whether small block p of class cls (a span class) is free already, as far as the
 * double-free mark can tell (in any thread's cache, or in its span): for the paths that
 * must not take a freed block for a live one. A block without the mark is live: that test
 * is inline, the search for a marked one is not. */
bool tcache_marked_block_is_free(void *p, unsigned cls);
static inline bool tcache_block_is_free(void *p, unsigned cls) {
  return mark_found(p, fm_mark) && tcache_marked_block_is_free(p, cls);
}

/* A block of size bytes (FM_SMALL_MAX .. FM_UNIT_SIZE) for malloc: the cached page block
 * of its length, else one from the thread's arena; NULL when the thread has no cache (not
 * set up, or exited) or the arena no memory. */
void *tcache_malloc_pages(size_t size);
/* Whether page block p, live as far as its span can tell, is freed: in a thread's cache.
 * Only a block with the mark can be (see tcache_marked_block_is_free). */
bool tcache_marked_page_block_is_free(const void *p);
static inline bool tcache_page_block_is_free(const void *p) {
  return mark_found(p, fm_mark) && tcache_marked_page_block_is_free(p);
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
