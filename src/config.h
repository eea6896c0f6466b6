/* Build variants and layout constants: the one place every knob of the build lives.
 * Nothing here allocates or calls the OS. */
#ifndef FM_CONFIG_H
#define FM_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifndef FM_DEBUG
#define FM_DEBUG 0
#endif
/* While glibc says the process has one thread, skip locks and atomics. */
#ifndef FM_SINGLE_THREAD_FLAG
#define FM_SINGLE_THREAD_FLAG 1
#endif

/* Double-free mark (DESIGN §6): free() writes a per-process key into the freed block and
 * checks for it first, so a second free() of a cached block is caught at once. Without it
 * (a variant for measuring what the mark costs), a double free is caught only when the
 * thread's cache gives the block back to its span, and not at all if malloc hands the block
 * out again first. */
/* Export the C heap's names (malloc, free, ...) besides the fm_ ones. Off only for the
 * sanitizer builds, whose runtimes keep the C heap for themselves. */
#ifndef FM_LIBC_NAMES
#define FM_LIBC_NAMES 1
#endif

#ifndef FM_FREE_MARK
#define FM_FREE_MARK 1
#endif

#define FM_UNIT_SHIFT 16                      /* spans are runs of 64 KiB units */
#define FM_UNIT_SIZE ((size_t)1 << FM_UNIT_SHIFT)
#define FM_CHUNK_SHIFT 22                     /* chunks: 4 MiB, aligned to their size */
#define FM_CHUNK_SIZE ((size_t)1 << FM_CHUNK_SHIFT)
#define FM_UNITS_PER_CHUNK (FM_CHUNK_SIZE / FM_UNIT_SIZE)
#define FM_ADDRESS_BITS 47                    /* x86_64 user space */
#define FM_PAGE_SIZE 4096u

#define fm_likely(x) __builtin_expect(!!(x), 1)
#define fm_unlikely(x) __builtin_expect(!!(x), 0)
#define fm_noinline __attribute__((noinline))
#define fm_always_inline inline __attribute__((always_inline))
#define fm_api __attribute__((visibility("default")))
/* Internal globals: direct rip-relative access, never through the GOT. */
#define fm_hidden __attribute__((visibility("hidden")))

/* Debug assertions: compiled out of release builds, so never on the fast path there. */
#if FM_DEBUG
#define fm_assert(cond) \
  ((cond) ? (void)0 : fm_assert_fail(#cond, __FILE__, __LINE__))
#else
#define fm_assert(cond) ((void)0)
#endif
__attribute__((noreturn, cold)) void fm_assert_fail(const char *what, const char *file, int line);

#endif
