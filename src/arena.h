/* Arenas: about one per CPU, each with a lock, its chunks and, per size class, the spans
 * that still have free blocks. Three kinds of block come from an arena's spans: small
 * blocks of a size class (arena_small.c, moved in batches to and from thread caches, so
 * one lock acquisition moves many blocks), page blocks of 12-64 KiB, runs of whole pages in
 * page spans (arena_pages.c), and span blocks of up to 1 MiB, a whole span each
 * (arena_spans.c). arena.c keeps the lists, maps chunks and purges.
 * Locking: every function here takes the lock of the arena it works on itself (a no-op
 * while single-threaded), except where it says the caller holds it. */
#ifndef FM_ARENA_H
#define FM_ARENA_H

#include "chunk.h"
#include "lock.h"

/* What an arena's slow paths did, counted under its lock (statistics: stats.c). */
typedef struct arena_counters {
  uint64_t refills, blocks_refilled;       /* arena_alloc_batch */
  uint64_t flushes, blocks_flushed;        /* arena_free_blocks' passes */
  uint64_t blocks_handed_over;             /* of those, handed over by another arena's thread,
                                              or by a thread that only frees them */
  uint64_t page_blocks_taken, page_blocks_given;
  uint64_t span_blocks_taken;
  uint64_t bytes_purged;   /* purged or unmapped by arena_purge, purged for other arenas' growth */
  uint64_t spans_taken;    /* from the chunks: new spans, not kept ones of the class again */
} arena_counters;

typedef struct fm_arena {
  lock_t lock;
  fm_span *partial[FM_NUM_SPAN_CLASSES + 1];   /* spans with a free block, per class */
  /* Partly used page spans by their longest free run: page_spans[n] holds those whose
   * longest is n pages (1 .. 15); bit n of page_span_runs says it holds one. */
  fm_span *page_spans[FM_PAGES_PER_UNIT];
  uint32_t page_span_runs;
  uint32_t page_frees;     /* frees of page blocks, for the purge tick's clock */
  /* Empty spans kept a while, in address order, per class; FM_CLASS_SPAN_BLOCK: freed span
   * blocks, so a malloc/free loop of them does not churn through the chunks;
   * FM_CLASS_PAGES: empty page spans. */
  fm_span *empty[FM_CLASS_PAGES + 1];
  fm_span *empty_highest[FM_CLASS_PAGES + 1];   /* the last span of each such list */
  uint16_t empty_count[FM_CLASS_PAGES + 1];
  /* Per class (size classes and FM_CLASS_PAGES), the spare: a span that emptied and is
   * kept at hand for the class's next refill or page-block malloc, or NULL; a size
   * class's stays on its partial list, and may have blocks out again since (then it is a
   * partial span as any). See arena_span_emptied_or_spare. */
  fm_span *spare[FM_CLASS_PAGES + 1];
  char *reserve, *reserve_end;   /* mapped, not yet used: the next chunks */
  fm_chunk *chunks;        /* chunks with a free unit, in address order */
  fm_chunk *full_chunks;   /* chunks without one: never searched */
  unsigned chunk_count;    /* chunks on the two lists */
  uint32_t generation;     /* of the chunks it uses: others were abandoned (a fork child) */
  uint64_t next_purge_ns;  /* when the next purge tick is due */
  uint64_t purge_epoch;    /* purge ticks so far */
  uint64_t uses_seen;      /* the purge thread's last look at arena_uses */
  /* Free units whose pages may be resident, over its chunks (other arenas read it without
   * the lock: a hint). */
  uint32_t dirty_free_units;
  uint64_t offset_refused;   /* purge_epoch + 1 when the OS refused a growth's purge here */
  /* Units its spans took from the chunks since the last tick, and in each of the
   * FM_DEMAND_TICKS ticks before (by purge_epoch): its demand, for which a tick keeps as
   * many dirty free units (arena_purge). */
  uint32_t units_taken, units_taken_in_tick[FM_DEMAND_TICKS];
  bool idle_purged;        /* it purged everything since the arena was last used */
  arena_counters counters;
  /* Live threads dealt the arena (thread.c, under the registry's lock; others read it). */
  uint32_t threads;
  /* The small blocks handed over to the arena (by threads of other arenas, or by a consumer
   * of its own), in a box per class, how many in each (arena_small.c: under the lock). A
   * refill of the class takes them, a purge tick frees them. */
  uint8_t boxed[FM_NUM_SPAN_CLASSES + 1];
  /* The page blocks that threads of other arenas freed, linked through their first word:
   * the arena frees them under its lock (arena_pages.c). A line of its own: those threads
   * write it, never the rest. */
  void *handed_over_page_blocks __attribute__((aligned(64)));
} __attribute__((aligned(64))) fm_arena;

extern fm_hidden fm_arena arenas[FM_ARENAS_MAX];
extern fm_hidden unsigned arena_count;

/* Set-up: the number of arenas (FASTMALLOC_ARENAS, else the CPUs), the span lengths.
 * on_tick: called after a purge tick, outside the arena's lock (mapped.c's cache of freed
 * mappings ages on the same clock). */
void arena_init_all(void (*on_tick)(void));

/* Runs the arena's purge tick (and visits the arenas nobody frees into) when one is due:
 * for the slow paths that do not reach the arena, so do not tick on its unlock. */
void arena_tick_if_due(fm_arena *arena);
/* Runs the purge tick of every arena not busy now, due or not (the purge thread); an arena
 * not used since the last such call is purged as malloc_trim would, once. */
void arena_tick_all(void);

/* ---- small blocks (arena_small.c) ---- */

/* Takes up to `want` blocks of class cls into out[0 .. got), writing nothing into them;
 * returns got, 0 when out of memory. First, bottom of a thread cache's bin, come the
 * blocks of the class handed over to the arena, straight from their box, up to `room`
 * (>= want), with FM_BLOCK_BOXED added: the blocks a consumer freed go back to its
 * producer's bin. Then, from the spans, the lowest block last: the bin, a stack, hands
 * them out in address order, so the nodes a program allocates one after the other lie
 * upward in memory, as its later walks over them go. A block that was handed out before
 * in its span's life went back through a path that wrote FM_FREED_MARK into its second
 * word (or its page was purged since, and it reads zero), and the caller checks that
 * nothing wrote there since (bin.h); one never handed out may hold anything (the span's
 * units may have served another class), and comes with FM_BLOCK_FRESH (bin.h) added to
 * its address. With zeroed (for calloc), when the first block reads zero (it was not
 * handed out since its span's units were zero), it is the only one taken, untagged, and
 * *zeroed is set. *took_span (when took_span is not NULL) says whether the batch took a
 * span from the chunks: a new one, not one its class kept. */
unsigned arena_alloc_batch(fm_arena *arena, unsigned cls, unsigned want, unsigned room, void **out,
                           bool *zeroed, bool *took_span);
/* Gives back the n blocks listed in blocks[], each to the arena that owns it: one lock
 * acquisition per owning arena, however they are mixed; in a threaded process, the blocks
 * of another arena than home (the freeing thread's; NULL: none) are handed over to it, for
 * its next refills of their classes to take, or its purge tick to free, and with
 * hand_over_home those of home too. Reorders blocks[]. */
void arena_free_blocks(void **blocks, size_t n, const fm_arena *home, bool hand_over_home);
/* Bytes usable in the small block that starts at p, of class cls; 0 when p starts no block
 * of that class (an interior pointer, say). Takes no lock: it reads what does not change
 * while the block is allocated. */
size_t arena_small_usable_size(const void *p, unsigned cls);
/* Whether small block p is free in its span (a double free's confirmation). */
bool arena_small_is_free(void *p);

/* ---- page blocks (arena_pages.c) ---- */

/* A block of `size` bytes (at most FM_UNIT_SIZE) that starts `align` aligned (a power of
 * two, at most FM_UNIT_SIZE), as a run of pages of a page span (where: arena_pages.c),
 * else of an empty span. NULL when out of memory; *zeroed says its pages read zero. */
void *arena_alloc_pages(fm_arena *arena, size_t size, size_t align, bool *zeroed);
void arena_free_pages(void *p);
/* Resizes live block p of a page span in place to hold size bytes (at most
 * FM_UNIT_SIZE): gives back its last pages, or takes the free pages that follow it;
 * false when they are not free. */
bool arena_resize_pages(void *p, size_t size);
/* Hands page block p, marked FM_HANDED_OVER_MARK (bin.h), to its arena `owner` without its
 * lock, for the arena's next page-block malloc or purge to free. A freeing thread of
 * another arena takes no lock the arena's own threads take, and writes none of its
 * spans' headers. */
void arena_hand_over_page_block(fm_arena *owner, void *p);
/* Whether page block p, whose mark says it was handed to its arena that way, is free:
 * frees what the arena was handed, then asks the span. */
bool arena_handed_over_page_block_is_free(void *p);
/* Bytes in page block p (under its arena's lock); 0 when p starts no block out. */
size_t arena_pages_usable_size(const void *p);

/* ---- span blocks (arena_spans.c) ---- */

/* One block of size > FM_SMALL_MAX as a whole span, when it fits in FM_SPAN_BLOCK_UNITS_MAX
 * units; NULL else. *zeroed says it reads zero (its units were never used, or purged). */
void *arena_alloc_span_block(fm_arena *arena, size_t size, bool *zeroed);
void arena_free_span_block(void *p);
/* Resizes live span block p in place to hold size bytes: into the free units that follow
 * it, or by giving back its last units; false when it cannot grow there (or would pass
 * FM_SPAN_BLOCK_UNITS_MAX). */
bool arena_resize_span_block(void *p, size_t size);
/* Bytes in span block p; 0 when p starts no span block out. Takes no lock. */
size_t arena_span_block_usable_size(const void *p);

/* ---- purging, statistics, fork (arena.c) ---- */

/* How arena_purge gives memory back: what stayed empty a whole purge delay (a tick), or
 * everything, with the free pages inside partly used spans too (malloc_trim), or, out of
 * address space, every empty chunk unmapped and every kept span handed back to its
 * chunk without purging a page, and the chunks mapped ahead unmapped. */
typedef enum { FM_PURGE_STALE, FM_PURGE_ALL, FM_UNMAP_EMPTY } fm_purge;
/* Returns bytes given back (purged or unmapped). The caller holds the arena's lock. */
size_t arena_purge(fm_arena *arena, fm_purge how);

/* What an arena holds, for statistics: the chunks' bytes, the blocks out (with their
 * users or in thread caches) and free per size class, page spans, span blocks, and its
 * counters. Takes the arena's lock. */
typedef struct arena_census {
  size_t mapped;   /* chunks, and those mapped ahead */
  size_t used;     /* bytes in blocks out */
  struct {
    uint32_t spans;
    uint64_t out, free;   /* blocks */
  } classes[FM_NUM_SPAN_CLASSES + 1];
  uint32_t page_spans;
  uint64_t pages_out, pages_free;
  uint32_t span_blocks;   /* out */
  arena_counters counters;
} arena_census;
void arena_take_census(fm_arena *arena, arena_census *census);

/* The fork window (lock.h): every arena's lock taken for the fork, then given back in
 * the parent; in the child, an arena whose lock a borrower held at the fork starts again
 * empty (arena_abandon), its chunks never used again. */
void arena_lock_all_for_fork(void);
void arena_unlock_all_after_fork(void);
void arena_after_fork_child(void);

#endif
