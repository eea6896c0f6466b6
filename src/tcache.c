/* Slow paths of the thread cache: refill and flush in batches, adaptive bin limits under a
 * byte budget, thread set-up and exit, process set-up, fork handlers. Everything here is
 * reached only on a miss of the inline fast paths in tcache.h. */
#include "tcache.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "large.h"
#include "options.h"

__thread fm_tcache fm_tc __attribute__((tls_model("initial-exec")));

static fm_lock_t init_lock = FM_LOCK_INIT;
static _Atomic int init_done;
static bool init_tried;   /* set-up runs once: a failure is final (malloc answers ENOMEM) */
static _Atomic int atfork_registered;
static pthread_key_t thread_key;

/* The bins' arrays of finished threads, linked through their first slot: at most
 * POOL_MAX, so a burst of threads that ends does not keep its arrays' pages for good. */
enum { POOL_MAX = 256 };
static fm_lock_t pool_lock = FM_LOCK_INIT;
static void **pool_free;
static unsigned pool_count;
/* Live threads dealt each arena (under pool_lock): a new thread takes the lowest arena
 * with the fewest, so threads created one after another reuse one arena's memory rather
 * than spreading the heap over every arena in turn. */
static unsigned arena_threads[FM_MAX_ARENAS];
/* Every live thread's cache (under pool_lock): a thread joins at set-up and leaves at exit,
 * before its bins' array can be unmapped. */
static fm_tcache *live_caches;

/* Bin bounds per class: a thread starts with about 1 KiB (at least one block) a bin, so a
 * thread that allocates little holds little, and a bin doubles on each miss, up to about
 * 2 MiB (32 KiB, at least 2 blocks, for blocks over 4 KiB), while the thread's byte
 * budget allows. */
static int32_t limit_start[FM_BINS], limit_max[FM_BINS];
static size_t start_bytes;   /* a thread's limit_bytes at start: sum of limit_start * size */
static size_t start_slots;   /* the slots the start layout takes */
static size_t slots_bytes;   /* one bins' array: room for every bin at its largest limit
                                (only the pages the bins reach get touched) */
/* What all threads' bins have grown beyond their start limits, in bytes: held under
 * 8 x the per-thread budget, so 400 busy threads do not hold 400 full budgets. */
static size_t grown_bytes;   /* through fm_count_add */

/* At most about 8 KiB (or 32 blocks; 4 of those over 4 KiB) a refill: a thread that only
 * allocates (a producer) would otherwise hold half its bin's limit ahead of use, and the
 * blocks a refill brings are touched as they go out, so a producer's RSS grows by what its
 * refills bring ahead of the blocks in flight (message: 16 KiB peaked 7 % higher). */
static unsigned refill_max[FM_BINS];

static void fork_prepare(void);
static void fork_parent(void);
static void fork_child(void);
static void tcache_thread_exit(void *arg);

/* The start layout gives each bin room for twice its start limit (at most its largest
 * limit), so a new thread's bins fit in one page of slots and a bin's first growth moves
 * nothing. A bin that grows past its room gets room for its new limit and no more: every
 * page of the array that the bins pass through on their way up stays resident while the
 * thread lives, so spare room costs memory, where a move costs little (a bin doubles at
 * most 11 times). With room for 4 x the limit, a producer thread's 16 bins kept 148 KiB
 * of its array resident (message workload); with room for the limit, 68 KiB. */
static int32_t start_room(unsigned cls) {
  return 2 * limit_start[cls] < limit_max[cls] ? 2 * limit_start[cls] : limit_max[cls];
}

static void limits_init(void) {
  size_t slots = 0;
  start_bytes = start_slots = 0;   /* (a fork child may run set-up again) */
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
    int32_t size = (int32_t)fm_class_size[cls];
    /* Blocks of several pages are cached sparingly: the memory they pin costs more than
     * the arena trip they save (a program that fills such blocks spends far longer on
     * its page writes than on that trip). */
    int32_t start = (1 << 10) / size, most = (size > 4096 ? 32 << 10 : 2 << 20) / size;
    limit_start[cls] = start < 1 ? 1 : start > 16 ? 16 : start;
    start_bytes += (size_t)limit_start[cls] * fm_class_size[cls];
    limit_max[cls] = most < 2 ? 2 : most > 2048 ? 2048 : most;
    slots += (size_t)limit_max[cls];
    unsigned batch = (8u << 10) / (unsigned)size;
    refill_max[cls] = size > 4096 ? 4 : batch < 32 ? 32 : batch;
    start_slots += (size_t)start_room(cls);
  }
  slots_bytes = (slots * sizeof(void *) + FM_PAGE_SIZE - 1) & ~(size_t)(FM_PAGE_SIZE - 1);
}

bool fm_init(void) {
  if (fm_likely(atomic_load_explicit(&init_done, memory_order_acquire))) return true;
  fm_lock(&init_lock, true);
  if (!init_tried) {
    init_tried = true;
    fm_options_init();
    fm_size_class_init();
    limits_init();
    fm_mark = (uintptr_t)os_random64();
    arena_init_all();
    if (pthread_key_create(&thread_key, tcache_thread_exit) == 0)
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

/* Gives the new cache tc its bins' array, from the pool of finished threads' or a new
 * mapping; false when out of memory. */
static bool pool_take(fm_tcache *tc) {
  bool threaded = fm_threaded();
  fm_lock(&pool_lock, threaded);
  void **slots = pool_free;
  if (slots) {
    pool_free = *(void ***)slots;
    pool_count--;
  }
  fm_unlock(&pool_lock, threaded);
  if (!slots) slots = os_map(slots_bytes);
  tc->slots = slots;
  return slots != NULL;
}

/* Takes back an exiting thread's bins' array. */
static void pool_give(void **slots) {
  bool threaded = fm_threaded();
  fm_lock(&pool_lock, threaded);
  bool kept = pool_count < POOL_MAX;
  if (kept) {
    *(void ***)slots = pool_free;
    pool_free = slots;
    pool_count++;
  }
  fm_unlock(&pool_lock, threaded);
  if (!kept) os_unmap(slots, slots_bytes);
}

/* A new thread's cache joins the live ones and takes its arena: the lowest one with the
 * fewest live threads. */
static void cache_join(fm_tcache *tc) {
  bool threaded = fm_threaded();
  fm_lock(&pool_lock, threaded);
  unsigned least = 0;
  for (unsigned i = 1; i < fm_arena_count; i++)
    if (arena_threads[i] < arena_threads[least]) least = i;
  arena_threads[least]++;
  tc->arena = &fm_arenas[least];
  tc->live_prev = NULL;
  tc->live_next = live_caches;
  if (live_caches) live_caches->live_prev = tc;
  live_caches = tc;
  fm_unlock(&pool_lock, threaded);
}

/* An exiting thread's cache leaves the live ones and gives its place in its arena back. */
static void cache_leave(fm_tcache *tc) {
  bool threaded = fm_threaded();
  fm_lock(&pool_lock, threaded);
  arena_threads[tc->arena - fm_arenas]--;
  if (tc->live_prev) tc->live_prev->live_next = tc->live_next;
  else live_caches = tc->live_next;
  if (tc->live_next) tc->live_next->live_prev = tc->live_prev;
  fm_unlock(&pool_lock, threaded);
}

/* Whether bin cls of cache tc holds p. The bin may be another thread's, changing under us
 * (see other_cache_holds): its range is read as one pair, each slot once. */
static bool tcache_bin_holds(const fm_tcache *tc, unsigned cls, const void *p) {
  void **low, **top;
  /* low read again after top: a bin moving up (bin_widen) between the two reads would give
   * its old low with its new top, a range over slots it left stale (blocks handed out). */
  do {
    low = __atomic_load_n(&tc->low[cls], __ATOMIC_ACQUIRE);
    top = __atomic_load_n(&tc->top[cls], __ATOMIC_ACQUIRE);
  } while (low != __atomic_load_n(&tc->low[cls], __ATOMIC_ACQUIRE));
  fm_assert(low == top || (low >= tc->slots && top <= tc->slots + slots_bytes / sizeof(void *)));
  for (void **b = low; b < top; b++)
    if (__atomic_load_n(b, __ATOMIC_RELAXED) == p) return true;
  return false;
}

/* Whether cache tc (maybe another thread's, changing under us) holds page block p: each
 * slot read once. */
static bool cache_holds_page_block(const fm_tcache *tc, const void *p) {
  for (unsigned pages = 1; pages <= FM_PAGES_PER_UNIT; pages++)
    if (__atomic_load_n(&tc->page_blocks[pages], __ATOMIC_ACQUIRE) == p) return true;
  return false;
}

/* Whether cache tc holds block p of class cls: in its bin, or for FM_CLASS_PAGES among
 * its page blocks. */
static bool cache_holds(const fm_tcache *tc, unsigned cls, const void *p) {
  return cls == FM_CLASS_PAGES ? cache_holds_page_block(tc, p) : tcache_bin_holds(tc, cls, p);
}

/* Whether another live thread's cache holds p, of class cls (cache_holds). Those bins
 * change under us (pops, pushes, moves to a wider layout), so tcache_bin_holds reads a
 * bin's range as one pair and each slot once: a range read across a move still lies in
 * that thread's bins' array, which stays mapped while the thread is listed. What keeps a
 * live block from being found: a bin's range [low, top) takes a block only once its slot
 * is written (tcache_push), and gives it up before the block goes back to its span
 * (tcache_flush_oldest, bin_move_all, tcache_flush_all) or to the program (tcache_pop); a
 * move brings a bin's blocks into the old range of a bin of another class, whose blocks
 * lie in other spans. */
static bool other_cache_holds(unsigned cls, const void *p) {
  bool threaded = fm_threaded(), found = false;
  fm_lock(&pool_lock, threaded);
  for (fm_tcache *tc = live_caches; tc && !found; tc = tc->live_next)
    found = tc != &fm_tc && cache_holds(tc, cls, p);
  fm_unlock(&pool_lock, threaded);
  return found;
}

bool tcache_marked_page_block_is_free(const void *p) {
  return cache_holds_page_block(&fm_tc, p) || other_cache_holds(FM_CLASS_PAGES, p);
}

/* Unmaps the pooled bins' arrays of finished threads (malloc_trim); returns the bytes. */
static size_t pool_release(void) {
  bool threaded = fm_threaded();
  fm_lock(&pool_lock, threaded);
  void **slots = pool_free;
  pool_free = NULL;
  pool_count = 0;
  fm_unlock(&pool_lock, threaded);
  size_t released = 0;
  while (slots) {
    void **next = *(void ***)slots;
    os_unmap(slots, slots_bytes);
    released += slots_bytes;
    slots = next;
  }
  return released;
}

static int32_t bin_count(const fm_tcache *tc, unsigned cls) { return (int32_t)(tc->top[cls] - tc->low[cls]); }

/* Moves bin cls's top on a slow path. Other threads' double-free searches read it
 * (other_cache_holds): a release store, so the slots below a raised top are written
 * before it, and a bin emptied before its blocks go back reads empty before they do. */
static void bin_set_top(fm_tcache *tc, unsigned cls, void **top) {
  __atomic_store_n(&tc->top[cls], top, __ATOMIC_RELEASE);
}
static int32_t bin_limit(const fm_tcache *tc, unsigned cls) { return (int32_t)(tc->high[cls] - tc->low[cls]); }

/* The slots set aside for bin cls: up to the next bin's low end (the last bin's: the
 * layout's end). A bin's limit may grow up to it without moving anything. */
static int32_t bin_capacity(const fm_tcache *tc, unsigned cls) {
  void **end = cls < FM_NUM_SPAN_CLASSES ? tc->low[cls + 1] : tc->layout_end;
  return (int32_t)(end - tc->low[cls]);
}

/* The start layout: the bins in class order, each with its start limit and room. */
static void tcache_layout_start(fm_tcache *tc) {
  void **at = tc->slots;
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
    tc->low[cls] = tc->top[cls] = at;
    tc->high[cls] = at + limit_start[cls];
    at += start_room(cls);
  }
  tc->layout_end = at;
}

/* Gives bin cls room for `limit` blocks by moving the bins above it up, with their
 * blocks. */
static void bin_widen(fm_tcache *tc, unsigned cls, int32_t limit) {
  ptrdiff_t delta = limit - bin_capacity(tc, cls);
  for (unsigned c = FM_NUM_SPAN_CLASSES; c > cls; c--) {
    int32_t count = bin_count(tc, c);
    void **low = tc->low[c] + delta;
    if (count) memmove(low, tc->low[c], (size_t)count * sizeof(void *));
    /* low before top, both after the blocks moved (see tcache_bin_holds) */
    __atomic_store_n(&tc->low[c], low, __ATOMIC_RELEASE);
    bin_set_top(tc, c, low + count);
    tc->high[c] += delta;
  }
  tc->layout_end += delta;
}

/* Sets up the calling thread's cache, or marks it dead when that is impossible. */
static void tcache_thread_set_up(fm_tcache *tc) {
  if (!fm_init()) {
    tc->state = FM_TCACHE_DEAD;
    return;
  }
  /* The first call's set-up may have allocated (pthread_atfork), setting this thread up. */
  if (tc->state != FM_TCACHE_BOOT) return;
  if (!pool_take(tc)) {
    tc->state = FM_TCACHE_DEAD;
    return;
  }
  tcache_layout_start(tc);
  cache_join(tc);   /* listed with its bins set: other_cache_holds reads them from now on */
  memcpy(tc->class_of_granule, fm_class_of_granule, sizeof tc->class_of_granule);
  tc->limit_bytes = start_bytes;
  /* Live before pthread_setspecific: it callocs for high key numbers. */
  tc->state = FM_TCACHE_LIVE;
  pthread_setspecific(thread_key, tc);
}

/* The set-up keeps errno: its libc calls (pthread_key_create, pthread_atfork,
 * pthread_setspecific) may allocate, and a failed allocation sets it, within free too. */
static void tcache_thread_start(fm_tcache *tc) {
  int saved = errno;
  tcache_thread_set_up(tc);
  errno = saved;
}

static fm_tcache *tcache_current(void) {
  fm_tcache *tc = &fm_tc;
  if (tc->state == FM_TCACHE_BOOT) tcache_thread_start(tc);
  return tc;
}

/* The arena of the calling thread's cache; arena 0 while it has none. */
static fm_arena *thread_arena(void) {
  return fm_tc.state == FM_TCACHE_LIVE ? fm_tc.arena : &fm_arenas[0];
}

/* Gives the n oldest blocks of bin cls back to the arenas; the newest, likely still in
 * the CPU cache, stay for the next mallocs. */
static void tcache_flush_oldest(fm_tcache *tc, unsigned cls, int32_t n) {
  if (n <= 0) return;
  void **low = tc->low[cls];
  int32_t keep = bin_count(tc, cls) - n;
  /* Empty to other_cache_holds while the blocks go back: once back in their spans they
   * may be handed out again, and a live block seen in this bin would read as freed. */
  bin_set_top(tc, cls, low);
  arena_free_blocks(low, (size_t)n);
  memmove(low, low + n, (size_t)keep * sizeof(void *));
  bin_set_top(tc, cls, low + keep);
}

/* Sets bin cls's limit, under the byte accounting: the oldest blocks beyond it go back. */
static void tcache_set_limit(fm_tcache *tc, unsigned cls, int32_t limit) {
  tcache_flush_oldest(tc, cls, bin_count(tc, cls) - limit);
  if (limit > bin_capacity(tc, cls)) bin_widen(tc, cls, limit);
  size_t old_bytes = (size_t)bin_limit(tc, cls) * fm_class_size[cls];
  size_t new_bytes = (size_t)limit * fm_class_size[cls];
  tc->limit_bytes = tc->limit_bytes - old_bytes + new_bytes;
  fm_count_add(&grown_bytes, new_bytes - old_bytes);
  tc->high[cls] = tc->low[cls] + limit;
}

/* What a bin's slow paths saw since the last idle sweep (activity[FM_CLASS_PAGES]: the
 * cached page blocks, a malloc they served or a free they took). */
enum { BIN_REFILLED = 1, BIN_OVERFLOWED = 2 };

/* Gives cached page block p back to its arena, without the mark: a block the arena hands
 * out again then reads as live, with no search of the caches at its free. */
static void page_block_give_back(void *p) {
  mark_set(p, 0);
  arena_free_pages(p);
}

/* Gives the cached page blocks back to their arenas. */
static void tcache_flush_page_blocks(fm_tcache *tc) {
  for (unsigned pages = 1; pages <= FM_PAGES_PER_UNIT; pages++) {
    void *p = tc->page_blocks[pages];
    if (!p) continue;
    __atomic_store_n(&tc->page_blocks[pages], NULL, __ATOMIC_RELEASE);   /* (before it goes) */
    page_block_give_back(p);
  }
}

/* The purge ticks its thread's arena has run so far. */
static uint32_t arena_epoch(const fm_tcache *tc) {
  return (uint32_t)__atomic_load_n(&tc->arena->purge_epoch, __ATOMIC_RELAXED);
}

/* Bins that neither missed nor overflowed since the last sweep give back half their blocks
 * and half their limit: a quiet thread holds little memory, while a thread that only frees
 * for a while keeps the bins it frees into. */
static void tcache_sweep_bins(fm_tcache *tc, uint32_t epoch) {
  tc->misses = 0;
  tc->sweep_epoch = epoch;
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
    int32_t limit = bin_limit(tc, cls);
    if (!tc->activity[cls]) {
      if (limit > limit_start[cls])
        tcache_set_limit(tc, cls, limit / 2 < limit_start[cls] ? limit_start[cls] : limit / 2);
      else
        tcache_flush_oldest(tc, cls, (bin_count(tc, cls) + 1) / 2);
    }
    tc->activity[cls] = 0;
  }
  if (!tc->activity[FM_CLASS_PAGES]) tcache_flush_page_blocks(tc);
  tc->activity[FM_CLASS_PAGES] = 0;
}

/* The sweep runs every few hundred misses, and at the first miss after each purge tick of
 * the thread's arena (one a purge delay). The ticks bound the time, not just the misses, it
 * takes a thread that goes on missing seldom to let go of a heap it freed: its cache's
 * blocks pin the spans they lie in, so their pages too. */
static void tcache_idle_sweep(fm_tcache *tc) {
  uint32_t epoch = arena_epoch(tc);
  if (++tc->misses < 256 && epoch == tc->sweep_epoch) return;
  tcache_sweep_bins(tc, epoch);
}

/* Blocks beyond the size classes (page blocks, but for their cache of one a length, and
 * large blocks) bypass the bins, but their slow paths run the sweep due at each purge tick
 * all the same: a thread that goes on with such blocks only, after freeing a heap, still
 * lets its bins' blocks (and so the spans they pin) go. (Not every 256 of them: a program
 * busy with large blocks would sweep bins it keeps using.) */
static void large_path_sweep(void) {
  fm_tcache *tc = &fm_tc;
  if (tc->state != FM_TCACHE_LIVE) return;
  uint32_t epoch = arena_epoch(tc);
  if (epoch != tc->sweep_epoch) tcache_sweep_bins(tc, epoch);
}

void *tcache_malloc_pages(size_t size) {
  fm_tcache *tc = &fm_tc;
  if (fm_unlikely(tc->state != FM_TCACHE_LIVE)) return NULL;
  unsigned pages = (unsigned)((size + FM_PAGE_SIZE - 1) / FM_PAGE_SIZE);
  /* A block one page longer serves too: with blocks of random lengths, 64 % of mallocs
   * found one instead of 53 % (a simulation of medium). */
  void *p = tc->page_blocks[pages];
  if (!p && pages < FM_PAGES_PER_UNIT && (p = tc->page_blocks[pages + 1])) pages++;
  if (p) {
    __atomic_store_n(&tc->page_blocks[pages], NULL, __ATOMIC_RELEASE);
    mark_set(p, 0);
    tc->activity[FM_CLASS_PAGES] |= BIN_REFILLED;
    return p;
  }
  large_path_sweep();
  bool zeroed;
  return arena_alloc_pages(tc->arena, size, 0, &zeroed);
}

/* free of a page block: into its length's place in the cache when that is empty, else
 * back to its arena (giving back the cached block instead, to keep the newer one, cost a
 * store into a block long out of the CPU's cache: 3 % slower on medium). A pointer that
 * starts no live block gets the arena's verdict. */
static fm_noinline void free_pages_slow(void *p) {
  fm_tcache *tc = tcache_current();
  unsigned pages = page_block_pages(p);
  if (!pages || tc->state != FM_TCACHE_LIVE) return arena_free_pages(p);
  large_path_sweep();   /* (it may give the cached blocks back: before reading them) */
  void *cached = tc->page_blocks[pages];
  if (cached == p || tcache_page_block_is_free(p)) os_fatal("free(): double free detected", p);
  tc->activity[FM_CLASS_PAGES] |= BIN_OVERFLOWED;
  if (cached) return arena_free_pages(p);
  mark_set(p, fm_mark);
  __atomic_store_n(&tc->page_blocks[pages], p, __ATOMIC_RELEASE);
}

fm_arena *tcache_large_arena(void) {
  tcache_current();
  large_path_sweep();
  return thread_arena();
}

/* Doubles the bin's limit while under its maximum, the thread's byte budget and the
 * process-wide bound on grown caches. */
static bool tcache_grow(fm_tcache *tc, unsigned cls) {
  int32_t limit = bin_limit(tc, cls);
  size_t added = (size_t)limit * fm_class_size[cls];
  size_t budget = fm_options.tcache_max_bytes;
  size_t all_budget = budget > SIZE_MAX / 8 ? SIZE_MAX : 8 * budget;
  if (limit >= limit_max[cls] || tc->limit_bytes + added > budget ||
      __atomic_load_n(&grown_bytes, __ATOMIC_RELAXED) + added > all_budget)
    return false;
  tcache_set_limit(tc, cls, limit * 2 > limit_max[cls] ? limit_max[cls] : limit * 2);
  return true;
}

/* zeroed: for calloc (see arena_alloc_batch); when set, the bin stays empty and the one
 * block taken is at its low end. */
static bool tcache_refill(fm_tcache *tc, unsigned cls, bool *zeroed) {
  /* Slow start: a bin that keeps missing grows, up to two full refills. Beyond that a
   * larger limit makes no refill larger; it would only spend the process-wide budget
   * (a producer thread, which never frees, kept growing its bins until the budget ran
   * out, and then other threads' bins refilled one or two blocks at a time). A bin that
   * also takes frees grows further when they overflow it. */
  if ((tc->activity[cls] & BIN_REFILLED) && bin_limit(tc, cls) < 2 * (int32_t)refill_max[cls])
    tcache_grow(tc, cls);
  unsigned want = (unsigned)(bin_limit(tc, cls) + 1) / 2;
  if (want > refill_max[cls]) want = refill_max[cls];
  unsigned got = arena_alloc_batch(tc->arena, cls, want, tc->low[cls], zeroed);
  if (!got) return false;
  bin_set_top(tc, cls, tc->low[cls] + (zeroed && *zeroed ? 0 : got));
  tc->activity[cls] |= BIN_REFILLED;
  return true;
}

/* A bin that only receives frees (its thread never refilled it since the last sweep) holds
 * up to this many bytes, and at least FREE_ONLY_MIN_BLOCKS: enough that the batches it
 * gives back are worth their lock. */
#define FREE_ONLY_BIN_BYTES 4096
#define FREE_ONLY_MIN_BLOCKS 8
#define FREE_ONLY_BATCH 256   /* pointers gathered on the stack (2 KiB) for one give-back */

static bool bin_is_free_only(const fm_tcache *tc, unsigned cls) {
  return (tc->activity[cls] & (BIN_REFILLED | BIN_OVERFLOWED)) == BIN_OVERFLOWED;
}

/* Empties bin cls into batch[n ..] if all its blocks fit; returns the new count. */
static size_t bin_move_all(fm_tcache *tc, unsigned cls, void **batch, size_t n) {
  size_t count = (size_t)bin_count(tc, cls);
  if (n + count > FREE_ONLY_BATCH) return n;   /* it waits for the next batch */
  memcpy(batch + n, tc->low[cls], count * sizeof(void *));
  bin_set_top(tc, cls, tc->low[cls]);
  return n + count;
}

/* Gives back every block of bin cls and of the other free-only bins, as far as they fit in
 * one batch: one arena_free_blocks call, so one lock per owning arena for all of them. */
static void tcache_flush_free_only(fm_tcache *tc, unsigned cls) {
  void *batch[FREE_ONLY_BATCH];
  size_t n = bin_move_all(tc, cls, batch, 0);
  for (unsigned c = 1; c <= FM_NUM_SPAN_CLASSES; c++)
    if (c != cls && bin_is_free_only(tc, c)) n = bin_move_all(tc, c, batch, n);
  if (n) arena_free_blocks(batch, n);
}

/* Free found the bin full. A bin this thread also allocates from grows, else gives its
 * older half back. A thread that only frees into it (the consumer of a producer) gains
 * nothing from holding its blocks: they all go back, with those of its other such bins in
 * the same batch, and the bin grows to a few KiB so that the batches stay large. (A bin
 * that grew while its thread allocated keeps its limit: shrinking it in a phase of frees
 * made the next phase of mallocs refill it again, 5 % slower on the fragment workload.) */
static void tcache_overflow(fm_tcache *tc, unsigned cls) {
  if (tc->activity[cls] & BIN_REFILLED) {
    if (!tcache_grow(tc, cls)) tcache_flush_oldest(tc, cls, (bin_count(tc, cls) + 1) / 2);
  } else {
    /* (a bin grown while it was refilled too may hold more than one batch) */
    tcache_flush_oldest(tc, cls, bin_count(tc, cls) - FREE_ONLY_BATCH);
    tcache_flush_free_only(tc, cls);
    int32_t limit = bin_limit(tc, cls);
    if (limit < FREE_ONLY_MIN_BLOCKS || (size_t)limit * fm_class_size[cls] < FREE_ONLY_BIN_BYTES)
      tcache_grow(tc, cls);
  }
  tc->activity[cls] |= BIN_OVERFLOWED;
}

/* Every bin in one array, so the arenas are locked once each, not once a bin: the bins
 * lie in class order, so each moves down to follow the previous one. */
static void tcache_flush_all(fm_tcache *tc) {
  tcache_flush_page_blocks(tc);
  void **end = tc->slots;
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
    int32_t count = bin_count(tc, cls);
    if (count) memmove(end, tc->low[cls], (size_t)count * sizeof(void *));
    end += count;
    bin_set_top(tc, cls, tc->low[cls]);
  }
  if (end > tc->slots) arena_free_blocks(tc->slots, (size_t)(end - tc->slots));
}

/* Purges the pages of the (empty) bins' array from `from` up to the layout's end. */
static void slots_purge(fm_tcache *tc, void **from) {
  uintptr_t page = FM_PAGE_SIZE - 1;
  char *start = (char *)(((uintptr_t)from + page) & ~page);
  char *end = (char *)(((uintptr_t)tc->layout_end + page) & ~page);
  if (end > start) os_purge(start, (size_t)(end - start));
}

static void tcache_thread_exit(void *arg) {
  fm_tcache *tc = arg;
  tcache_flush_all(tc);
  fm_count_add(&grown_bytes, start_bytes - tc->limit_bytes);
  cache_leave(tc);
  /* The pages that grown bins took go back: the next thread starts small. */
  slots_purge(tc, tc->slots + start_slots);
  pool_give(tc->slots);
  *tc = (fm_tcache){.state = FM_TCACHE_DEAD};
}

/* One block straight from the arena, for threads whose cache is gone. */
static void *arena_malloc_one(unsigned cls) {
  void *block;
  if (!arena_alloc_batch(&fm_arenas[0], cls, 1, &block, NULL)) return NULL;
  mark_set(block, 0);
  return block;
}

/* A malloc that missed in bin cls: refill the bin, or, for a thread whose cache is gone,
 * one block straight from an arena. For calloc (zeroed: non-NULL), *zeroed says whether
 * the block reads zero already (then it came alone, and untouched). Out of memory, it may
 * try once more (see tcache_release_for_retry). */
static void *malloc_slow(fm_tcache *tc, unsigned cls, bool *zeroed) {
  for (bool retried = false;; retried = true) {
    if (fm_unlikely(tc->state == FM_TCACHE_DEAD)) {
      void *block = fm_init() ? arena_malloc_one(cls) : NULL;
      if (block) return block;
    } else {
      tcache_idle_sweep(tc);
      /* A nested call (pthread_setspecific) may have filled the bin. */
      if (tc->top[cls] != tc->low[cls]) return tcache_pop(cls, tc->top[cls]);
      if (tcache_refill(tc, cls, zeroed))
        return zeroed && *zeroed ? tc->low[cls][0] : tcache_pop(cls, tc->top[cls]);
    }
    if (retried || !tcache_release_for_retry()) break;
  }
  errno = ENOMEM;
  return NULL;
}

void *tcache_malloc_miss(size_t size, unsigned cls) {
  fm_tcache *tc = tcache_current();
  return malloc_slow(tc, cls ? cls : fm_size_class(size), NULL);   /* the table is filled now */
}

void *tcache_calloc_paged(size_t size) {
  unsigned cls = fm_size_class(size);   /* 0 before set-up: class 0's bin is always empty */
  bool zeroed = false;
  void *p;
  if (fm_tc.top[cls] != fm_tc.low[cls]) {
    p = tcache_pop(cls, fm_tc.top[cls]);
  } else {
    fm_tcache *tc = tcache_current();
    p = malloc_slow(tc, cls ? cls : fm_size_class(size), &zeroed);   /* the table is filled now */
  }
  if (p && !zeroed) memset(p, 0, size);
  return p;
}

/* The mark alone is not proof: recycled memory holds old marks wherever blocks of another
 * layout started, and a program may legally copy such uninitialized bytes into a live
 * block's second word (gcc does, when built under LD_PRELOAD). So a marked block counts
 * as free only when it is in this thread's bin, free in its span, or in another thread's
 * bin. (A dead or unset cache has no bins: all its bounds are NULL.) */
bool tcache_marked_block_is_free(void *p, unsigned cls) {
  return tcache_bin_holds(&fm_tc, cls, p) || arena_block_is_free(p) || other_cache_holds(cls, p);
}

/* free of p, not NULL, whose unit-map class is cls (not a page block's). */
static fm_noinline void free_slow(void *p, unsigned cls) {
  if (cls == 0) os_fatal("free(): invalid pointer", p);
  if (cls > FM_NUM_SPAN_CLASSES) {
    large_path_sweep();
    return cls == FM_CLASS_MAPPED ? large_free(p, thread_arena()) : arena_free_span_large(p);
  }
  if ((uintptr_t)p & 15) os_fatal("free(): invalid pointer", p);
  fm_tcache *tc = tcache_current();
  if (tcache_block_is_free(p, cls)) os_fatal("free(): double free detected", p);
  if (fm_unlikely(tc->state == FM_TCACHE_DEAD)) {
    arena_free_blocks(&p, 1);
    return;
  }
  tcache_idle_sweep(tc);
  if (tc->top[cls] == tc->high[cls]) tcache_overflow(tc, cls);
  tcache_push(cls, tc->top[cls], p, fm_mark);
}

/* free never changes errno: the OS calls on its slow paths put it back (os.c), and so
 * does a thread's set-up (tcache_thread_start), the only other place where it may be set. */
void tcache_free_miss(void *p) {
  unsigned cls = unit_map_class_checked(p);   /* 0 for NULL, and for any pointer before set-up */
  /* A page block's own path, a tail call: it needs none of free_slow's stack frame. */
  if (cls == FM_CLASS_PAGES) return free_pages_slow(p);
  if (p) free_slow(p, cls);
}

/* Gives back what the heap holds empty: flushes the calling thread's cache, unmaps empty
 * chunks, cached large mappings and finished threads' bins' arrays and, when purge
 * (malloc_trim), purges every free page still resident too. The retry after a refused
 * mapping wants address space, not RSS: it skips that slower part, and unmaps the chunks
 * mapped ahead instead. Returns the bytes released. */
static size_t release_held(bool purge) {
  if (!fm_init()) return 0;
  size_t released = large_expire(true) + pool_release();
  if (fm_tc.state == FM_TCACHE_LIVE) {
    tcache_flush_all(&fm_tc);
    if (purge) slots_purge(&fm_tc, fm_tc.slots);   /* bookkeeping, not counted as released heap */
  }
  bool threaded = fm_threaded();
  for (unsigned i = 0; i < fm_arena_count; i++) {
    fm_lock(&fm_arenas[i].lock, threaded);
    released += arena_purge(&fm_arenas[i], purge ? FM_PURGE_ALL : FM_UNMAP_EMPTY);
    fm_unlock(&fm_arenas[i].lock, threaded);
  }
  return released;
}

size_t tcache_trim(void) { return release_held(true); }

bool tcache_release_for_retry(void) { return release_held(false) > 0; }

/* fork. The prepare handler takes every allocator lock in a fixed order, in the state that
 * lets other threads borrow them (sync.h): the child then sees a consistent heap, while no
 * thread ever waits for the forking one, which goes on to take glibc's stdio and NSS locks
 * (a thread holding one of those may be allocating). A single-threaded parent holds no lock
 * mid-operation, so nothing needs taking. */
static bool fork_locked;
/* In the forking thread: forks nested in the window (a library's prepare handler that
 * forks) count here, and only the outermost's handlers open and close the window. */
static __thread unsigned char fork_depth __attribute__((tls_model("initial-exec")));

static void fork_child_repair(void);

static void fork_prepare(void) {
  if (fork_depth) {
    fork_depth++;
    return;
  }
  fork_locked = fm_threaded();
  if (!fork_locked) return;
  fork_depth = 1;
  fm_lock_fork_window(os_getpid(), fork_child_repair);
  fm_lock_for_fork(&init_lock);
  fm_lock_for_fork(&pool_lock);
  large_lock_all_for_fork();
  arena_lock_all_for_fork();
}

/* True in the parent or child handler that ends the outermost fork's window. */
static bool fork_window_ends(void) {
  if (fork_depth > 1) {
    fork_depth--;
    return false;
  }
  fork_depth = 0;
  return fork_locked;
}

static void fork_parent(void) {
  if (!fork_window_ends()) return;
  fork_locked = false;
  arena_unlock_all_after_fork();
  large_unlock_all_after_fork();
  fm_lock_after_fork_parent(&pool_lock);
  fm_lock_after_fork_parent(&init_lock);
  fm_lock_fork_window(0, NULL);
}

/* Frees every lock in the child; what a borrower left half updated starts again empty.
 * Runs from the child handler, or earlier, from the first wait for a borrowed lock (a
 * library's child handler registered before fastmalloc's, allocating). */
static void fork_child_repair(void) {
  if (!fork_locked) return;
  fork_locked = false;
  fm_lock_fork_window(0, NULL);
  if (fm_lock_after_fork_child(&init_lock) && !atomic_load(&init_done)) init_tried = false;
  if (fm_lock_after_fork_child(&pool_lock)) {
    pool_free = NULL;   /* the pooled arrays stay mapped, unused */
    pool_count = 0;
  }
  large_after_fork_child();
  arena_after_fork_child();
  /* The other threads' caches are gone with their threads. */
  bool own = fm_tc.state == FM_TCACHE_LIVE;
  __atomic_store_n(&grown_bytes, own ? fm_tc.limit_bytes - start_bytes : 0, __ATOMIC_RELAXED);
  memset(arena_threads, 0, sizeof arena_threads);
  live_caches = NULL;
  if (own) {
    arena_threads[fm_tc.arena - fm_arenas] = 1;
    fm_tc.live_next = fm_tc.live_prev = NULL;
    live_caches = &fm_tc;
  }
}

static void fork_child(void) {
  if (fork_window_ends()) fork_child_repair();
}
