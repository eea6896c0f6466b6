/* Mapped blocks: blocks beyond what chunk spans serve, each in a mapping of its own with a
 * small header before the block, resized with mremap, and a short-lived cache of freed
 * mappings per arena so a malloc/free loop of one big size makes no system call. Locking:
 * the caches' own locks, taken here; nothing else is shared. */
#ifndef FM_MAPPED_H
#define FM_MAPPED_H

#include "arena.h"
#include "diag.h"

/* What a large block is for: LARGE_ZEROED, calloc (fresh mappings, and spans of units
 * never used or purged since, are zero already); LARGE_GROWING, a block realloc grows,
 * which is likely to grow again: a mapping of its own, which later growth extends or moves
 * with mremap instead of copying it (a copy into fresh pages costs their faults too). */
typedef enum { LARGE_PLAIN, LARGE_ZEROED, LARGE_GROWING } large_use;

/* A block of size bytes aligned to align (0: 64), for a thread of `arena` (whose cache of
 * freed mappings it tries first); a fresh mapping for calloc asks for no huge pages (the
 * program may write little of it: map_fresh). *zeroed says it reads zero. NULL when out
 * of memory. */
void *mapped_alloc(size_t size, size_t align, const fm_arena *arena, large_use use, bool *zeroed);
/* Frees mapped block p into the cache of the freeing thread's arena. */
void mapped_free(void *p, const fm_arena *arena);
/* Bytes usable in mapped block p; the fatal report `op` when p is no live mapped block. */
size_t mapped_usable_size(const void *p, diag_report op);
/* Resizes in place or moves with mremap; NULL (p untouched) when that cannot be done. */
void *mapped_realloc(void *p, size_t size);
/* The mapped blocks, for statistics. */
typedef struct mapped_statistics {
  size_t live_blocks, live_bytes;   /* their mappings' bytes */
  size_t max_blocks, max_bytes;     /* the most at once since start */
  size_t new_mappings, cached_mappings;   /* blocks that took a new mapping, a cached one */
} mapped_statistics;
void mapped_figures(mapped_statistics *out);
/* Unmaps the cached mappings freed longer ago than the purge delay, skipping a cache whose
 * lock is busy; all: every cached mapping, waiting for each lock (malloc_trim, out of
 * memory). Returns the bytes unmapped. */
size_t mapped_cache_unmap(bool all);

/* The fork window for the caches (see arena.h); in the child a cache whose lock a
 * borrower held forgets its mappings (they stay mapped, unused). */
void mapped_lock_all_for_fork(void);
void mapped_unlock_all_after_fork(void);
void mapped_after_fork_child(void);

#endif
