/* Slow paths of the thread cache: refill and flush in batches, adaptive bin limits under a
 * byte budget, thread set-up and exit, process set-up, fork handlers. Everything here is
 * reached only on a miss of the inline fast paths in tcache.h. */
#include "tcache.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "large.h"
#include "options.h"

/* The sentinels: every bin empty (malloc misses) and full (free misses). */
static fm_tcache tcache_boot;
static fm_tcache tcache_dead;
__thread fm_tcache *fm_tc __attribute__((tls_model("initial-exec"))) = &tcache_boot;

static fm_lock_t init_lock = FM_LOCK_INIT;
static _Atomic int init_done;
static bool init_tried;   /* set-up runs once: a failure is final (malloc answers ENOMEM) */
static _Atomic int atfork_registered;
static pthread_key_t thread_key;

static fm_lock_t pool_lock = FM_LOCK_INIT;
static fm_tcache *pool_free;
static char *pool_bump, *pool_end;
static unsigned next_arena;

/* Bin bounds per class: a thread starts with about 1 KiB (at least one block) a bin, so a
 * thread that allocates little holds little, and a bin doubles on each miss, up to about
 * 2 MiB (128 KiB for blocks over 4 KiB), while the thread's byte budget allows. */
static int32_t limit_start[FM_BINS], limit_max[FM_BINS];
static size_t start_bytes;   /* a thread's limit_bytes at start: sum of limit_start * size */
/* What all threads' bins have grown beyond their start limits, in bytes: held under
 * 8 x the per-thread budget, so 400 busy threads do not hold 400 full budgets. */
static size_t grown_bytes;   /* through fm_count_add */

/* At most about 16 KiB (or 32 blocks; 4 of those over 4 KiB) a refill: a thread that only
 * allocates (a producer) would otherwise hold, and touch, half its bin's limit ahead of
 * use. */
static unsigned refill_max[FM_BINS];

static void fork_prepare(void);
static void fork_parent(void);
static void fork_child(void);
static void tcache_thread_exit(void *arg);

void tcache_corrupt(const void *block) { os_fatal("malloc(): corrupted free list at", block); }

static void limits_init(void) {
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
    int32_t size = (int32_t)fm_class_size[cls];
    /* Blocks of several pages are cached sparingly: the memory they pin costs more than
     * the arena trip they save. */
    int32_t start = (1 << 10) / size, most = (size > 4096 ? 128 << 10 : 2 << 20) / size;
    limit_start[cls] = start < 1 ? 1 : start > 16 ? 16 : start;
    start_bytes += (size_t)limit_start[cls] * fm_class_size[cls];
    limit_max[cls] = most < 4 ? 4 : most > 2048 ? 2048 : most;
    unsigned batch = (16u << 10) / (unsigned)size;
    refill_max[cls] = size > 4096 ? 4 : batch < 32 ? 32 : batch;
  }
}

bool fm_init(void) {
  if (fm_likely(atomic_load_explicit(&init_done, memory_order_acquire))) return true;
  fm_lock(&init_lock, true);
  if (!init_tried) {
    init_tried = true;
    fm_options_init();
    fm_size_class_init();
    limits_init();
    fm_key = (uintptr_t)os_random64();
    fm_mark = (uintptr_t)os_random64();
    arena_init_all();
    if (fm_unit_map_init() && pthread_key_create(&thread_key, tcache_thread_exit) == 0)
      atomic_store_explicit(&init_done, 1, memory_order_release);
  }
  bool ok = atomic_load_explicit(&init_done, memory_order_relaxed);
  fm_unlock(&init_lock, true);
  /* Last, outside the lock: glibc may malloc while registering, which now just works. */
  if (ok && !atomic_exchange(&atfork_registered, 1))
    pthread_atfork(fork_prepare, fork_parent, fork_child);
  return ok;
}

__attribute__((constructor(101))) static void fm_constructor(void) { fm_init(); }

static fm_tcache *pool_take(void) {
  bool threaded = fm_threaded();
  fm_lock(&pool_lock, threaded);
  fm_tcache *tc = pool_free;
  if (tc) {
    pool_free = tc->next_free;
  } else {
    if (pool_end - pool_bump < (ptrdiff_t)sizeof(fm_tcache)) {
      size_t bytes = 64 * 1024;
      pool_bump = os_map(bytes);
      pool_end = pool_bump ? pool_bump + bytes : NULL;
    }
    if (pool_bump) {
      tc = (fm_tcache *)pool_bump;
      pool_bump += (sizeof(fm_tcache) + 63) & ~(size_t)63;
    }
  }
  if (tc) tc->arena = &fm_arenas[next_arena++ % fm_arena_count];
  fm_unlock(&pool_lock, threaded);
  return tc;
}

static void pool_give(fm_tcache *tc) {
  bool threaded = fm_threaded();
  fm_lock(&pool_lock, threaded);
  tc->next_free = pool_free;
  pool_free = tc;
  fm_unlock(&pool_lock, threaded);
}

/* Sets up the calling thread's cache; the dead sentinel when that is impossible. */
static fm_tcache *tcache_thread_start(void) {
  if (!fm_init()) return &tcache_dead;
  /* The first call's set-up may have allocated (pthread_atfork), setting this thread up. */
  if (fm_tc != &tcache_boot) return fm_tc;
  fm_tcache *tc = pool_take();
  if (!tc) return &tcache_dead;
  fm_arena *arena = tc->arena;
  *tc = (fm_tcache){.arena = arena};
  memcpy(tc->class_of_granule, fm_class_of_granule, sizeof tc->class_of_granule);
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++)
    tc->limit[cls] = tc->room[cls] = limit_start[cls];
  tc->limit_bytes = start_bytes;
  /* Install before pthread_setspecific: it callocs for high key numbers. */
  fm_tc = tc;
  pthread_setspecific(thread_key, tc);
  return tc;
}

static fm_tcache *tcache_current(void) {
  fm_tcache *tc = fm_tc;
  return tc == &tcache_boot ? tcache_thread_start() : tc;
}

fm_arena *tcache_arena(void) {
  fm_tcache *tc = tcache_current();
  return tc == &tcache_dead ? &fm_arenas[0] : tc->arena;
}

/* Takes the newest blocks of a bin so that `keep` stay, chained in front of `rest`: the
 * ones just freed are still in the CPU cache, so walking them to their spans costs no
 * misses. Returns the chain (rest itself when the bin holds no more than `keep`). */
static void *tcache_take_newest(fm_tcache *tc, unsigned cls, int32_t keep, void *rest) {
  int32_t count = tc->limit[cls] - tc->room[cls];
  if (count <= keep) return rest;
  void *taken = tc->head[cls], *last = taken;
  for (int32_t i = 1; i < count - keep; i++) last = fm_decode(*(uintptr_t *)last);
  tc->head[cls] = fm_decode(*(uintptr_t *)last);
  *(uintptr_t *)last = fm_encode(rest);
  tc->room[cls] = tc->limit[cls] - keep;
  return taken;
}

static void tcache_shrink_bin(fm_tcache *tc, unsigned cls, int32_t keep) {
  void *chain = tcache_take_newest(tc, cls, keep, NULL);
  if (chain) arena_free_chain(chain);
}

static void tcache_set_limit(fm_tcache *tc, unsigned cls, int32_t limit) {
  int32_t count = tc->limit[cls] - tc->room[cls];
  if (count > limit) tcache_shrink_bin(tc, cls, limit);
  count = tc->limit[cls] - tc->room[cls];
  size_t old_bytes = (size_t)tc->limit[cls] * fm_class_size[cls];
  size_t new_bytes = (size_t)limit * fm_class_size[cls];
  tc->limit_bytes = tc->limit_bytes - old_bytes + new_bytes;
  fm_count_add(&grown_bytes, new_bytes - old_bytes);
  tc->limit[cls] = limit;
  tc->room[cls] = limit - count;
}

/* What a bin's slow paths saw since the last idle sweep. */
enum { BIN_REFILLED = 1, BIN_OVERFLOWED = 2 };

/* Every few hundred misses, bins that neither missed nor overflowed since the last sweep
 * give back half their blocks and half their limit: a quiet thread holds little memory,
 * while a thread that only frees for a while keeps the bins it frees into. */
static void tcache_idle_sweep(fm_tcache *tc) {
  if (++tc->misses < 256) return;
  tc->misses = 0;
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
    if (!tc->activity[cls] && tc->limit[cls] > limit_start[cls]) {
      int32_t half = tc->limit[cls] / 2;
      tcache_set_limit(tc, cls, half < limit_start[cls] ? limit_start[cls] : half);
    } else if (!tc->activity[cls] && tc->head[cls]) {
      tcache_shrink_bin(tc, cls, (tc->limit[cls] - tc->room[cls]) / 2);
    }
    tc->activity[cls] = 0;
  }
}

/* Doubles the bin's limit while under its maximum, the thread's byte budget and the
 * process-wide bound on grown caches. */
static bool tcache_grow(fm_tcache *tc, unsigned cls) {
  int32_t limit = tc->limit[cls];
  size_t added = (size_t)limit * fm_class_size[cls];
  size_t budget = fm_options.tcache_max_bytes;
  size_t all_budget = budget > SIZE_MAX / 8 ? SIZE_MAX : 8 * budget;
  if (limit >= limit_max[cls] || tc->limit_bytes + added > budget ||
      __atomic_load_n(&grown_bytes, __ATOMIC_RELAXED) + added > all_budget)
    return false;
  tcache_set_limit(tc, cls, limit * 2 > limit_max[cls] ? limit_max[cls] : limit * 2);
  return true;
}

static bool tcache_refill(fm_tcache *tc, unsigned cls) {
  /* slow start: a bin that keeps missing grows */
  if (tc->activity[cls] & BIN_REFILLED) tcache_grow(tc, cls);
  uintptr_t chain;
  unsigned want = (unsigned)(tc->limit[cls] + 1) / 2;
  if (want > refill_max[cls]) want = refill_max[cls];
  unsigned got = arena_alloc_batch(tc->arena, cls, want, &chain);
  if (!got) return false;
  tc->head[cls] = (void *)chain;
  tc->room[cls] = tc->limit[cls] - (int32_t)got;
  tc->activity[cls] |= BIN_REFILLED;
  return true;
}

enum { FLUSH_MAX = 256 };   /* the most blocks one overflow gives back */

/* Free found the bin full: grow it if this thread also allocates from it (a thread that
 * only frees, like a consumer of messages, gains nothing from holding blocks), else give
 * its newest blocks back to the arenas in one batch. */
static void tcache_overflow(fm_tcache *tc, unsigned cls) {
  bool grown = (tc->activity[cls] & BIN_REFILLED) && tcache_grow(tc, cls);
  if (!grown) {
    /* Half the bin, but at most FLUSH_MAX blocks: the walk to their spans then stays in
     * the newest, still cached lines (half of a 2048-block bin would not fit in L1). */
    int32_t keep = tc->limit[cls] / 2, count = tc->limit[cls] - tc->room[cls];
    if (count - keep > FLUSH_MAX) keep = count - FLUSH_MAX;
    tcache_shrink_bin(tc, cls, keep);
  }
  tc->activity[cls] |= BIN_OVERFLOWED;
}

/* Every bin in one chain, so the arenas are locked once each, not once a bin. */
static void tcache_flush_all(fm_tcache *tc) {
  void *chain = NULL;
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++)
    chain = tcache_take_newest(tc, cls, 0, chain);
  if (chain) arena_free_chain(chain);
}

static void tcache_thread_exit(void *arg) {
  fm_tcache *tc = arg;
  fm_tc = &tcache_dead;
  tcache_flush_all(tc);
  fm_count_add(&grown_bytes, start_bytes - tc->limit_bytes);
  pool_give(tc);
}

/* One block straight from the arena, for threads whose cache is gone. */
static void *arena_malloc_one(unsigned cls) {
  uintptr_t chain;
  if (!arena_alloc_batch(&fm_arenas[0], cls, 1, &chain)) return NULL;
  ((uintptr_t *)chain)[1] = 0;
  return (void *)chain;
}

/* A malloc that missed in bin cls: refill the bin, or, for a thread whose cache is gone,
 * one block straight from an arena. */
static void *malloc_slow(fm_tcache *tc, unsigned cls) {
  void *block;
  if (fm_unlikely(tc == &tcache_dead)) {
    block = fm_init() ? arena_malloc_one(cls) : NULL;
  } else {
    tcache_idle_sweep(tc);
    block = tc->head[cls];   /* a nested call (pthread_setspecific) may have filled it */
    if (block || tcache_refill(tc, cls)) return tcache_pop(tc, cls, tc->head[cls]);
  }
  if (!block) errno = ENOMEM;
  return block;
}

void *tcache_malloc_miss(size_t size) {
  fm_tcache *tc = tcache_current();
  return malloc_slow(tc, fm_size_class(size));   /* the table is filled now */
}

void *tcache_malloc_class_miss(unsigned cls) { return malloc_slow(tcache_current(), cls); }

static bool tcache_bin_holds(const fm_tcache *tc, unsigned cls, const void *p) {
  int32_t count = tc->limit[cls] - tc->room[cls];
  const void *b = tc->head[cls];
  for (int32_t i = 0; b && i < count; i++, b = fm_decode(*(const uintptr_t *)b)) {
    if (b == p) return true;
  }
  return false;
}

static void free_slow(void *p, unsigned cls) {
  if (cls == 0) {
    if (p) os_fatal("free(): invalid pointer", p);
    return;
  }
  if (cls == FM_CLASS_SPAN_LARGE) return arena_free_span_large(p);
  if (cls == FM_CLASS_MAPPED) return large_free(p);
  if ((uintptr_t)p & 15) os_fatal("free(): invalid pointer", p);
  fm_tcache *tc = tcache_current();
  if (((uintptr_t *)p)[1] == fm_mark &&
      ((tc != &tcache_dead && tcache_bin_holds(tc, cls, p)) || arena_block_is_free(p)))
    os_fatal("free(): double free detected", p);
  if (fm_unlikely(tc == &tcache_dead)) {
    *(uintptr_t *)p = fm_encode(NULL);
    arena_free_chain(p);
    return;
  }
  tcache_idle_sweep(tc);
  if (tc->room[cls] == 0) tcache_overflow(tc, cls);
  tc->room[cls]--;
  tcache_link(tc, cls, p, fm_mark);
}

void tcache_free_miss(void *p) {
  unsigned cls = fm_unit_class(p);
  fm_tcache *tc = fm_tc;
  /* Undo the fast path's decrement; a sentinel's room is simply 0 again. */
  if (tc == &tcache_boot || tc == &tcache_dead) tc->room[cls] = 0;
  else tc->room[cls]++;
  int saved = errno;   /* free never changes errno, whatever its slow path meets */
  free_slow(p, cls);
  errno = saved;
}

size_t tcache_trim(void) {
  if (!fm_init()) return 0;
  fm_tcache *tc = fm_tc;
  if (tc != &tcache_boot && tc != &tcache_dead) tcache_flush_all(tc);
  size_t released = large_trim();
  bool threaded = fm_threaded();
  for (unsigned i = 0; i < fm_arena_count; i++) {
    fm_lock(&fm_arenas[i].lock, threaded);
    released += arena_purge(&fm_arenas[i], true);
    fm_unlock(&fm_arenas[i].lock, threaded);
  }
  return released;
}

/* fork: take every allocator lock in a fixed order so the child sees a consistent heap.
 * A single-threaded parent holds no lock mid-operation, so nothing needs taking. */
static bool fork_locked;

static void fork_prepare(void) {
  fork_locked = fm_threaded();
  if (!fork_locked) return;
  fm_lock(&init_lock, true);
  fm_lock(&pool_lock, true);
  large_lock_all();
  arena_lock_all();
}

static void fork_parent(void) {
  if (!fork_locked) return;
  arena_unlock_all();
  large_unlock_all();
  fm_unlock(&pool_lock, true);
  fm_unlock(&init_lock, true);
}

static void fork_child(void) {
  if (!fork_locked) return;
  /* The other threads' caches are gone with their threads. */
  fm_tcache *tc = fm_tc;
  bool own = tc != &tcache_boot && tc != &tcache_dead;
  __atomic_store_n(&grown_bytes, own ? tc->limit_bytes - start_bytes : 0, __ATOMIC_RELAXED);
  arena_reset_locks();
  large_reset_locks();
  fm_lock_init(&pool_lock);
  fm_lock_init(&init_lock);
}
