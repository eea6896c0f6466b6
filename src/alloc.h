/* The C heap's calls, routed by size: a size class's bin (tcache.h), a page block, a span
 * block or a mapped block (arena.h, mapped.h). override.c exports them under their names.
 * Each call keeps the semantics of glibc 2.36 (docs/design.md, "API semantics"). */
#ifndef FM_ALLOC_H
#define FM_ALLOC_H

#include "tcache.h"

/* malloc past the size-indexed table (size > FM_TABLED_MAX). */
fm_noinline void *alloc_untabled(size_t size);

static fm_always_inline void *alloc_malloc(size_t size) {
  if (fm_unlikely(size > FM_TABLED_MAX)) return alloc_untabled(size);
  return tcache_malloc_tabled(size, tcache_malloc_miss);
}

void *alloc_calloc(size_t count, size_t size);
void *alloc_realloc(void *p, size_t size);
void *alloc_reallocarray(void *p, size_t count, size_t size);
/* memalign and aligned_alloc: any alignment, rounded up to a power of two. */
void *alloc_memalign(size_t align, size_t size);
int alloc_posix_memalign(void **out, size_t align, size_t size);
void *alloc_valloc(size_t size);
void *alloc_pvalloc(size_t size);
size_t alloc_usable_size(void *p);
/* Whether p lies in memory fastmalloc holds for blocks (fm_owns). */
bool alloc_owns(const void *p);

#endif
