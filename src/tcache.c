/* Slow paths of the thread cache: refill and flush in batches, adaptive bin limits under a
 * byte budget, thread set-up and exit, process set-up, fork handlers. Everything here is
 * reached only on a miss of the inline fast paths in tcache.h. */
#include "tcache.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "large.h"
#include "options.h"

/* The sentinel: a block whose mark names no slot (its second word is 0), which the slot
 * below every bin holds, so malloc's mark compare finds an empty bin too; and the one such
 * slot that every bin of a cache not set up (or gone) points just past. */
static const uintptr_t never_block[2];
static void *boot_slot[1] = {(void *)never_block};
#define BOOT_BIN (&boot_slot[1])

__thread fm_tcache fm_tc __attribute__((tls_model("initial-exec"))) = {
    .top = {[0 ... FM_BINS - 1] = BOOT_BIN},
    .low = {[0 ... FM_BINS - 1] = BOOT_BIN},
    .high = {[0 ... FM_BINS - 1] = BOOT_BIN},
};

static fm_lock_t init_lock = FM_LOCK_INIT;
static _Atomic int init_done;
static bool init_tried;   /* set-up runs once: a failure is final (malloc answers ENOMEM) */
static _Atomic int atfork_registered;
static pthread_key_t thread_key;

/* Every bins' array, under pool_lock: those of live threads, and those of finished threads
 * kept for the next ones, at most POOL_MAX, so a burst of threads that ends does not keep
 * its arrays' pages for good. */
enum { POOL_MAX = 256 };
static fm_lock_t pool_lock = FM_LOCK_INIT;
static fm_bins_array *arrays_in_use, *arrays_pooled;
static unsigned pool_count;
/* Live threads dealt each arena (under pool_lock): a new thread takes the lowest arena
 * with the fewest, so threads created one after another reuse one arena's memory rather
 * than spreading the heap over every arena in turn. */
static unsigned arena_threads[FM_MAX_ARENAS];

/* Bin bounds per class: a thread starts with about 1 KiB (at least one block) a bin, so a
 * thread that allocates little holds little, and a bin doubles on each miss, up to about
 * 2 MiB (32 KiB, at least 2 blocks, for blocks over 4 KiB), while the thread's byte
 * budget allows. */
static int32_t limit_start[FM_BINS], limit_max[FM_BINS];
static size_t start_bytes;   /* a thread's limit_bytes at start: sum of limit_start * size */
static size_t start_slots;   /* the slots the start layout takes, sentinels included */
static size_t array_bytes;   /* one bins' array: room for every bin at its largest limit
                                (only the pages the bins reach get touched), whole units */
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
    slots += 1 + (size_t)limit_max[cls];
    unsigned batch = (8u << 10) / (unsigned)size;
    refill_max[cls] = size > 4096 ? 4 : batch < 32 ? 32 : batch;
    start_slots += 1 + (size_t)start_room(cls);
  }
  array_bytes = (sizeof(fm_bins_array) + slots * sizeof(void *) + FM_UNIT_SIZE - 1) &
                ~(size_t)(FM_UNIT_SIZE - 1);
}

bool fm_init(void) {
  if (fm_likely(atomic_load_explicit(&init_done, memory_order_acquire))) return true;
  fm_lock(&init_lock, true);
  if (!init_tried) {
    init_tried = true;
    fm_options_init();
    fm_size_class_init();
    limits_init();
    if (!fm_mark) fm_mark = (uintptr_t)os_random64() | 1;   /* (kept by a fork child) */
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

#define LIST_UNLINK(list, node)                            \
  do {                                                     \
    if ((node)->prev) (node)->prev->next = (node)->next;   \
    else *(list) = (node)->next;                           \
    if ((node)->next) (node)->next->prev = (node)->prev;   \
  } while (0)
#define LIST_PUSH(list, node)               \
  do {                                      \
    (node)->prev = NULL;                    \
    (node)->next = *(list);                 \
    if (*(list)) (*(list))->prev = (node);  \
    *(list) = (node);                       \
  } while (0)

/* A new bins' array, marked in the unit map (see fm_bins_array); NULL when out of memory. */
static fm_bins_array *array_map(void) {
  fm_bins_array *array = os_map_aligned(array_bytes, FM_UNIT_SIZE);
  if (array && !unit_map_set(array, array_bytes, FM_CLASS_BINS)) {
    os_unmap(array, array_bytes);
    return NULL;
  }
  return array;
}

static void array_unmap(fm_bins_array *array) {
  unit_map_set(array, array_bytes, 0);
  os_unmap(array, array_bytes);
}

/* Gives the new cache tc its bins' array, from the pool of finished threads' or a new
 * mapping; false when out of memory. Also deals it an arena: the lowest one with the
 * fewest live threads. */
static bool cache_join(fm_tcache *tc) {
  bool threaded = fm_threaded();
  fm_lock(&pool_lock, threaded);
  fm_bins_array *array = arrays_pooled;
  if (array) {
    LIST_UNLINK(&arrays_pooled, array);
    pool_count--;
  }
  fm_unlock(&pool_lock, threaded);
  if (!array && !(array = array_map())) return false;
  tc->bins = array;
  fm_lock(&pool_lock, threaded);
  array->in_use = true;
  LIST_PUSH(&arrays_in_use, array);
  unsigned least = 0;
  for (unsigned i = 1; i < fm_arena_count; i++)
    if (arena_threads[i] < arena_threads[least]) least = i;
  arena_threads[least]++;
  tc->arena = &fm_arenas[least];
  fm_unlock(&pool_lock, threaded);
  return true;
}

/* An exiting thread's cache, flushed, gives its place in its arena and its bins' array
 * back. */
static void cache_leave(fm_tcache *tc) {
  fm_bins_array *array = tc->bins;
  bool threaded = fm_threaded();
  fm_lock(&pool_lock, threaded);
  arena_threads[tc->arena - fm_arenas]--;
  LIST_UNLINK(&arrays_in_use, array);
  array->in_use = false;
  bool kept = pool_count < POOL_MAX;
  if (kept) {
    LIST_PUSH(&arrays_pooled, array);
    pool_count++;
  }
  fm_unlock(&pool_lock, threaded);
  if (!kept) array_unmap(array);
}

/* Whether a thread's cache other than the calling one's holds page block p, of `pages`
 * pages. The arrays stay mapped while listed; their slots change under us, each read once. */
static bool other_cache_holds_page_block(const void *p, unsigned pages) {
  bool threaded = fm_threaded(), found = false;
  fm_lock(&pool_lock, threaded);
  for (fm_bins_array *array = arrays_in_use; array && !found; array = array->next)
    found = array != fm_tc.bins &&
            __atomic_load_n(&array->page_blocks[pages], __ATOMIC_ACQUIRE) == p;
  fm_unlock(&pool_lock, threaded);
  return found;
}

bool tcache_marked_page_block_is_free(const void *p) {
  unsigned pages = page_block_pages(p);
  fm_tcache *tc = &fm_tc;
  if (!pages) return false;
  if (tc->state == FM_TCACHE_LIVE && tc->bins->page_blocks[pages] == p) return true;
  return other_cache_holds_page_block(p, pages);
}

/* Unmaps the pooled bins' arrays of finished threads (malloc_trim); returns the bytes. */
static size_t pool_release(void) {
  bool threaded = fm_threaded();
  fm_lock(&pool_lock, threaded);
  fm_bins_array *array = arrays_pooled;
  arrays_pooled = NULL;
  pool_count = 0;
  fm_unlock(&pool_lock, threaded);
  size_t released = 0;
  while (array) {
    fm_bins_array *next = array->next;
    array_unmap(array);
    released += array_bytes;
    array = next;
  }
  return released;
}

static int32_t bin_count(const fm_tcache *tc, unsigned cls) { return (int32_t)(tc->top[cls] - tc->low[cls]); }
static int32_t bin_limit(const fm_tcache *tc, unsigned cls) { return (int32_t)(tc->high[cls] - tc->low[cls]); }

/* The slots set aside for bin cls: up to the next bin's sentinel (the last bin's: the
 * layout's end). A bin's limit may grow up to it without moving anything. */
static int32_t bin_capacity(const fm_tcache *tc, unsigned cls) {
  void **end = cls < FM_NUM_SPAN_CLASSES ? tc->low[cls + 1] - 1 : tc->layout_end;
  return (int32_t)(end - tc->low[cls]);
}

/* Reports a block whose mark does not name its slot: freed twice, or written into while
 * free. */
static fm_noinline void mark_mismatch(void *p) {
  os_fatal("double free or corruption of a free block", p);
}

/* Checks block p of bin cls in `slot`: it lies in a span of the bin's class (the cache
 * took it on the unit map's word, and a bad pointer's span may be gone by now: reported
 * before anything is read), and its mark names the slot. */
static void bin_block_check(void *p, void **slot, unsigned cls) {
  if (fm_unlikely(unit_map_class(p) != cls)) os_fatal("free(): invalid pointer", p);
  if (fm_unlikely(!mark_matches(p, slot))) mark_mismatch(p);
}

/* Checks the blocks of bin cls's slots [from, from + n) and gives each FM_FREED_MARK
 * instead of its slot's: they go back to their spans. */
static void blocks_leave_bin(void **from, size_t n, unsigned cls) {
  for (size_t i = 0; i < n; i++) {
    bin_block_check(from[i], &from[i], cls);
    mark_set(from[i], (const void *)FM_FREED_MARK);
  }
}

/* Moves n blocks of bin cls from slots `from` to slots `to` (the ranges may overlap),
 * checking them and making their marks name their new slots. */
static void blocks_move(void **from, void **to, size_t n, unsigned cls) {
  for (size_t k = 0; k < n; k++) {
    size_t i = to > from ? n - 1 - k : k;
    void *p = from[i];
    bin_block_check(p, &from[i], cls);
    to[i] = p;
    mark_set(p, &to[i]);
  }
}

/* Pops the top block of non-empty bin cls, checking its mark (the fast path's test, on a
 * slow path). */
static void *bin_pop(fm_tcache *tc, unsigned cls) {
  void **top = tc->top[cls] - 1;
  void *p = *top;
  if (!mark_matches(p, top)) mark_mismatch(p);
  tc->top[cls] = top;
  return p;
}

/* Pushes p onto bin cls, which has room. */
static void bin_push(fm_tcache *tc, unsigned cls, void *p) {
  void **top = tc->top[cls];
  mark_set(p, top);
  *top = p;
  tc->top[cls] = top + 1;
}

/* Bin cls's bounds, with its sentinel below low. */
static void bin_place(fm_tcache *tc, unsigned cls, void **low, int32_t count, int32_t limit) {
  low[-1] = (void *)never_block;
  tc->low[cls] = low;
  tc->top[cls] = low + count;
  tc->high[cls] = low + limit;
}

static void bins_set_sentinels(fm_tcache *tc) {
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) tc->low[cls][-1] = (void *)never_block;
}

/* The start layout: the bins in class order, each after its sentinel, with its start
 * limit and room. */
static void tcache_layout_start(fm_tcache *tc) {
  void **at = tc->bins->slots;
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
    bin_place(tc, cls, at + 1, 0, limit_start[cls]);
    at += 1 + start_room(cls);
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
    blocks_move(tc->low[c], low, (size_t)count, c);
    bin_place(tc, c, low, count, bin_limit(tc, c));
  }
  tc->layout_end += delta;
}

/* A cache not set up, or gone with its thread: every bin at the boot slot. */
static void tcache_reset(fm_tcache *tc, uint8_t state) {
  *tc = (fm_tcache){.state = state};
  for (unsigned cls = 0; cls < FM_BINS; cls++) tc->top[cls] = tc->low[cls] = tc->high[cls] = BOOT_BIN;
}

/* Sets up the calling thread's cache, or marks it dead when that is impossible. */
static void tcache_thread_set_up(fm_tcache *tc) {
  if (!fm_init()) {
    tc->state = FM_TCACHE_DEAD;
    return;
  }
  /* The first call's set-up may have allocated (pthread_atfork), setting this thread up. */
  if (tc->state != FM_TCACHE_BOOT) return;
  if (!cache_join(tc)) {
    tc->state = FM_TCACHE_DEAD;
    return;
  }
  tcache_layout_start(tc);
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
  blocks_leave_bin(low, (size_t)n, cls);
  arena_free_blocks(low, (size_t)n);
  blocks_move(low + n, low, (size_t)keep, cls);
  tc->top[cls] = low + keep;
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
  mark_set(p, NULL);
  arena_free_pages(p);
}

/* Gives the cached page blocks back to their arenas. */
static void tcache_flush_page_blocks(fm_tcache *tc) {
  for (unsigned pages = 1; pages <= FM_PAGES_PER_UNIT; pages++) {
    void *p = tc->bins->page_blocks[pages];
    if (!p) continue;
    __atomic_store_n(&tc->bins->page_blocks[pages], NULL, __ATOMIC_RELEASE);   /* (before it goes) */
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
  void *p = tc->bins->page_blocks[pages];
  if (!p && pages < FM_PAGES_PER_UNIT && (p = tc->bins->page_blocks[pages + 1])) pages++;
  if (p) {
    __atomic_store_n(&tc->bins->page_blocks[pages], NULL, __ATOMIC_RELEASE);
    mark_set(p, NULL);
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
  void *cached = tc->bins->page_blocks[pages];
  if (cached == p || tcache_page_block_is_free(p)) os_fatal("free(): double free detected", p);
  tc->activity[FM_CLASS_PAGES] |= BIN_OVERFLOWED;
  if (cached) return arena_free_pages(p);
  mark_set(p, (const void *)FM_FREED_MARK);
  __atomic_store_n(&tc->bins->page_blocks[pages], p, __ATOMIC_RELEASE);
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

/* A block from arena_alloc_batch, untagged. One handed out before in its span must still
 * carry the mark its way back wrote: anything else was written into it while it was free,
 * or it was freed again after it went back (it also sits in a bin, or a program owns it
 * again), and the span must not hand it out a second time. */
static void *block_recycled_check(void *tagged) {
  uintptr_t p = (uintptr_t)tagged & ~(uintptr_t)FM_BLOCK_RECYCLED;
  if (FM_FREE_MARK && (uintptr_t)tagged != p) {
    uintptr_t mark = ((const uintptr_t *)p)[1];
    if (mark != FM_FREED_MARK && mark != 0) mark_mismatch((void *)p);
  }
  return (void *)p;
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
  void **low = tc->low[cls];
  unsigned got = arena_alloc_batch(tc->arena, cls, want, low, zeroed);
  if (!got) return false;
  tc->activity[cls] |= BIN_REFILLED;
  if (zeroed && *zeroed) return true;   /* (a block never handed out: no tag, no mark) */
  for (unsigned i = 0; i < got; i++) low[i] = block_recycled_check(low[i]);
  for (unsigned i = 0; i < got; i++) mark_set(low[i], &low[i]);
  tc->top[cls] = low + got;
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
  blocks_leave_bin(tc->low[cls], count, cls);
  memcpy(batch + n, tc->low[cls], count * sizeof(void *));
  tc->top[cls] = tc->low[cls];
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
 * lie in class order, so each moves down to follow the previous one (over the sentinels,
 * set again after). */
static void tcache_flush_all(fm_tcache *tc) {
  tcache_flush_page_blocks(tc);
  void **start = tc->bins->slots, **end = start;
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
    int32_t count = bin_count(tc, cls);
    blocks_leave_bin(tc->low[cls], (size_t)count, cls);
    if (count) memmove(end, tc->low[cls], (size_t)count * sizeof(void *));
    end += count;
    tc->top[cls] = tc->low[cls];
  }
  if (end > start) arena_free_blocks(start, (size_t)(end - start));
  bins_set_sentinels(tc);
}

/* Purges the pages of the (empty) bins' array from `from` up to the layout's end, and
 * writes the sentinels again. */
static void slots_purge(fm_tcache *tc, void **from) {
  uintptr_t page = FM_PAGE_SIZE - 1;
  char *start = (char *)(((uintptr_t)from + page) & ~page);
  char *end = (char *)(((uintptr_t)tc->layout_end + page) & ~page);
  if (end > start) os_purge(start, (size_t)(end - start));
  bins_set_sentinels(tc);
}

static void tcache_thread_exit(void *arg) {
  fm_tcache *tc = arg;
  tcache_flush_all(tc);
  fm_count_add(&grown_bytes, start_bytes - tc->limit_bytes);
  /* The pages that grown bins took go back: the next thread starts small. */
  slots_purge(tc, tc->bins->slots + start_slots);
  cache_leave(tc);
  tcache_reset(tc, FM_TCACHE_DEAD);
}

/* One block straight from the arena, for threads whose cache is gone. */
static void *arena_malloc_one(unsigned cls) {
  void *block;
  if (!arena_alloc_batch(&fm_arenas[0], cls, 1, &block, NULL)) return NULL;
  return block_recycled_check(block);
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
      /* The fast path's compare failed on a bin that is not empty (bin_pop reports it), or
       * a nested call (pthread_setspecific) filled the bin. */
      if (tc->top[cls] != tc->low[cls]) return bin_pop(tc, cls);
      if (tcache_refill(tc, cls, zeroed))
        return zeroed && *zeroed ? tc->low[cls][0] : bin_pop(tc, cls);
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
    p = bin_pop(&fm_tc, cls);
  } else {
    fm_tcache *tc = tcache_current();
    p = malloc_slow(tc, cls ? cls : fm_size_class(size), &zeroed);   /* the table is filled now */
  }
  if (p && !zeroed) memset(p, 0, size);
  return p;
}

/* A block's second word is a mark only if the block is free, and a live block may hold
 * anything there, old marks included (a program may copy uninitialized bytes). A mark
 * naming a slot of this thread's bin that holds p is proof; FM_FREED_MARK is checked
 * against the span; a slot of another thread's bins cannot be checked without reading that
 * thread's bounds, which could be gone with it. */
fm_block_state tcache_block_state(void *p, unsigned cls) {
  if (!FM_FREE_MARK) return BLOCK_LIVE;
  void **mark = ((void **const *)p)[1];
  if ((uintptr_t)mark == FM_FREED_MARK) return arena_block_is_free(p) ? BLOCK_FREE : BLOCK_LIVE;
  fm_tcache *tc = &fm_tc;
  if (tc->state == FM_TCACHE_LIVE && mark >= tc->bins->slots && mark < tc->layout_end)
    return mark >= tc->low[cls] && mark < tc->top[cls] && *mark == p ? BLOCK_FREE : BLOCK_LIVE;
  return unit_map_class_checked(mark) == FM_CLASS_BINS ? BLOCK_UNSURE : BLOCK_LIVE;
}

/* free of p, not NULL, whose unit-map class is cls (not a page block's). */
static fm_noinline void free_slow(void *p, unsigned cls) {
  if (cls == 0 || cls == FM_CLASS_BINS) os_fatal("free(): invalid pointer", p);
  if (cls > FM_NUM_SPAN_CLASSES) {
    large_path_sweep();
    return cls == FM_CLASS_MAPPED ? large_free(p, thread_arena()) : arena_free_span_large(p);
  }
  if ((uintptr_t)p & 15) os_fatal("free(): invalid pointer", p);
  fm_tcache *tc = tcache_current();
  if (tcache_block_state(p, cls) == BLOCK_FREE) os_fatal("free(): double free detected", p);
  if (fm_unlikely(tc->state == FM_TCACHE_DEAD)) {
    mark_set(p, (const void *)FM_FREED_MARK);
    arena_free_blocks(&p, 1);
    return;
  }
  tcache_idle_sweep(tc);
  if (tc->top[cls] == tc->high[cls]) tcache_overflow(tc, cls);
  bin_push(tc, cls, p);
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
    if (purge) slots_purge(&fm_tc, fm_tc.bins->slots);   /* bookkeeping, not counted as released heap */
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
    arrays_in_use = arrays_pooled = NULL;   /* the arrays stay mapped, unused */
    pool_count = 0;
    if (fm_tc.state == FM_TCACHE_LIVE) {
      fm_tc.bins->next = fm_tc.bins->prev = NULL;
      arrays_in_use = fm_tc.bins;
    }
  }
  large_after_fork_child();
  arena_after_fork_child();
  /* The other threads' caches are gone with their threads. */
  bool own = fm_tc.state == FM_TCACHE_LIVE;
  __atomic_store_n(&grown_bytes, own ? fm_tc.limit_bytes - start_bytes : 0, __ATOMIC_RELAXED);
  memset(arena_threads, 0, sizeof arena_threads);
  if (own) arena_threads[fm_tc.arena - fm_arenas] = 1;
}

static void fork_child(void) {
  if (fork_window_ends()) fork_child_repair();
}
