/* The boundary to the kernel: every system call the allocator makes is behind these
 * functions, implemented in os.c. None of them allocates or changes errno. */
#ifndef FM_OS_H
#define FM_OS_H

#include "config.h"

void *os_map(size_t size);                        /* read-write, zeroed; NULL on failure */
void *os_map_aligned(size_t size, size_t align);  /* as os_map, aligned to align (a power of two) */
/* Whether the kernel may back [addr, addr + size) with transparent huge pages; a kernel
 * built without them refuses, and the mapping stays as it was. */
void os_advise_huge_pages(void *addr, size_t size, bool huge);
/* As os_map, for a table written a few bytes a page: never backed by huge pages, which
 * would make 2 MiB resident for each byte written. */
void *os_map_sparse(size_t size);
void os_unmap(void *addr, size_t size);
bool os_purge(void *addr, size_t size);           /* drop the pages now: RSS falls at once, and
                                                      they read zero; false if the OS refused */
/* Which pages of [addr, addr + size) are resident: bit 0 of vec[i] for page i (mincore);
 * false when the kernel cannot say. */
bool os_resident_pages(const void *addr, size_t size, unsigned char *vec);
/* Grows or shrinks a mapping in place; NULL when it cannot. */
void *os_remap(void *addr, size_t old_size, size_t new_size);
/* Resizes a mapping and moves it wherever the kernel likes (dest NULL) or to dest, which
 * must be free; needs address space only for the growth. NULL when it cannot. */
void *os_remap_move(void *addr, size_t old_size, size_t new_size, void *dest);
/* Moves a mapping of old_size bytes onto mapping dest (mapped with os_map*, new_size >=
 * old_size long); false only when the kernel refuses even a move without growth. */
bool os_move(void *addr, size_t old_size, void *dest, size_t new_size);
size_t os_mapped_bytes(void);
size_t os_mapped_peak_bytes(void);              /* the most os_mapped_bytes has been */

unsigned os_cpu_count(void);
uint64_t os_random64(void);
uint64_t os_now_ns(void);
void os_sleep_ns(uint64_t ns);
const char *os_getenv(const char *name);          /* reads environ; never allocates */

unsigned os_getpid(void);                         /* the raw system call: never cached */

void os_futex_wait(int *addr, int expected);
void os_futex_wake(int *addr, int count);         /* INT32_MAX: all */

void os_write_stderr(const char *text, size_t len);
__attribute__((noreturn)) void os_abort(void);

#endif
