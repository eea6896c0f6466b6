/* The per-thread cache: a bin (bin.h) per size class in the thread's static TLS, and the
 * malloc/free fast paths, inlined into the exported functions. A hit is: no call, no lock,
 * no atomic, no errno write, no "initialised?" test. Every miss tail-calls a noinline slow
 * path in tcache.c. Cost (x86-64, gcc 12, check on): malloc hit 12 instructions, free hit
 * 15. Nothing here is shared: only the owning thread reads or writes its cache. */
#ifndef FM_TCACHE_H
#define FM_TCACHE_H

#include "bin.h"
#include "thread.h"

/* A thread's cache lives in the thread's static TLS, so the fast paths address it off
 * %fs directly: no load of a cache pointer. Its initial image is FM_TCACHE_BOOT: every bin
 * empty and full at once (all bounds just past one sentinel slot), so the first malloc and
 * the first free take the slow path, which sets the thread up. After the thread's exit its
 * cache goes back to that image, in state FM_TCACHE_DEAD: calls still arriving go to the
 * arenas. */
enum { FM_TCACHE_BOOT, FM_TCACHE_LIVE, FM_TCACHE_DEAD };

typedef struct fm_tcache {
  /* Bin cls holds the blocks at low[cls] .. top[cls] - 1, the newest on top, at most
   * limit[cls] of them; low[cls][-1] holds the sentinel. room[cls] counts down the frees
   * the bin takes before the next slow path: never more than it has room for, and at most
   * FM_TICK_FREES, so a thread that frees keeps reading the purge clock (tcache.c) without
   * one instruction more than a test for a full bin. In the bins of class 0 and of the
   * markers top and low point just past the static sentinel and room stays 0 or below (64
   * bits: it never wraps), so those always miss. The bins lie in class order in one array,
   * each with room for its limit or more. */
  int64_t room[FM_BINS];   /* (first: gcc addresses it in free's one read-modify-write) */
  void **top[FM_BINS];
  void **low[FM_BINS];
  int32_t limit[FM_BINS];
  uint8_t activity[FM_BINS]; /* BIN_REFILLED | BIN_OVERFLOWED since the last idle sweep */
  uint64_t free_only;        /* bit cls: bin cls overflowed, never refilled, since then */
  uint64_t ever_refilled;    /* bit cls: bin cls was refilled in the thread's life */
  uint8_t state;             /* FM_TCACHE_BOOT, _LIVE or _DEAD */
  fm_arena *arena;
  fm_bins_array *bins;       /* room for every bin at its largest limit */
  void **layout_end;         /* the end of the last bin's room; a layout only ever grows,
                                so no slot above it was touched */
  size_t limit_bytes;        /* sum of limit * block size: held under the byte budget */
  uint32_t misses;           /* slow-path visits since the last idle sweep */
  int32_t clock_countdown;   /* frees the bins may take before the purge clock is read */
  uint32_t sweep_epoch;      /* the arena's purge tick count at the last idle sweep */
} fm_tcache;
_Static_assert(FM_NUM_SPAN_CLASSES < 64, "free_only has a bit for every span class");

extern fm_hidden __thread fm_tcache tcache_tls __attribute__((tls_model("initial-exec")));

/* Never inlined (not even under LTO): the fast paths tail-call them. */
fm_noinline void *tcache_malloc_miss(size_t size, unsigned cls);   /* cls 0: by size */
fm_noinline void tcache_free_miss(void *p, unsigned cls);   /* cls: p's unit-map entry */
/* calloc of FM_CALLOC_ZEROED_MIN .. FM_SMALL_MAX bytes: a block from the bin is cleared.
 * When the bin is empty, a block comes from the arena, cleared only if it may hold data:
 * one not handed out since its span's units were last zero is left as it is. (Not inline:
 * a clear of a page or more dwarfs the call.) */
fm_noinline void *tcache_calloc_zeroed(size_t size);

/* gcc would otherwise compute &tcache_tls.top[cls] with one more instruction, to share it
 * between the load and the store of top: this hides that they share cls. */
#define FM_SPLIT_ADDRESS(cls) __asm__("" : "+r"(cls))
/* Makes gcc give the popped block a register of its own (the return value's), instead of
 * one it then copies there: one instruction. */
#define FM_OWN_REGISTER(value) __asm__("" : "+r"(value))

/* A miss of the fast path below: tcache_malloc_miss, or a caller's wrapper of it. */
typedef void *(*tcache_miss_fn)(size_t size, unsigned cls);

/* A block of class cls for a request of `size` bytes, else what miss returns. A class
 * from a size table (by_size) is looked up again by size on a miss, after set-up: before
 * it, the tables read class 0, whose bin is always empty. Aligned requests pick their
 * class otherwise. */
static fm_always_inline void *tcache_malloc_class(size_t cls, size_t size, bool by_size,
                                                  tcache_miss_fn miss) {
  void **top = tcache_tls.top[cls];
  void *block = top[-1];
  FM_OWN_REGISTER(block);
  void **slot = top - 1;
  bool empty_or_bad;
  if (FM_FREE_MARK) {
    empty_or_bad = !mark_matches(block, slot);
  } else {
    FM_SPLIT_ADDRESS(cls);
    empty_or_bad = slot + 1 == tcache_tls.low[cls];
  }
  if (fm_unlikely(empty_or_bad)) return miss(size, by_size ? 0 : (unsigned)cls);
  FM_SPLIT_ADDRESS(cls);
  tcache_tls.top[cls] = slot;
  return block;
}

/* malloc of size <= FM_TABLED_MAX. */
static fm_always_inline void *tcache_malloc_tabled(size_t size, tcache_miss_fn miss) {
  return tcache_malloc_class(size_class_of_size[size], size, true, miss);
}

static fm_always_inline void tcache_free(void *p) {
  size_t cls = unit_map_class(p);   /* 0 for NULL and foreign pointers: bin 0 is full */
  if (fm_unlikely(--tcache_tls.room[cls] < 0)) {
    /* (without it gcc copies cls to the miss's argument register before the test) */
    FM_SPLIT_ADDRESS(cls);
    return tcache_free_miss(p, (unsigned)cls);
  }
  void **top = tcache_tls.top[cls];
  mark_set(p, top);
  *top = p;
  FM_SPLIT_ADDRESS(cls);
  tcache_tls.top[cls]++;
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
/* Whether page block p, live as far as its span can tell, is freed: in a thread's cache,
 * or handed to its arena by another arena's thread. Only a block whose second word holds
 * FM_FREED_MARK or FM_HANDED_OVER_MARK can be: that test is inline, the search of every cache
 * or of what the arena was handed is not. */
bool tcache_marked_page_block_is_free(void *p);
static inline bool tcache_page_block_is_free(void *p) {
  return FM_FREE_MARK && mark_freed_or(((const uintptr_t *)p)[1], FM_HANDED_OVER_BIT) &&
         tcache_marked_page_block_is_free(p);
}

/* Set-up, before any thread's: the bins' limits, the size of their array, and the thread
 * key whose destructor flushes a finished thread's cache. false when the key cannot be
 * had. */
bool tcache_init(void);
/* The calling thread's arena for a block past the bins; the call also runs the cache's
 * idle sweep when a purge tick has passed since the last one. */
fm_arena *tcache_arena_for_large(void);
/* Gives the calling thread's cached blocks back to their spans (malloc_trim, out of
 * memory); purge: its bins' array's pages too. */
void tcache_flush_mine(bool purge);
/* The bytes and blocks in the calling thread's bins and cached page blocks. */
void tcache_holdings(size_t *bytes, size_t *blocks);
/* The fork child: the calling thread's cache is the only one left. */
void tcache_after_fork_child(void);

#endif
