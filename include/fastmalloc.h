/* fastmalloc public header: the extras beyond the C heap API.
 * The libc names (malloc, free, ...) are exported by the library itself; the fm_ names
 * below reach the same allocator even where the libc names are not overridden. */
#ifndef FASTMALLOC_H
#define FASTMALLOC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FASTMALLOC_VERSION_MAJOR 1
#define FASTMALLOC_VERSION_MINOR 0
#define FASTMALLOC_VERSION_PATCH 0
#define FASTMALLOC_VERSION_STRING "1.0.0"

/* "1.0.0": the version of the library actually loaded. */
const char *fm_version(void);

void *fm_malloc(size_t size);
void fm_free(void *ptr);
void *fm_calloc(size_t count, size_t size);
void *fm_realloc(void *ptr, size_t size);
void *fm_aligned_alloc(size_t alignment, size_t size);
int fm_posix_memalign(void **out, size_t alignment, size_t size);
size_t fm_malloc_usable_size(void *ptr);

/* 1 when ptr points into memory fastmalloc holds for blocks (a live or free block, or
 * inside one), else 0; never crashes. A cheap "is this fastmalloc's?" test, not a
 * validity check of ptr as a block. */
int fm_owns(const void *ptr);

/* Bytes currently mapped from the operating system by the allocator (chunks, large
 * blocks and its own metadata). */
size_t fm_mapped_bytes(void);

/* Returns the memory of empty spans and cached large blocks to the OS now.
 * Same as malloc_trim(0): 1 if memory was released, else 0. */
int fm_trim(void);

#ifdef __cplusplus
}
#endif

#endif /* FASTMALLOC_H */
