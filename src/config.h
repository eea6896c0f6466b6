/* The build's variants, the layout's constants and the policy's numbers: every knob of
 * fastmalloc lives here, each with the reason for its value. Nothing here allocates or
 * calls the OS. (Run-time settings, read from the environment: options.h.) */
#ifndef FM_CONFIG_H
#define FM_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- Variants (CMake options of the same names) ---- */

/* Invariant checks (fm_assert) on every path: Debug builds. Never on the fast path of a
 * release build. */
#ifndef FM_DEBUG
#define FM_DEBUG 0
#endif
/* While glibc says the process has one thread, skip locks and atomics (lock.h). */
#ifndef FM_SINGLE_THREAD_FLAG
#define FM_SINGLE_THREAD_FLAG 1
#endif
/* The double-free check (bin.h): no block is handed out twice, every double free is
 * reported. Off only to measure what it costs. */
#ifndef FM_FREE_MARK
#define FM_FREE_MARK 1
#endif
/* Export the C heap's names (malloc, free, ...) besides the fm_ ones. Off only for the
 * sanitizer builds, whose runtimes keep the C heap for themselves. */
#ifndef FM_LIBC_NAMES
#define FM_LIBC_NAMES 1
#endif

/* ---- Layout ---- */

#define FM_PAGE_SIZE 4096u
#define FM_UNIT_SHIFT 16                      /* spans are runs of 64 KiB units */
#define FM_UNIT_SIZE ((size_t)1 << FM_UNIT_SHIFT)
#define FM_CHUNK_SHIFT 22                     /* chunks: 4 MiB, aligned to their size */
#define FM_CHUNK_SIZE ((size_t)1 << FM_CHUNK_SHIFT)
#define FM_UNITS_PER_CHUNK (FM_CHUNK_SIZE / FM_UNIT_SIZE)
#define FM_PAGES_PER_UNIT (FM_UNIT_SIZE / FM_PAGE_SIZE)
#define FM_ADDRESS_BITS 47                    /* x86_64 user space */
#define FM_CACHE_LINE 64

/* ---- Policy ---- */

/* Arenas: one per CPU the process may run on (or FASTMALLOC_ARENAS), at most this many. */
#define FM_ARENAS_MAX 64
/* An arena maps as many chunks at once as it has (1, 2, 4 ...), at most this many: mmap
 * takes the kernel's mapping lock, which stalls every thread's page faults, while a small
 * heap should hold no address space ahead of its needs. */
#define FM_CHUNK_BATCH_MAX 8
/* Empty chunks a purge tick leaves mapped (purged), for a heap that breathes. */
#define FM_EMPTY_CHUNKS_KEPT 2
/* A span of small blocks is the fewest units (at most this many) that waste at most 1/16
 * of the span; one unit for blocks over 4 KiB, so each such class pins few pages. */
#define FM_SPAN_UNITS_MAX 8
/* Span blocks (one block a span) up to this many units, 1 MiB; larger blocks are mapped. */
#define FM_SPAN_BLOCK_UNITS_MAX 16
/* An empty span waits a purge tick with its class, so a class that empties and refills
 * does not churn through its chunk: up to 4 MiB of spans a size class, 16 page spans, and
 * 1 MiB of span blocks (a loop of one size reuses its span; blocks of changing sizes
 * find the units in the chunk, where freed neighbours join). */
#define FM_KEPT_SPAN_BYTES ((size_t)4 << 20)
#define FM_KEPT_PAGE_SPANS 16
#define FM_KEPT_SPAN_BLOCK_UNITS 16
/* Dirty free units an arena keeps when another arena grows (arena_offset_growth): 8 MiB
 * of slack for its own next spans. Less costs page faults: an arena whose units are
 * purged faults them in again when its threads grow back (with 4 MiB, twice the pages
 * purged in a many-thread stress, and a fifth more time). */
#define FM_DIRTY_FREE_UNITS_KEPT 128
/* Purge ticks over which an arena's demand for units is its most in one (arena.c). */
#define FM_DEMAND_TICKS 4

/* Once this much is mapped, the new mappings of blocks past 1 MiB (but calloc's, which a
 * program may write little of) ask for transparent huge pages (MADV_HUGEPAGE; the kernel's
 * default leaves them to programs that ask): a program that fills big blocks then faults
 * them in 2 MiB at a time, with a 512th of the faults, and misses the TLB less. A small
 * heap never asks: a huge page makes 2 MiB resident for any byte of it touched. Chunks
 * never ask: their purged units would come back whole. (FASTMALLOC_HUGE_PAGES=0: never.) */
#define FM_HUGE_PAGES_FROM ((size_t)64 << 20)

/* Mapped blocks' mappings: sizes and starts are multiples of 2 MiB, the reach of one page
 * table, which mremap moves whole (pages moved a table at a time are as fast to use as
 * before; moved entry by entry, some kernels make each costly to touch again). */
#define FM_MAPPED_ALIGN ((size_t)2 << 20)
/* Freed mappings wait in a cache per arena for the next mapped block: 16 mappings and
 * 64 MiB a cache, 64 MiB in all (32 MiB an arena when there are more than two), or half
 * the live mapped blocks' bytes when more. A mapping too big for a request leaves the
 * rest cached (one for realloc's growing block is cut down only when over 4x and 8 MiB
 * too big). */
#define FM_MAPPED_CACHE_SLOTS 16
#define FM_MAPPED_CACHE_BYTES ((size_t)64 << 20)
#define FM_MAPPED_CACHE_ARENA_SHARE ((size_t)32 << 20)
#define FM_MAPPED_TAKE_SLACK ((size_t)8 << 20)
/* realloc gives a block it grows to this size or more a mapping of its own, which later
 * growth extends or moves with mremap instead of copying it; smaller ones are cheap to
 * copy. */
#define FM_REALLOC_MAPPED_MIN ((size_t)256 << 10)
/* calloc of this size or more (up to the size classes) may skip the clear for a block the
 * arena knows reads zero: the pages a growing heap's callers never write stay out of RSS. */
#define FM_CALLOC_ZEROED_MIN FM_PAGE_SIZE

/* Thread caches. Requests up to FM_TABLED_MAX find their class in a table indexed by the
 * size (size_class_of_size), inline; larger ones call out to the granule table. */
#define FM_TABLED_MAX 1024u
/* A bin starts with room for about 1 KiB (1 to 16 blocks), so a thread that allocates
 * little holds little, and doubles on each miss up to about 2 MiB, at most 2048 blocks.
 * Blocks over 4 KiB stop at 256 KiB (21 to 51 blocks): each pins its pages, but a thread
 * that replaces such blocks at random misses a small bin every few calls, and each miss
 * takes an arena's lock; threads that pass such blocks to each other (a pool's workers)
 * would flush a bin of half that every few frees. */
#define FM_BIN_START_BYTES 1024
#define FM_BIN_START_BLOCKS_MAX 16
#define FM_BIN_START_ROOM_MIN 4
#define FM_BIN_MAX_BYTES ((size_t)2 << 20)
#define FM_BIN_MAX_BYTES_LARGE ((size_t)256 << 10)
#define FM_BIN_MAX_BLOCKS 2048
/* A thread keeps up to 4 freed page blocks of each length for its next mallocs, and 256 KiB
 * of them in all: a program that replaces blocks of a few lengths at random finds one most
 * of the time, while a thread that holds a few of every length pins no more pages than
 * one of each (528 KiB) did. */
#define FM_PAGE_BLOCKS_A_LENGTH 4
#define FM_PAGE_CACHE_PAGES 64
/* A refill brings at most about 8 KiB (at least 32 blocks; over 4 KiB, 32 KiB and 2 to 4
 * blocks): a thread that only allocates would otherwise hold half its bin ahead of use. */
#define FM_REFILL_BYTES 8192
#define FM_REFILL_BLOCKS_MIN 32
#define FM_REFILL_BLOCKS_LARGE 4
#define FM_REFILL_BYTES_LARGE ((size_t)32 << 10)
/* A threaded refill whose first block shares a cache line with a block it did not bring
 * (another thread's, maybe) hands out first one of its next blocks whose lines it brought
 * whole: the first this many blocks are looked at. */
#define FM_REFILL_LINE_TRIES 8
/* A bin that only takes frees (a consumer's) holds at least 4 KiB and 8 blocks before it
 * gives its blocks back, in batches of at most 256 pointers (2 KiB of stack). */
#define FM_FREE_ONLY_BIN_BYTES 4096
#define FM_FREE_ONLY_MIN_BLOCKS 8
#define FM_FREE_ONLY_BATCH 256
/* An arena's box of the small blocks of one class handed over to it holds at most 128
 * (1 KiB of pointers) and 32 KiB of blocks (at least one); what does not fit goes back to
 * the spans. */
#define FM_HANDED_OVER_BOX 128
#define FM_HANDED_OVER_BOX_BYTES ((size_t)32 << 10)
/* The idle sweep runs every 256 slow-path visits, and after each purge tick. */
#define FM_SWEEP_MISSES 256
/* A bin takes at most 1024 frees between two slow paths, each of which reads the purge
 * clock: a thread that only cycles blocks through its bins still lets its arena purge. */
#define FM_TICK_FREES 1024
/* And a thread that mallocs or frees page blocks, every 16 of those calls (a read of the
 * clock is a call into the vDSO, dear next to a page block's malloc). */
#define FM_TICK_PAGE_FREES 16
/* A bin whose countdown runs out while it is at most half full cycles its blocks (frees
 * as many as it mallocs): its limit doubles, up to 32 KiB of blocks, so that its
 * countdown, bounded by the room it has left, grows long. It holds no more blocks for it. */
#define FM_CYCLING_BIN_BYTES ((size_t)32 << 10)
/* All threads' bins together grow past their start by at most 8 x the per-thread budget;
 * past 8 live threads, each grows to its share of that. */
#define FM_GROWN_BUDGETS 8
/* Finished threads' bins' arrays kept for the next threads. */
#define FM_BINS_POOL_MAX 256

/* ---- Compiler ---- */

#define fm_likely(x) __builtin_expect(!!(x), 1)
#define fm_unlikely(x) __builtin_expect(!!(x), 0)
#define fm_noinline __attribute__((noinline))
#define fm_always_inline inline __attribute__((always_inline))
#define fm_api __attribute__((visibility("default")))
/* Internal globals: direct rip-relative access, never through the GOT. */
#define fm_hidden __attribute__((visibility("hidden")))

/* Debug assertions: compiled out of release builds (diag.c reports a failed one). */
#if FM_DEBUG
#define fm_assert(cond) ((cond) ? (void)0 : diag_assert_failed(#cond, __FILE__, __LINE__))
#else
#define fm_assert(cond) ((void)0)
#endif
__attribute__((noreturn, cold)) void diag_assert_failed(const char *what, const char *file,
                                                        int line);

#endif
