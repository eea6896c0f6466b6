/* The per-thread cache and the malloc/free fast paths, inlined into the exported
 * functions. A hit is: no call, no lock, no atomic, no errno write, no "initialised?"
 * test. Every miss tail-calls a noinline slow path in tcache.c.
 * Measured cost (x86-64, gcc 12, hardening on): malloc hit 20 instructions, free hit 18. */
#ifndef FM_TCACHE_H
#define FM_TCACHE_H

#include "arena.h"

typedef struct fm_tcache {
  void *head[FM_BINS];       /* LIFO of free blocks per class; links encoded */
  int32_t room[FM_BINS];     /* blocks the bin may still take: limit - count */
  /* A copy of fm_class_of_granule, so malloc indexes it off the cache pointer it holds
   * anyway (one instruction less than a PIC global); all 0 in the sentinels. */
  uint8_t class_of_granule[(FM_SMALL_MAX >> 4) + 1];
  int32_t limit[FM_BINS];    /* adaptive bound on the bin (slow path only) */
  uint8_t activity[FM_BINS]; /* BIN_REFILLED | BIN_OVERFLOWED since the last idle sweep */
  fm_arena *arena;
  size_t limit_bytes;        /* sum of limit * block size: held under the byte budget */
  uint32_t misses;           /* slow-path visits since the last idle sweep */
  struct fm_tcache *next_free;
} fm_tcache;

/* The thread's cache. It starts at a static sentinel whose bins are all empty and full
 * at once, so the first malloc and the first free take the slow path, which sets the
 * thread up. After the thread's exit it points at a second such sentinel. Free's fast
 * path decrements room before testing it; on a sentinel that only ever writes values
 * <= 0 (its heads stay NULL), so threads sharing one need no synchronisation. */
extern fm_hidden __thread fm_tcache *fm_tc __attribute__((tls_model("initial-exec")));

/* Never inlined (not even under LTO): the fast paths tail-call them. */
fm_noinline void *tcache_malloc_miss(size_t size);
fm_noinline void *tcache_malloc_class_miss(unsigned cls);
/* Called with room[cls] already decremented by the fast path. */
fm_noinline void tcache_free_miss(void *p);
fm_noinline void *fm_malloc_large(size_t size);
__attribute__((noreturn, cold)) void tcache_corrupt(const void *block);

/* Pops a block from a bin known to be non-empty. */
static fm_always_inline void *tcache_pop(fm_tcache *tc, unsigned cls, void *block) {
  void *next = fm_decode(*(uintptr_t *)block);
  if (fm_unlikely((uintptr_t)next & 15)) tcache_corrupt(block);
  tc->head[cls] = next;
  __builtin_prefetch(next);   /* the next malloc of this class reads its link */
  tc->room[cls]++;
  ((uintptr_t *)block)[1] = 0;   /* clear the double-free mark */
  return block;
}

/* Links a freed block onto its bin, marking it freed; the caller accounts for room. */
static fm_always_inline void tcache_link(fm_tcache *tc, unsigned cls, void *p, uintptr_t mark) {
  ((uintptr_t *)p)[1] = mark;
  *(uintptr_t *)p = fm_encode(tc->head[cls]);
  tc->head[cls] = p;
}

static fm_always_inline void *tcache_malloc(size_t size) {
  if (fm_unlikely(size > FM_SMALL_MAX)) return fm_malloc_large(size);
  fm_tcache *tc = fm_tc;
  unsigned cls = tc->class_of_granule[(size + 15) >> 4];
  void *block = tc->head[cls];
  if (fm_unlikely(!block)) return tcache_malloc_miss(size);
  return tcache_pop(tc, cls, block);
}

/* A block of class cls, for requests that pick their class themselves (aligned ones). */
static fm_always_inline void *tcache_malloc_class(unsigned cls) {
  fm_tcache *tc = fm_tc;
  void *block = tc->head[cls];
  if (fm_unlikely(!block)) return tcache_malloc_class_miss(cls);
  return tcache_pop(tc, cls, block);
}

static fm_always_inline void tcache_free(void *p) {
  unsigned cls = fm_unit_class(p);   /* 0 for NULL and foreign pointers: bin 0 is full */
  fm_tcache *tc = fm_tc;
  if (fm_unlikely(--tc->room[cls] < 0)) return tcache_free_miss(p);
  uintptr_t mark = fm_mark;   /* a key of its own: reading a freed block reveals not fm_key */
  if (fm_unlikely(((uintptr_t *)p)[1] == mark)) return tcache_free_miss(p);  /* double free? */
  tcache_link(tc, cls, p, mark);
}

/* Global set-up on the first call (before or without constructors); true when ready. */
bool fm_init(void);
/* The calling thread's arena, for paths that bypass the cache. */
fm_arena *tcache_arena(void);
/* Flushes the calling thread's cache and purges every arena: malloc_trim(0). */
size_t tcache_trim(void);

#endif
