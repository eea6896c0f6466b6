/* The exported C heap API: malloc and free are the inline fast paths of tcache.h compiled
 * in place; the rest are thin shells over the internal layers. Every other exported name
 * (__libc_*, fm_*, and the globals of glibc's malloc.o, so a static link never pulls
 * glibc's malloc in beside this one) is an alias of these definitions. */
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <string.h>

#include "fastmalloc.h"
#include "large.h"
#include "tcache.h"

/* Aliases share the code, not glibc's declaration attributes, which is all we want. */
#pragma GCC diagnostic ignored "-Wmissing-attributes"
#define FM_ALIAS(name) __attribute__((alias(#name), used, visibility("default")))

/* The two fast paths each start a cache line, so their placement does not shift with the
 * size of the code linked before them: such shifts alone moved bench-malloc-thread by 2-6 %. */
#define FM_HOT_ENTRY __attribute__((aligned(64)))

fm_api FM_HOT_ENTRY void *fm_malloc(size_t size) { return tcache_malloc(size); }

fm_api FM_HOT_ENTRY void fm_free(void *p) { tcache_free(p); }

/* What a large block is for: LARGE_ZEROED, calloc (fresh mappings, and spans of units
 * never used or purged since, are zero already); LARGE_GROWING, a block realloc grows,
 * which is likely to grow again: a mapping of its own, which later growth extends or moves
 * with mremap instead of copying it (a copy into fresh pages costs their faults too: 0.34
 * ms for 1 MiB here). */
typedef enum { LARGE_PLAIN, LARGE_ZEROED, LARGE_GROWING } large_use;

/* A block beyond the size classes, or an alignment they cannot give (align: a power of
 * two, 0 for none): whole pages of a page span up to 64 KiB (and as aligned), else a
 * chunk span (64 KiB aligned) up to 1 MiB, else a mapping of its own. */
static void *large_block(size_t size, size_t align, large_use use) {
  /* No mapping spans the whole user address space: NULL at once, without the retry's
   * flushes and unmaps. */
  size_t space = (size_t)1 << FM_ADDRESS_BITS;
  if (size >= space || align >= space || !fm_init()) {
    errno = ENOMEM;
    return NULL;
  }
  void *p = NULL;
  bool fresh = false;
  fm_arena *arena = tcache_large_arena();
  /* A growing block takes a span only when the OS refuses it a mapping: under an
   * address-space limit, a chunk mapped already may still have room. */
  bool in_pages = size <= FM_UNIT_SIZE && align <= FM_UNIT_SIZE && use != LARGE_GROWING;
  bool span_first = align <= FM_UNIT_SIZE && use != LARGE_GROWING;
  bool span_last = align <= FM_UNIT_SIZE && use == LARGE_GROWING;
  size_t span_size = size < align ? align : size;
  /* Out of memory, maybe once more after giving back the memory held empty. */
  for (bool retried = false; !p; retried = true) {
    if (in_pages) p = arena_alloc_pages(arena, size, align, &fresh);
    else if (span_first) p = arena_alloc_span_large(arena, span_size, &fresh);
    if (!p) p = large_alloc(size, align, arena, &fresh);
    if (!p && span_last) p = arena_alloc_span_large(arena, span_size, &fresh);
    if (!p && (retried || !tcache_release_for_retry())) {
      errno = ENOMEM;
      return NULL;
    }
  }
  if (use == LARGE_ZEROED && !fresh) memset(p, 0, size);
  return p;
}

/* A block of 8-64 KiB: whole pages of a page span, through the thread's cache once the
 * thread is set up (large_block sets it up, and retries out of memory). */
static void *page_block(size_t size) {
  void *p = tcache_malloc_pages(size);
  return fm_likely(p != NULL) ? p : large_block(size, 0, LARGE_PLAIN);
}

/* malloc beyond the thread cache's copy of the size table: a class from the global
 * table, or a large block. */
void *fm_malloc_untabled(size_t size) {
  if (size > FM_SMALL_MAX)
    return size <= FM_UNIT_SIZE ? page_block(size) : large_block(size, 0, LARGE_PLAIN);
  return tcache_malloc_class(fm_size_class(size), size, true);
}

fm_api void *fm_calloc(size_t count, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  if (total > FM_SMALL_MAX) return large_block(total, 0, LARGE_ZEROED);
  if (total >= FM_CALLOC_PAGED_MIN) return tcache_calloc_paged(total);
  void *p = tcache_malloc(total);
  if (fm_likely(p != NULL)) memset(p, 0, total);
  return p;
}

/* Bytes usable in block p (non-NULL) of unit class cls (unit_map_class_checked); fatal
 * report op for a pointer that does not start a live block of ours (a freed one would be
 * handed out twice: realloc would keep it while a cache still holds it). *keepable is
 * false for a block that may be free all the same (tcache_block_state): realloc moves it,
 * so its free reaches the double-free check. */
static size_t usable_size(void *p, unsigned cls, const char *op, bool *keepable) {
  *keepable = true;
  if (cls == FM_CLASS_MAPPED) return large_usable_size(p, op);
  size_t usable = cls && cls != FM_CLASS_BINS ? arena_block_usable_size(p, cls) : 0;
  fm_block_state state = usable && cls <= FM_NUM_SPAN_CLASSES ? tcache_block_state(p, cls) : BLOCK_LIVE;
  if (!usable || state == BLOCK_FREE || (cls == FM_CLASS_PAGES && tcache_page_block_is_free(p)))
    os_fatal(op, p);
  *keepable = state == BLOCK_LIVE;
  return usable;
}

/* realloc gives a block it grows to this size or more a mapping of its own (see
 * LARGE_GROWING); smaller ones are cheap to copy. */
#define REALLOC_MAPPED_MIN ((size_t)256 << 10)

fm_api void *fm_realloc(void *p, size_t size) {
  if (!p) return tcache_malloc(size);
  if (size == 0) {
    tcache_free(p);
    return NULL;
  }
  unsigned cls = unit_map_class_checked(p);
  bool keepable;
  size_t old = usable_size(p, cls, "realloc(): invalid pointer", &keepable);
  /* A block of whole pages gives back its last pages, or takes the free pages that follow
   * it. */
  if (cls == FM_CLASS_PAGES && size > FM_SMALL_MAX && size <= FM_UNIT_SIZE &&
      arena_resize_pages(p, size))
    return p;
  /* Keep the block when the new size fits and wastes no more than half of it, or when no
   * smaller class would serve it. */
  if (keepable && size <= old &&
      (size >= old / 2 || (size <= FM_SMALL_MAX && fm_size_class(size) == cls)))
    return p;
  if (cls == FM_CLASS_MAPPED && size > FM_SMALL_MAX && size <= PTRDIFF_MAX) {
    void *resized = large_realloc(p, size);   /* mremap: no copy, either way */
    if (resized) return resized;
  }
  bool grows = size > old;
  /* A large block in a span gives back its last units, or grows into free units that
   * follow it, without a copy (beyond REALLOC_MAPPED_MIN, a mapping serves growth better). */
  if (cls == FM_CLASS_SPAN_LARGE && size > FM_SMALL_MAX && (!grows || size < REALLOC_MAPPED_MIN) &&
      arena_resize_span_large(p, size))
    return p;
  int saved = grows ? 0 : errno;   /* (read only where it is put back) */
  void *q = grows && size >= REALLOC_MAPPED_MIN ? large_block(size, 0, LARGE_GROWING)
                                                : tcache_malloc(size);
  if (!q) {
    if (grows) return NULL;
    errno = saved;   /* out of memory, a smaller block can still be this one */
    return p;
  }
  memcpy(q, p, size < old ? size : old);
  tcache_free(p);
  return q;
}

void *fm_reallocarray(void *p, size_t count, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  return fm_realloc(p, total);
}

/* align: a power of two. Small aligned blocks come from a size class whose blocks are
 * all aligned; the rest are large blocks. */
static void *aligned_block(size_t align, size_t size) {
  if (align <= 16) return tcache_malloc(size);
  unsigned cls = fm_size_class_aligned(size, align);
  if (cls) return tcache_malloc_class(cls, size, false);
  return large_block(size, align, LARGE_PLAIN);
}

/* glibc 2.36 memalign/aligned_alloc: any alignment, rounded up to a power of two. */
fm_api void *fm_aligned_alloc(size_t align, size_t size) {
  if (align > SIZE_MAX / 2 + 1) {
    errno = EINVAL;
    return NULL;
  }
  if (align & (align - 1)) align = (size_t)1 << (64 - __builtin_clzll(align));
  return aligned_block(align, size);
}

fm_api int fm_posix_memalign(void **out, size_t align, size_t size) {
  if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
  int saved = errno;
  void *p = aligned_block(align, size);
  errno = saved;   /* never set, whatever a fallback on the way met */
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}

void *fm_valloc(size_t size) { return aligned_block(FM_PAGE_SIZE, size); }

void *fm_pvalloc(size_t size) {
  if (size > SIZE_MAX - FM_PAGE_SIZE) {
    errno = ENOMEM;
    return NULL;
  }
  return aligned_block(FM_PAGE_SIZE, (size + FM_PAGE_SIZE - 1) & ~(size_t)(FM_PAGE_SIZE - 1));
}

fm_api size_t fm_malloc_usable_size(void *p) {
  bool keepable;
  return p ? usable_size(p, unit_map_class_checked(p), "malloc_usable_size(): invalid pointer",
                         &keepable)
           : 0;
}

int fm_malloc_trim(size_t pad) { return tcache_trim() > 0; }

int fm_mallopt(int param, int value) { return 1; }   /* accepted; nothing to tune */

/* arena: every byte mapped; hblks, hblkhd: the large blocks in mappings of their own and
 * those mappings' bytes; uordblks: the bytes of every block out, blocks in thread caches
 * included, and of those mappings; fordblks: the rest of what is mapped. */
struct mallinfo2 fm_mallinfo2(void) {
  struct mallinfo2 info = {0};
  if (!fm_init()) return info;
  large_live(&info.hblks, &info.hblkhd);
  info.uordblks = arena_used_bytes() + info.hblkhd;
  info.arena = os_mapped_bytes();
  info.fordblks = info.arena > info.uordblks ? info.arena - info.uordblks : 0;
  return info;
}

static int saturated_int(size_t n) { return n > INT32_MAX ? INT32_MAX : (int)n; }

struct mallinfo fm_mallinfo(void) {
  struct mallinfo2 wide = fm_mallinfo2();
  return (struct mallinfo){.arena = saturated_int(wide.arena),
                           .hblks = saturated_int(wide.hblks),
                           .hblkhd = saturated_int(wide.hblkhd),
                           .uordblks = saturated_int(wide.uordblks),
                           .fordblks = saturated_int(wide.fordblks)};
}

void fm_malloc_stats(void) {
  struct mallinfo2 info = fm_mallinfo2();
  char line[96];
  char *room = line + sizeof line - 22;   /* for a number and "\n" */
  char *end = os_format_u64(os_append(line, room, "fastmalloc: mapped bytes = "), info.arena, 10);
  end = os_format_u64(os_append(end, room, ", in use bytes = "), info.uordblks, 10);
  *end++ = '\n';
  *end = 0;
  os_write_stderr(line);
}

/* The caller's stream may allocate its buffer: that re-enters malloc outside any lock. */
int fm_malloc_info(int options, FILE *stream) {
  if (options != 0) return EINVAL;
  char text[128];
  char *room = text + sizeof text - 1;   /* for the NUL */
  char *end = os_append(text, room - 20,   /* 20: the number's digits */
                        "<malloc version=\"fastmalloc-1\">\n<system type=\"current\" size=\"");
  end = os_append(os_format_u64(end, os_mapped_bytes(), 10), room, "\"/>\n</malloc>\n");
  *end = 0;
  return fputs(text, stream) < 0 ? -1 : 0;
}


/* The public extras. */
fm_api const char *fm_version(void) { return FASTMALLOC_VERSION_STRING; }

fm_api int fm_owns(const void *p) {
  return fm_init() && unit_map_class_checked(p) != 0;
}

fm_api size_t fm_mapped_bytes(void) { return os_mapped_bytes(); }

fm_api int fm_trim(void) { return tcache_trim() > 0; }

/* The C heap's names. A build with FM_LIBC_NAMES=OFF exports the fm_ names alone, so a
 * sanitizer's runtime (or glibc) keeps malloc and the tests reach fastmalloc through fm_. */
#if FM_LIBC_NAMES
void *malloc(size_t) FM_ALIAS(fm_malloc);
void *__libc_malloc(size_t) FM_ALIAS(fm_malloc);
void *__malloc(size_t) FM_ALIAS(fm_malloc);
void free(void *) FM_ALIAS(fm_free);
void cfree(void *) FM_ALIAS(fm_free);
void __libc_free(void *) FM_ALIAS(fm_free);
void __free(void *) FM_ALIAS(fm_free);
void *calloc(size_t, size_t) FM_ALIAS(fm_calloc);
void *__libc_calloc(size_t, size_t) FM_ALIAS(fm_calloc);
void *__calloc(size_t, size_t) FM_ALIAS(fm_calloc);
void *realloc(void *, size_t) FM_ALIAS(fm_realloc);
void *__libc_realloc(void *, size_t) FM_ALIAS(fm_realloc);
void *__realloc(void *, size_t) FM_ALIAS(fm_realloc);
void *reallocarray(void *, size_t, size_t) FM_ALIAS(fm_reallocarray);
void *memalign(size_t, size_t) FM_ALIAS(fm_aligned_alloc);
void *aligned_alloc(size_t, size_t) FM_ALIAS(fm_aligned_alloc);
void *__libc_memalign(size_t, size_t) FM_ALIAS(fm_aligned_alloc);
void *__memalign(size_t, size_t) FM_ALIAS(fm_aligned_alloc);
int posix_memalign(void **, size_t, size_t) FM_ALIAS(fm_posix_memalign);
int __posix_memalign(void **, size_t, size_t) FM_ALIAS(fm_posix_memalign);
void *valloc(size_t) FM_ALIAS(fm_valloc);
void *__libc_valloc(size_t) FM_ALIAS(fm_valloc);
void *__valloc(size_t) FM_ALIAS(fm_valloc);
void *pvalloc(size_t) FM_ALIAS(fm_pvalloc);
void *__libc_pvalloc(size_t) FM_ALIAS(fm_pvalloc);
void *__pvalloc(size_t) FM_ALIAS(fm_pvalloc);
size_t malloc_usable_size(void *) FM_ALIAS(fm_malloc_usable_size);
size_t __malloc_usable_size(void *) FM_ALIAS(fm_malloc_usable_size);
int malloc_trim(size_t) FM_ALIAS(fm_malloc_trim);
int __malloc_trim(size_t) FM_ALIAS(fm_malloc_trim);
int mallopt(int, int) FM_ALIAS(fm_mallopt);
int __libc_mallopt(int, int) FM_ALIAS(fm_mallopt);
int __mallopt(int, int) FM_ALIAS(fm_mallopt);
struct mallinfo2 mallinfo2(void) FM_ALIAS(fm_mallinfo2);
struct mallinfo2 __libc_mallinfo2(void) FM_ALIAS(fm_mallinfo2);
struct mallinfo2 __mallinfo2(void) FM_ALIAS(fm_mallinfo2);
struct mallinfo mallinfo(void) FM_ALIAS(fm_mallinfo);
struct mallinfo __libc_mallinfo(void) FM_ALIAS(fm_mallinfo);
struct mallinfo __mallinfo(void) FM_ALIAS(fm_mallinfo);
void malloc_stats(void) FM_ALIAS(fm_malloc_stats);
void __malloc_stats(void) FM_ALIAS(fm_malloc_stats);
int malloc_info(int, FILE *) FM_ALIAS(fm_malloc_info);
int __malloc_info(int, FILE *) FM_ALIAS(fm_malloc_info);

/* Hooks glibc's static fork and thread exit call in its own malloc: ours are installed
 * with pthread_atfork and a thread key instead. */
fm_api void __malloc_fork_lock_parent(void) {}
fm_api void __malloc_fork_unlock_parent(void) {}
fm_api void __malloc_fork_unlock_child(void) {}
fm_api void __malloc_arena_thread_freeres(void) {}
fm_api void *__glibc_morecore(ptrdiff_t increment) { return NULL; }
#endif
