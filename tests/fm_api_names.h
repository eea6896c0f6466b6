/* Routes a test's C heap calls to fastmalloc's fm_ names: for the sanitizer builds, whose
 * library exports the fm_ names alone (FM_LIBC_NAMES=OFF) so that the sanitizer's runtime
 * keeps malloc. Force it in first (-include fm_api_names.h) or include it before anything. */
#ifndef FM_API_NAMES_H
#define FM_API_NAMES_H

/* Every system header a test may take in, before the names are redefined: their own
 * declarations of malloc and the rest keep the libc names. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fastmalloc.h>

#define FM_API_NAMES 1

/* The names fastmalloc.h declares. */
#define malloc fm_malloc
#define free fm_free
#define calloc fm_calloc
#define realloc fm_realloc
#define aligned_alloc fm_aligned_alloc
#define posix_memalign fm_posix_memalign
#define malloc_usable_size fm_malloc_usable_size
#define malloc_trim(pad) fm_trim()

/* The rest, over those: what the library's own versions do (src/override.c). */
#define memalign fm_aligned_alloc
#define valloc(size) fm_aligned_alloc(4096, (size))
#define pvalloc(size) fm_api_pvalloc(size)
#define reallocarray fm_api_reallocarray

static inline void *fm_api_pvalloc(size_t size) {
  if (size > SIZE_MAX - 4096) {
    errno = ENOMEM;
    return NULL;
  }
  return fm_aligned_alloc(4096, (size + 4095) & ~(size_t)4095);
}

static inline void *fm_api_reallocarray(void *p, size_t count, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  return fm_realloc(p, total);
}

/* Under ThreadSanitizer: test_threads starts threads in a fork child, which TSan's default
 * settings end at once; TSAN_OPTIONS still overrides this. */
#ifndef __has_feature
#define __has_feature(x) 0
#endif
#if defined(__SANITIZE_THREAD__) || __has_feature(thread_sanitizer)
const char *__tsan_default_options(void);
const char *__tsan_default_options(void) { return "die_after_fork=0"; }
#endif

#endif
