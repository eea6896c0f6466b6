/* The registry of thread caches: every bins' array (those of live threads, and those of
 * finished threads pooled for the next ones), the arena each live thread is dealt, and the
 * search of every cache for a page block freed twice. Arrays are the allocator's own
 * memory, marked FM_CLASS_BINS in the unit map, so nothing here reads a thread's TLS, which
 * may be gone with its thread. Locking: the registry's lock, taken here. */
#ifndef FM_THREAD_H
#define FM_THREAD_H

#include "arena.h"

/* A thread's bins and cached page blocks (tcache.h). */
typedef struct fm_bins_array {
  struct fm_bins_array *next, *prev;   /* on the registry's in-use or pooled list */
  /* The thread's last freed page blocks of its arena, of each length in pages (12-64 KiB),
   * for its next mallocs of that length: FM_PAGE_BLOCKS_A_LENGTH a length, a stack of
   * page_blocks_count[length] blocks (the slots above it NULL), FM_PAGE_CACHE_PAGES pages
   * in all (page_blocks_pages). A cached block's second word holds FM_FREED_MARK; other
   * threads search these slots for a page block freed twice. */
  void *page_blocks[FM_PAGES_PER_UNIT + 1][FM_PAGE_BLOCKS_A_LENGTH];
  uint8_t page_blocks_count[FM_PAGES_PER_UNIT + 1];
  uint32_t page_blocks_pages;
  void *slots[];   /* the bins */
} fm_bins_array;

/* Set-up: the size of one bins' array (whole units). */
void thread_init(size_t array_bytes);
/* A new thread's bins' array, pooled or newly mapped, and its arena: the lowest one with
 * the fewest live threads, so threads created one after another reuse one arena's memory
 * rather than spreading the heap over every arena. false when out of memory. */
bool thread_join(fm_bins_array **array, fm_arena **arena);
/* A finished thread's (flushed) array goes back to the pool, or is unmapped. */
void thread_leave(fm_bins_array *array, fm_arena *arena);
/* Whether a cache other than `mine` holds page block p of `pages` pages. */
bool thread_other_caches_hold_page_block(const fm_bins_array *mine, const void *p,
                                         unsigned pages);
/* Unmaps the pooled arrays (malloc_trim, out of memory); returns their bytes. */
size_t thread_pool_unmap(void);

/* The fork window (lock.h). In the child only the forking thread lives: its array and arena
 * (none when it has no cache) are all the registry holds of the live threads; the others'
 * arrays stay mapped, unused. */
void thread_lock_for_fork(void);
void thread_unlock_after_fork(void);
void thread_after_fork_child(fm_bins_array *own, const fm_arena *own_arena);

#endif
