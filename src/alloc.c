/* The C heap's calls of alloc.h: routing by size and alignment, and the semantics glibc
 * gives each (errno, NULL, what realloc keeps). */
#include "alloc.h"

#include <errno.h>
#include <string.h>

#include "init.h"
#include "mapped.h"

/* A block past the size classes, or an alignment they cannot give (align: a power of two,
 * 0 for none): a page block up to 64 KiB (and as aligned), else a span block (64 KiB
 * aligned) up to 1 MiB, else a mapped block. */
static void *large_block(size_t size, size_t align, large_use use) {
  /* No mapping spans the whole user address space: NULL at once, without the retry's
   * flushes and unmaps. */
  size_t space = (size_t)1 << FM_ADDRESS_BITS;
  if (size >= space || align >= space || !init_process()) {
    errno = ENOMEM;
    return NULL;
  }
  void *p = NULL;
  bool zeroed = false;
  fm_arena *arena = tcache_arena_for_large();
  /* A growing block takes a span only when the OS refuses it a mapping: under an
   * address-space limit, a chunk mapped already may still have room. */
  bool in_pages = size <= FM_UNIT_SIZE && align <= FM_UNIT_SIZE && use != LARGE_GROWING;
  bool span_first = align <= FM_UNIT_SIZE && use != LARGE_GROWING;
  bool span_last = align <= FM_UNIT_SIZE && use == LARGE_GROWING;
  size_t span_size = size < align ? align : size;
  /* Out of memory, maybe once more after giving back the memory held empty. */
  for (bool retried = false; !p; retried = true) {
    if (in_pages) p = arena_alloc_pages(arena, size, align, &zeroed);
    else if (span_first) p = arena_alloc_span_block(arena, span_size, &zeroed);
    if (!p) p = mapped_alloc(size, align, arena, use, &zeroed);
    if (!p && span_last) p = arena_alloc_span_block(arena, span_size, &zeroed);
    if (!p && (retried || !init_release_for_retry())) {
      errno = ENOMEM;
      return NULL;
    }
  }
  if (use == LARGE_ZEROED && !zeroed) memset(p, 0, size);
  return p;
}

/* A block of 12-64 KiB: whole pages of a page span, through the thread's cache once the
 * thread is set up (large_block sets it up, and retries out of memory). */
static void *page_block(size_t size) {
  void *p = tcache_malloc_pages(size);
  return fm_likely(p != NULL) ? p : large_block(size, 0, LARGE_PLAIN);
}

void *alloc_untabled(size_t size) {
  if (size > FM_SMALL_MAX)
    return size <= FM_UNIT_SIZE ? page_block(size) : large_block(size, 0, LARGE_PLAIN);
  return tcache_malloc_class(size_class_of(size), size, true, tcache_malloc_miss);
}

void *alloc_calloc(size_t count, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  if (total > FM_SMALL_MAX) return large_block(total, 0, LARGE_ZEROED);
  if (total >= FM_CALLOC_ZEROED_MIN) return tcache_calloc_zeroed(total);
  void *p = alloc_malloc(total);
  if (fm_likely(p != NULL)) memset(p, 0, total);
  return p;
}

/* Bytes usable in block p (non-NULL) of unit class cls (unit_map_class_checked); fatal
 * report op for a pointer that does not start a live block of ours (a freed one would be
 * handed out twice: realloc would keep it while a cache still holds it). *keepable is
 * false for a block that may be free all the same (tcache_block_state): realloc moves it,
 * so its free reaches the double-free check. */
static size_t usable_size(void *p, unsigned cls, diag_report op, bool *keepable) {
  size_t usable = 0;
  fm_block_state state = BLOCK_LIVE;
  if (cls == FM_CLASS_MAPPED) {
    usable = mapped_usable_size(p, op);
  } else if (cls == FM_CLASS_SPAN_BLOCK) {
    usable = arena_span_block_usable_size(p);
  } else if (cls == FM_CLASS_PAGES) {
    usable = arena_pages_usable_size(p);
    if (usable && tcache_page_block_is_free(p)) state = BLOCK_FREE;
  } else if (cls >= 1 && cls <= FM_NUM_SPAN_CLASSES) {
    usable = arena_small_usable_size(p, cls);
    if (usable) state = tcache_block_state(p, cls);
  }
  if (!usable || state == BLOCK_FREE) diag_fatal(op, p);
  *keepable = state == BLOCK_LIVE;
  return usable;
}

void *alloc_realloc(void *p, size_t size) {
  if (!p) return alloc_malloc(size);
  if (size == 0) {
    tcache_free(p);
    return NULL;
  }
  unsigned cls = unit_map_class_checked(p);
  bool keepable;
  size_t old = usable_size(p, cls, DIAG_INVALID_REALLOC, &keepable);
  /* A block of whole pages gives back its last pages, or takes the free pages that follow
   * it. */
  if (cls == FM_CLASS_PAGES && size > FM_SMALL_MAX && size <= FM_UNIT_SIZE &&
      arena_resize_pages(p, size))
    return p;
  /* Keep the block when the new size fits and wastes no more than half of it, or when no
   * smaller class would serve it. */
  if (keepable && size <= old &&
      (size >= old / 2 || (size <= FM_SMALL_MAX && size_class_of(size) == cls)))
    return p;
  if (cls == FM_CLASS_MAPPED && size > FM_SMALL_MAX && size <= PTRDIFF_MAX) {
    void *resized = mapped_realloc(p, size);   /* mremap: no copy, either way */
    if (resized) return resized;
  }
  bool grows = size > old;
  /* A span block gives back its last units, or grows into free units that follow it,
   * without a copy (beyond FM_REALLOC_MAPPED_MIN, a mapping serves growth better). */
  if (cls == FM_CLASS_SPAN_BLOCK && size > FM_SMALL_MAX && (!grows || size < FM_REALLOC_MAPPED_MIN) &&
      arena_resize_span_block(p, size))
    return p;
  int saved = grows ? 0 : errno;   /* (read only where it is put back) */
  void *q = grows && size >= FM_REALLOC_MAPPED_MIN ? large_block(size, 0, LARGE_GROWING)
                                                : alloc_malloc(size);
  if (!q) {
    if (grows) return NULL;
    errno = saved;   /* out of memory, a smaller block can still be this one */
    return p;
  }
  memcpy(q, p, size < old ? size : old);
  tcache_free(p);
  return q;
}

void *alloc_reallocarray(void *p, size_t count, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  return alloc_realloc(p, total);
}

/* align: a power of two. Small aligned blocks come from a size class whose blocks are
 * all aligned; the rest are large blocks. */
static void *aligned_block(size_t align, size_t size) {
  if (align <= 16) return alloc_malloc(size);
  unsigned cls = size_class_aligned(size, align);
  if (cls) return tcache_malloc_class(cls, size, false, tcache_malloc_miss);
  return large_block(size, align, LARGE_PLAIN);
}

void *alloc_memalign(size_t align, size_t size) {
  if (align > SIZE_MAX / 2 + 1) {
    errno = EINVAL;
    return NULL;
  }
  if (align & (align - 1)) align = (size_t)1 << (64 - __builtin_clzll(align));
  return aligned_block(align, size);
}

int alloc_posix_memalign(void **out, size_t align, size_t size) {
  if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
  int saved = errno;
  void *p = aligned_block(align, size);
  errno = saved;   /* never set, whatever a fallback on the way met */
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}

void *alloc_valloc(size_t size) { return aligned_block(FM_PAGE_SIZE, size); }

void *alloc_pvalloc(size_t size) {
  if (size > SIZE_MAX - FM_PAGE_SIZE) {
    errno = ENOMEM;
    return NULL;
  }
  return aligned_block(FM_PAGE_SIZE, (size + FM_PAGE_SIZE - 1) & ~(size_t)(FM_PAGE_SIZE - 1));
}

size_t alloc_usable_size(void *p) {
  bool keepable;
  return p ? usable_size(p, unit_map_class_checked(p), DIAG_INVALID_USABLE_SIZE, &keepable) : 0;
}

bool alloc_owns(const void *p) { return init_process() && unit_map_class_checked(p) != 0; }
