/* The exported names, and nothing else: malloc and free are the inline fast paths of
 * tcache.h compiled in place, the other fm_ functions tail-call alloc.c and stats.c, and
 * every libc name (__libc_*, and the globals of glibc's malloc.o, so a static link never
 * pulls glibc's malloc in beside this one) is an alias of an fm_ function. C++'s names
 * are in override_cxx.c. */
#include <malloc.h>
#include <stdio.h>

#include "alloc.h"
#include "fastmalloc.h"
#include "init.h"
#include "stats.h"

/* Aliases share the code, not glibc's declaration attributes, which is all we want. */
#pragma GCC diagnostic ignored "-Wmissing-attributes"
/* free_sized and free_aligned_sized are free: their extra arguments are not read. */
#pragma GCC diagnostic ignored "-Wattribute-alias"
#define FM_ALIAS(name) __attribute__((alias(#name), used, visibility("default")))

/* The two fast paths each start a cache line, so their placement does not shift with the
 * size of the code linked before them. */
#define FM_HOT_ENTRY __attribute__((aligned(64)))

fm_api FM_HOT_ENTRY void *fm_malloc(size_t size) { return alloc_malloc(size); }

fm_api FM_HOT_ENTRY void fm_free(void *p) { tcache_free(p); }

fm_api void *fm_calloc(size_t count, size_t size) { return alloc_calloc(count, size); }
fm_api void *fm_realloc(void *p, size_t size) { return alloc_realloc(p, size); }
fm_api void *fm_aligned_alloc(size_t align, size_t size) { return alloc_memalign(align, size); }
fm_api int fm_posix_memalign(void **out, size_t align, size_t size) {
  return alloc_posix_memalign(out, align, size);
}
fm_api size_t fm_malloc_usable_size(void *p) { return alloc_usable_size(p); }

/* The public extras. */
fm_api const char *fm_version(void) { return FASTMALLOC_VERSION_STRING; }
fm_api int fm_owns(const void *p) { return alloc_owns(p); }
fm_api size_t fm_mapped_bytes(void) { return os_mapped_bytes(); }
fm_api int fm_trim(void) { return init_trim() > 0; }

/* The rest of glibc's malloc API, exported under its names below. */
void *fm_reallocarray(void *p, size_t count, size_t size) {
  return alloc_reallocarray(p, count, size);
}
void *fm_valloc(size_t size) { return alloc_valloc(size); }
void *fm_pvalloc(size_t size) { return alloc_pvalloc(size); }
int fm_malloc_trim(size_t pad) { return init_trim() > 0; }
int fm_mallopt(int param, int value) { return 1; }   /* accepted; nothing to tune */
struct mallinfo2 fm_mallinfo2(void) { return stats_mallinfo2(); }

static int saturated_int(size_t n) { return n > INT32_MAX ? INT32_MAX : (int)n; }

struct mallinfo fm_mallinfo(void) {
  struct mallinfo2 wide = stats_mallinfo2();
  return (struct mallinfo){.arena = saturated_int(wide.arena),
                           .hblks = saturated_int(wide.hblks),
                           .hblkhd = saturated_int(wide.hblkhd),
                           .uordblks = saturated_int(wide.uordblks),
                           .fordblks = saturated_int(wide.fordblks)};
}

void fm_malloc_stats(void) { stats_print(); }
int fm_malloc_info(int options, FILE *stream) { return stats_print_xml(options, stream); }

/* The C heap's names. A build with FM_LIBC_NAMES=OFF exports the fm_ names alone, so a
 * sanitizer's runtime (or glibc) keeps malloc and the tests reach fastmalloc through fm_. */
#if FM_LIBC_NAMES
void *malloc(size_t) FM_ALIAS(fm_malloc);
void *__libc_malloc(size_t) FM_ALIAS(fm_malloc);
void *__malloc(size_t) FM_ALIAS(fm_malloc);
void free(void *) FM_ALIAS(fm_free);
void cfree(void *) FM_ALIAS(fm_free);
/* C23: the size could stand in for free's class lookup only if it were trusted, and a wrong
 * one would then corrupt the heap; the lookup costs two loads. */
void free_sized(void *, size_t) FM_ALIAS(fm_free);
void free_aligned_sized(void *, size_t, size_t) FM_ALIAS(fm_free);
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
