/* Large blocks in mappings of their own (above what chunk spans serve), with a small
 * header before the block, mremap for realloc, and a short-lived cache of freed mappings
 * so a malloc/free loop of one big size makes no system call. */
#ifndef FM_LARGE_H
#define FM_LARGE_H

#include "arena.h"

/* A block of size bytes aligned to align (0: 64), for a thread of `arena` (whose cache of
 * freed mappings it tries first); *fresh says it is zero-filled. */
void *large_alloc(size_t size, size_t align, const fm_arena *arena, bool *fresh);
/* Frees large block p into the cache of the freeing thread's arena. */
void large_free(void *p, const fm_arena *arena);
/* Bytes usable in large block p; fatal report `op` when p is no live large block. */
size_t large_usable_size(const void *p, const char *op);
/* Resizes in place or moves with mremap; NULL (p untouched) when that cannot be done. */
void *large_realloc(void *p, size_t size);
/* The live large blocks: how many, and their mappings' bytes. */
void large_live(size_t *blocks, size_t *bytes);
/* Unmaps the cached mappings freed longer ago than the purge delay, skipping a cache whose
 * lock is busy; all: every cached mapping, waiting for each lock (malloc_trim, out of
 * memory). Returns the bytes unmapped. */
size_t large_expire(bool all);

/* The fork window for the caches of freed mappings (see arena.h); in the child a cache
 * whose lock a borrower held forgets its mappings (they stay mapped, unused). */
void large_lock_all_for_fork(void);
void large_unlock_all_after_fork(void);
void large_after_fork_child(void);

#endif
