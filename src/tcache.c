/* The thread cache's slow paths: a thread's set-up and exit, the bins' layout and adaptive
 * limits under a byte budget, refill and flush in batches, the idle sweep, the cache of
 * page blocks. Everything here is reached only on a miss of the inline fast paths in
 * tcache.h, and works on the calling thread's cache alone. */
#include "tcache.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "init.h"
#include "mapped.h"
#include "options.h"

/* The one slot every bin of a cache not set up (or gone) points just past: it holds the
 * sentinel, so malloc misses; its room is 0, so free misses. */
static void *boot_slot[1] = {(void *)bin_sentinel};
#define BOOT_BIN (&boot_slot[1])

__thread fm_tcache tcache_tls __attribute__((tls_model("initial-exec"))) = {
    .top = {[0 ... FM_BINS - 1] = BOOT_BIN},
    .low = {[0 ... FM_BINS - 1] = BOOT_BIN},
};

static pthread_key_t thread_key;   /* its destructor: tcache_thread_exit */

/* What a bin's slow paths saw since the last idle sweep (activity[FM_CLASS_PAGES]: the
 * cached page blocks, a malloc they served or a free they took). */
enum { BIN_REFILLED = 1, BIN_OVERFLOWED = 2, BIN_CYCLED = 4 };

/* ---- limits and layout ---- */

/* Bin bounds per class (config.h: FM_BIN_*), a thread's start layout, what all threads'
 * bins have grown beyond their start limits, in bytes: held under FM_GROWN_BUDGETS x the
 * per-thread budget, so 400 busy threads do not hold 400 full budgets, and the threads
 * with a cache (both through lock_add). */
static int32_t limit_start[FM_BINS], limit_max[FM_BINS];
static unsigned refill_max[FM_BINS];
static size_t start_bytes;   /* a thread's limit_bytes at start: sum of limit_start * size */
static size_t start_slots;   /* the slots the start layout takes, sentinels included */
static size_t grown_bytes;
static size_t live_caches;

/* The start layout gives each bin room for twice its start limit, and at least
 * FM_BIN_START_ROOM_MIN blocks (at most its largest limit), so a new thread's bins fit in
 * one page of slots and a bin's first growths move nothing: a move shifts every bin above,
 * and a short-lived thread that takes a few blocks of one large class would grow its
 * one-block bin twice. A bin that grows past its room gets room for its new limit and no
 * more: every page of the array that the bins pass through on their way up stays resident
 * while the thread lives, so spare room costs memory, where a move costs little (a bin
 * doubles at most 11 times). */
static int32_t start_room(unsigned cls) {
  int32_t room = 2 * limit_start[cls];
  if (room < FM_BIN_START_ROOM_MIN) room = FM_BIN_START_ROOM_MIN;
  return room < limit_max[cls] ? room : limit_max[cls];
}

static int32_t clamp(int32_t value, int32_t low, int32_t high) {
  return value < low ? low : value > high ? high : value;
}

static void thread_exit(void *cache);

bool tcache_init(void) {
  size_t slots = 0;
  start_bytes = start_slots = 0;   /* (a fork child may run set-up again) */
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
    int32_t size = (int32_t)size_class_size[cls];
    bool large = size > 4096;
    int32_t most = (int32_t)((large ? FM_BIN_MAX_BYTES_LARGE : FM_BIN_MAX_BYTES) / (size_t)size);
    limit_start[cls] = clamp(FM_BIN_START_BYTES / size, 1, FM_BIN_START_BLOCKS_MAX);
    limit_max[cls] = clamp(most, 2, FM_BIN_MAX_BLOCKS);
    int32_t batch = (int32_t)((large ? FM_REFILL_BYTES_LARGE : FM_REFILL_BYTES) / (size_t)size);
    refill_max[cls] = (unsigned)(large ? clamp(batch, 1, FM_REFILL_BLOCKS_LARGE)
                                       : batch < FM_REFILL_BLOCKS_MIN ? FM_REFILL_BLOCKS_MIN : batch);
    start_bytes += (size_t)limit_start[cls] * size_class_size[cls];
    start_slots += 1 + (size_t)start_room(cls);
    slots += 1 + (size_t)limit_max[cls];
  }
  thread_init((sizeof(fm_bins_array) + slots * sizeof(void *) + FM_UNIT_SIZE - 1) &
              ~(size_t)(FM_UNIT_SIZE - 1));
  return pthread_key_create(&thread_key, thread_exit) == 0;
}

static int32_t bin_count(const fm_tcache *tc, unsigned cls) { return (int32_t)(tc->top[cls] - tc->low[cls]); }
static int32_t bin_limit(const fm_tcache *tc, unsigned cls) { return tc->limit[cls]; }

/* The frees bin cls takes before its next slow path: what it has room for, at most
 * FM_TICK_FREES. Every slow path that changes the bin's count or limit sets it again: free
 * never pushes past the limit, and a bin a flush emptied does not run out of room early,
 * which would read as a bin that cycles its blocks (tcache_free_miss) and grow it. */
static int32_t room_set(fm_tcache *tc, unsigned cls) {
  int32_t room = bin_limit(tc, cls) - bin_count(tc, cls);
  fm_assert(room >= 0);
  return tc->room[cls] = room < FM_TICK_FREES ? room : FM_TICK_FREES;
}

/* The slots set aside for bin cls: up to the next bin's sentinel (the last bin's: the
 * layout's end). A bin's limit may grow up to it without moving anything. */
static int32_t bin_capacity(const fm_tcache *tc, unsigned cls) {
  void **end = cls < FM_NUM_SPAN_CLASSES ? tc->low[cls + 1] - 1 : tc->layout_end;
  return (int32_t)(end - tc->low[cls]);
}

/* Sets bin cls's top on a slow path, and with it the bin's room. */
static void bin_set_top(fm_tcache *tc, unsigned cls, void **top) {
  tc->top[cls] = top;
  room_set(tc, cls);
}

/* Bin cls's bounds, with its sentinel below low. */
static void bin_place(fm_tcache *tc, unsigned cls, void **low, int32_t count, int32_t limit) {
  low[-1] = (void *)bin_sentinel;
  tc->low[cls] = low;
  tc->limit[cls] = limit;
  bin_set_top(tc, cls, low + count);
}

static void bins_set_sentinels(fm_tcache *tc) {
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) tc->low[cls][-1] = (void *)bin_sentinel;
}

/* The start layout: the bins in class order, each after its sentinel, with its start
 * limit and room. */
static void layout_start(fm_tcache *tc) {
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
    if (count) bin_blocks_move(tc->low[c], low, (size_t)count, c);
    bin_place(tc, c, low, count, bin_limit(tc, c));
  }
  tc->layout_end += delta;
}

/* Pops the top block of non-empty bin cls, checking its mark (the fast path's test, on a
 * slow path). */
static void *bin_pop(fm_tcache *tc, unsigned cls) {
  void **top = tc->top[cls] - 1;
  bin_popped_check(*top, top);
  tc->top[cls] = top;
  return *top;
}

/* Pushes p onto bin cls, which has room. */
static void bin_push(fm_tcache *tc, unsigned cls, void *p) {
  void **top = tc->top[cls];
  mark_set(p, top);
  *top = p;
  tc->top[cls] = top + 1;
}

/* Gives the n blocks on top of bin cls back to the arenas: no block below moves, so none
 * has its mark rewritten (which would touch every block kept). */
static void flush_top(fm_tcache *tc, unsigned cls, int32_t n) {
  if (n <= 0) return;
  void **from = tc->top[cls] - n;
  bin_blocks_leave(from, (size_t)n, cls);
  arena_free_blocks(from, (size_t)n, tc->arena, false);
  bin_set_top(tc, cls, from);
}

/* Sets bin cls's limit, under the byte accounting: the blocks beyond it go back. */
static void set_limit(fm_tcache *tc, unsigned cls, int32_t limit) {
  flush_top(tc, cls, bin_count(tc, cls) - limit);
  if (limit > bin_capacity(tc, cls)) bin_widen(tc, cls, limit);
  size_t old_bytes = (size_t)bin_limit(tc, cls) * size_class_size[cls];
  size_t new_bytes = (size_t)limit * size_class_size[cls];
  tc->limit_bytes = tc->limit_bytes - old_bytes + new_bytes;
  lock_add(&grown_bytes, new_bytes - old_bytes);
  tc->limit[cls] = limit;
  room_set(tc, cls);
}

/* Doubles the bin's limit while under its maximum, the thread's byte budget and the
 * process-wide bound on grown caches. Past FM_GROWN_BUDGETS live threads the budget is
 * their fair share of that bound: threads that grow first would otherwise take it all,
 * each a full budget, and the later ones run from their small start, missing. */
static bool grow(fm_tcache *tc, unsigned cls) {
  int32_t limit = bin_limit(tc, cls);
  size_t added = (size_t)limit * size_class_size[cls];
  size_t budget = options.tcache_max_bytes;
  size_t all_budget = budget > SIZE_MAX / FM_GROWN_BUDGETS ? SIZE_MAX : FM_GROWN_BUDGETS * budget;
  size_t live = __atomic_load_n(&live_caches, __ATOMIC_RELAXED);
  if (live > FM_GROWN_BUDGETS && all_budget / live < budget) budget = all_budget / live;
  if (limit >= limit_max[cls] || tc->limit_bytes + added > budget ||
      __atomic_load_n(&grown_bytes, __ATOMIC_RELAXED) + added > all_budget)
    return false;
  set_limit(tc, cls, limit * 2 > limit_max[cls] ? limit_max[cls] : limit * 2);
  return true;
}

/* ---- page blocks ---- */

/* Gives cached page block p back to its arena, without the mark: a block the arena hands
 * out again then reads as live, with no search of the caches at its free. */
static void page_block_give_back(void *p) {
  mark_set(p, NULL);
  arena_free_pages(p);
}

/* Takes the page block last cached of those of `pages` pages; there is one. */
static void *page_block_take(fm_tcache *tc, unsigned pages) {
  fm_bins_array *bins = tc->bins;
  unsigned n = --bins->page_blocks_count[pages];
  void *p = bins->page_blocks[pages][n];
  /* (before it goes anywhere: other threads search the slots) */
  __atomic_store_n(&bins->page_blocks[pages][n], NULL, __ATOMIC_RELEASE);
  bins->page_blocks_pages -= pages;
  return p;
}

/* Caches page block p of `pages` pages, for which there is room. */
static void page_block_put(fm_tcache *tc, void *p, unsigned pages) {
  fm_bins_array *bins = tc->bins;
  unsigned n = bins->page_blocks_count[pages]++;
  bins->page_blocks_pages += pages;
  __atomic_store_n(&bins->page_blocks[pages][n], p, __ATOMIC_RELEASE);
}

/* Gives the cached page blocks back to their arenas. */
static void flush_page_blocks(fm_tcache *tc) {
  for (unsigned pages = 1; pages <= FM_PAGES_PER_UNIT; pages++)
    while (tc->bins->page_blocks_count[pages]) page_block_give_back(page_block_take(tc, pages));
}

/* Whether this thread's page-block cache holds p, of `pages` pages. */
static bool page_block_cached(const fm_tcache *tc, const void *p, unsigned pages) {
  for (unsigned k = 0; k < tc->bins->page_blocks_count[pages]; k++)
    if (tc->bins->page_blocks[pages][k] == p) return true;
  return false;
}

static size_t page_blocks_cached(fm_tcache *tc) {
  size_t count = 0;
  for (unsigned pages = 1; pages <= FM_PAGES_PER_UNIT; pages++)
    count += tc->bins->page_blocks_count[pages];
  return count;
}

bool tcache_marked_page_block_is_free(void *p) {
  if (((const uintptr_t *)p)[1] == FM_HANDED_OVER_MARK)
    return arena_handed_over_page_block_is_free(p);
  unsigned pages = page_block_pages(p);
  fm_tcache *tc = &tcache_tls;
  if (!pages) return false;
  if (tc->state == FM_TCACHE_LIVE && page_block_cached(tc, p, pages)) return true;
  return thread_other_caches_hold_page_block(tc->state == FM_TCACHE_LIVE ? tc->bins : NULL, p,
                                             pages);
}

/* ---- idle sweep ---- */

/* The purge ticks its thread's arena has run so far. */
static uint32_t arena_epoch(const fm_tcache *tc) {
  return (uint32_t)__atomic_load_n(&tc->arena->purge_epoch, __ATOMIC_RELAXED);
}

/* Bins that neither missed nor overflowed since the last sweep give back half their blocks
 * and half their limit: a quiet thread holds little memory, while a thread that only frees
 * for a while keeps the bins it frees into. */
static void sweep_bins(fm_tcache *tc, uint32_t epoch) {
  tc->misses = 0;
  tc->sweep_epoch = epoch;
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
    int32_t limit = bin_limit(tc, cls);
    if (!tc->activity[cls]) {
      if (limit > limit_start[cls])
        set_limit(tc, cls, limit / 2 < limit_start[cls] ? limit_start[cls] : limit / 2);
      else
        flush_top(tc, cls, (bin_count(tc, cls) + 1) / 2);
    }
    tc->activity[cls] = 0;
  }
  tc->free_only = 0;
  if (!tc->activity[FM_CLASS_PAGES]) flush_page_blocks(tc);
  tc->activity[FM_CLASS_PAGES] = 0;
}

/* Every slow path of a live cache reads the purge clock: the thread's arena runs its tick
 * when one is due, even when no free reaches the arena (a program that freed a heap and
 * goes on cycling a few blocks through its bins, which count down to a slow path every
 * FM_TICK_FREES frees at the most). The first slow path after each tick sweeps the bins:
 * the ticks bound the time it takes a thread that goes on missing seldom to let go of a
 * heap it freed, whose blocks in its bins pin the spans they lie in, so their pages too. */
static void sweep_if_ticked(fm_tcache *tc) {
  arena_tick_if_due(tc->arena);
  uint32_t epoch = arena_epoch(tc);
  if (epoch != tc->sweep_epoch) sweep_bins(tc, epoch);
}

/* Counts `frees` towards the next read of the purge clock, due every FM_TICK_FREES. */
static void clock_count(fm_tcache *tc, int32_t frees) {
  tc->clock_countdown -= frees;
  if (tc->clock_countdown < 0) {
    tc->clock_countdown = FM_TICK_FREES;
    sweep_if_ticked(tc);
  }
}

/* A bin's miss (empty or full) also counts towards the sweep every FM_SWEEP_MISSES. */
static void idle_sweep(fm_tcache *tc) {
  if (++tc->misses >= FM_SWEEP_MISSES) sweep_bins(tc, arena_epoch(tc));
  else sweep_if_ticked(tc);
}

/* Blocks past the bins (page blocks, but for their cache, span blocks and mapped ones)
 * bypass the bins, but their slow paths read the clock and sweep after a tick all the
 * same (page blocks' mallocs and frees, every FM_TICK_PAGE_FREES of them): a thread that
 * goes on with such blocks only, after freeing a heap, still lets its bins' blocks (and
 * so the spans they pin) go. (Not every FM_SWEEP_MISSES of them: a program busy with
 * large blocks would sweep bins it keeps using.) */
static void large_path_sweep(void) {
  fm_tcache *tc = &tcache_tls;
  if (tc->state == FM_TCACHE_LIVE) sweep_if_ticked(tc);
}

/* ---- set-up and exit ---- */

/* A cache not set up, or gone with its thread: every bin at the boot slot. */
static void reset(fm_tcache *tc, uint8_t state) {
  *tc = (fm_tcache){.state = state};
  for (unsigned cls = 0; cls < FM_BINS; cls++) tc->top[cls] = tc->low[cls] = BOOT_BIN;
}

/* Sets up the calling thread's cache, or marks it dead when that is impossible. */
static void set_up(fm_tcache *tc) {
  if (!init_process()) {
    tc->state = FM_TCACHE_DEAD;
    return;
  }
  /* The first call's set-up may have allocated (pthread_atfork), setting this thread up. */
  if (tc->state != FM_TCACHE_BOOT) return;
  if (!thread_join(&tc->bins, &tc->arena)) {
    tc->state = FM_TCACHE_DEAD;
    return;
  }
  layout_start(tc);
  tc->limit_bytes = start_bytes;
  lock_add(&live_caches, 1);
  tc->sweep_epoch = arena_epoch(tc);   /* (new bins have nothing to sweep) */
  /* Live before pthread_setspecific: it callocs for high key numbers. */
  tc->state = FM_TCACHE_LIVE;
  pthread_setspecific(thread_key, tc);
}

/* The calling thread's cache, set up at its first slow path. The set-up keeps errno: its
 * libc calls (pthread_key_create, pthread_atfork, pthread_setspecific) may allocate, and a
 * failed allocation sets it, within free too. */
static fm_tcache *current(void) {
  fm_tcache *tc = &tcache_tls;
  if (tc->state == FM_TCACHE_BOOT) {
    int saved = errno;
    set_up(tc);
    errno = saved;
  }
  return tc;
}

/* The arena of the calling thread's cache; arena 0 while it has none. */
static fm_arena *thread_arena(void) {
  return tcache_tls.state == FM_TCACHE_LIVE ? tcache_tls.arena : &arenas[0];
}

fm_arena *tcache_arena_for_large(void) {
  current();
  large_path_sweep();
  return thread_arena();
}

/* ---- refill and flush ---- */

/* Bin `growing` took a new span: every other bin that holds more than a refill brings
 * (blocks the thread freed and has not used again) gives them all back. Scattered over
 * their spans, they would keep every one of them from emptying, so a program that frees
 * one structure and builds another of other sizes would build it in new memory; given
 * back, the spans empty and the arena hands their units to the growing class. A bin
 * holding one refill or less, as the bins of a heap that grows in several classes at
 * once do, keeps its blocks. */
static void release_freed_blocks(fm_tcache *tc, unsigned growing) {
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++)
    if (cls != growing && bin_count(tc, cls) > (int32_t)refill_max[cls])
      flush_top(tc, cls, bin_count(tc, cls));
}

static uintptr_t untagged(const void *block) {
  return (uintptr_t)block & ~(uintptr_t)(FM_BLOCK_FRESH | FM_BLOCK_BOXED);
}

/* Whether refill blocks low[0 .. got) (highest first, tagged) hold every block that shares
 * a cache line with low[k]: those below it next in the array, those above it before. A
 * span starts on a line, so no block below the first one is missing. */
static bool lines_brought(void *const *low, unsigned got, unsigned k, uintptr_t stride) {
  uintptr_t p = untagged(low[k]), line = FM_CACHE_LINE;
  uintptr_t from = p & ~(line - 1), end = (p + stride + line - 1) & ~(line - 1);
  unsigned j = k;
  for (uintptr_t q = p; q > from; q -= stride)
    if (++j >= got || untagged(low[j]) != q - stride) return false;
  j = k;
  for (uintptr_t q = p + stride; q < end; q += stride)
    if (j-- == 0 || untagged(low[j]) != q) return false;
  return true;
}

/* The top block of a refill is the next malloc's. When it shares a cache line with a block
 * the refill did not bring, one of the next few whose lines it brought whole takes its
 * place: a thread that freed a block it was handed gave it back to its span (free_slow),
 * where the refill of a thread using a neighbour finds it first, and two threads would
 * write one line. One thread alone shares lines with nobody; blocks of a stride that
 * lines divide share none. */
static void top_in_own_line(void **low, unsigned got, unsigned cls) {
  uintptr_t stride = size_class_stride[cls];
  if (!lock_threaded() || stride % FM_CACHE_LINE == 0) return;
  for (unsigned k = got, tries = 0; k-- > 0 && tries++ < FM_REFILL_LINE_TRIES;)
    if (lines_brought(low, got, k, stride)) {
      void *top = low[got - 1];
      low[got - 1] = low[k];
      low[k] = top;
      return;
    }
}

/* zeroed: for calloc (see arena_alloc_batch); when set, the bin stays empty and the one
 * block taken is at its low end. */
static bool refill(fm_tcache *tc, unsigned cls, bool *zeroed) {
  /* Slow start: a bin that keeps missing grows, up to two full refills. Beyond that a
   * larger limit makes no refill larger; it would only spend the process-wide budget
   * (a producer thread, which never frees, kept growing its bins until the budget ran
   * out, and then other threads' bins refilled one or two blocks at a time). A bin that
   * also takes frees grows further when they overflow it. */
  if ((tc->activity[cls] & BIN_REFILLED) && bin_limit(tc, cls) < 2 * (int32_t)refill_max[cls])
    grow(tc, cls);
  unsigned want = (unsigned)(bin_limit(tc, cls) + 1) / 2;
  if (want > refill_max[cls]) want = refill_max[cls];
  void **low = tc->low[cls];
  bool took_span;
  unsigned got = arena_alloc_batch(tc->arena, cls, want, (unsigned)bin_limit(tc, cls), low, zeroed,
                                  &took_span);
  if (!got) return false;
  tc->activity[cls] |= BIN_REFILLED;
  tc->free_only &= ~((uint64_t)1 << cls);
  tc->ever_refilled |= (uint64_t)1 << cls;
  if (took_span) release_freed_blocks(tc, cls);   /* (bin cls and its new blocks stay put) */
  if (zeroed && *zeroed) return true;   /* (a block never handed out, untagged: no mark) */
  top_in_own_line(low, got, cls);
  for (void **slot = low, **end = low + got; slot < end; slot++) {
    void *p = bin_refilled(*slot);
    *slot = p;
    mark_set(p, slot);
  }
  bin_set_top(tc, cls, low + got);
  return true;
}

/* Empties bin cls into batch[n ..] if all its blocks fit; returns the new count. */
static size_t bin_move_all(fm_tcache *tc, unsigned cls, void **batch, size_t n) {
  size_t count = (size_t)bin_count(tc, cls);
  if (n + count > FM_FREE_ONLY_BATCH) return n;   /* it waits for the next batch */
  bin_blocks_leave(tc->low[cls], count, cls);
  memcpy(batch + n, tc->low[cls], count * sizeof(void *));
  bin_set_top(tc, cls, tc->low[cls]);
  return n + count;
}

/* Gives back every block of bin cls and of the other free-only bins, as far as they fit in
 * one batch: one arena_free_blocks call, so one lock per owning arena for all of them.
 * When the thread never allocated from any of those bins and shares its arena, it is the
 * consumer of another thread of the arena, most likely: the blocks of its own arena are
 * handed over to it then, as other arenas' are, so the producer's next refill takes them
 * back as they are, not through the spans' bitmaps, which the two threads' cores would
 * otherwise pass back and forth. */
static void flush_free_only(fm_tcache *tc, unsigned cls) {
  void *batch[FM_FREE_ONLY_BATCH];
  uint64_t bins = tc->free_only | (uint64_t)1 << cls;
  bool consumer = !(bins & tc->ever_refilled) &&
                  __atomic_load_n(&tc->arena->threads, __ATOMIC_RELAXED) > 1;
  size_t n = bin_move_all(tc, cls, batch, 0);
  for (uint64_t others = bins & ~((uint64_t)1 << cls); others; others &= others - 1)
    n = bin_move_all(tc, (unsigned)__builtin_ctzll(others), batch, n);
  if (n) arena_free_blocks(batch, n, tc->arena, consumer);
}

/* Free found the bin full. A bin this thread also allocates from grows, else gives half
 * its blocks back. A thread that only frees into it (the consumer of a producer) gains
 * nothing from holding its blocks: they all go back, with those of its other such bins in
 * the same batch, and the bin grows to a few KiB so that the batches stay large. (A bin
 * that grew while its thread allocated keeps its limit: shrinking it in a phase of frees
 * would make the next phase of mallocs refill it again.) */
static void overflow(fm_tcache *tc, unsigned cls) {
  if (tc->activity[cls] & BIN_REFILLED) {
    if (!grow(tc, cls)) flush_top(tc, cls, (bin_count(tc, cls) + 1) / 2);
  } else {
    /* (a bin grown while it was refilled too may hold more than one batch) */
    flush_top(tc, cls, bin_count(tc, cls) - FM_FREE_ONLY_BATCH);
    tc->free_only |= (uint64_t)1 << cls;
    flush_free_only(tc, cls);
    int32_t limit = bin_limit(tc, cls);
    if (limit < FM_FREE_ONLY_MIN_BLOCKS || (size_t)limit * size_class_size[cls] < FM_FREE_ONLY_BIN_BYTES)
      grow(tc, cls);
  }
  tc->activity[cls] |= BIN_OVERFLOWED;
}

/* Every bin in one array, so the arenas are locked once each, not once a bin: the bins
 * lie in class order, so each moves down to follow the previous one, over the sentinels
 * (bins that stay in use need bins_set_sentinels after). */
static void flush_all(fm_tcache *tc) {
  flush_page_blocks(tc);
  void **start = tc->bins->slots, **end = start;
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
    int32_t count = bin_count(tc, cls);
    if (!count) continue;
    bin_blocks_leave(tc->low[cls], (size_t)count, cls);
    memmove(end, tc->low[cls], (size_t)count * sizeof(void *));
    end += count;
    bin_set_top(tc, cls, tc->low[cls]);
  }
  if (end > start) arena_free_blocks(start, (size_t)(end - start), tc->arena, false);
}

/* Purges the pages of the (empty) bins' array from `from` up to the layout's end. */
static void slots_purge(fm_tcache *tc, void **from) {
  uintptr_t page = FM_PAGE_SIZE - 1;
  char *start = (char *)(((uintptr_t)from + page) & ~page);
  char *end = (char *)(((uintptr_t)tc->layout_end + page) & ~page);
  if (end > start) os_purge(start, (size_t)(end - start));
}

void tcache_flush_mine(bool purge) {
  fm_tcache *tc = &tcache_tls;
  if (tc->state != FM_TCACHE_LIVE) return;
  flush_all(tc);
  if (purge) slots_purge(tc, tc->bins->slots);
  bins_set_sentinels(tc);
}

/* The thread key's destructor: the cache's blocks and array go back, the pages its grown
 * bins took too (the next thread starts small, and lays its bins out anew). */
static void thread_exit(void *cache) {
  fm_tcache *tc = cache;
  flush_all(tc);
  lock_add(&grown_bytes, start_bytes - tc->limit_bytes);
  lock_add(&live_caches, (size_t)-1);
  slots_purge(tc, tc->bins->slots + start_slots);
  thread_leave(tc->bins, tc->arena);
  reset(tc, FM_TCACHE_DEAD);
}

void tcache_holdings(size_t *bytes, size_t *blocks) {
  fm_tcache *tc = &tcache_tls;
  *bytes = *blocks = 0;
  if (tc->state != FM_TCACHE_LIVE) return;
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
    *blocks += (size_t)bin_count(tc, cls);
    *bytes += (size_t)bin_count(tc, cls) * size_class_size[cls];
  }
  *blocks += page_blocks_cached(tc);
  *bytes += FM_PAGE_SIZE * tc->bins->page_blocks_pages;
}

void tcache_after_fork_child(void) {
  fm_tcache *tc = &tcache_tls;
  bool own = tc->state == FM_TCACHE_LIVE;
  __atomic_store_n(&grown_bytes, own ? tc->limit_bytes - start_bytes : 0, __ATOMIC_RELAXED);
  __atomic_store_n(&live_caches, own ? 1 : 0, __ATOMIC_RELAXED);
  thread_after_fork_child(own ? tc->bins : NULL, own ? tc->arena : NULL);
}

/* ---- malloc's slow paths ---- */

/* One block straight from the arena, for threads whose cache is gone. */
static void *arena_malloc_one(unsigned cls) {
  void *block;
  if (!arena_alloc_batch(&arenas[0], cls, 1, 1, &block, NULL, NULL)) return NULL;
  return bin_refilled(block);
}

/* A malloc that missed in bin cls: refill the bin, or, for a thread whose cache is gone,
 * one block straight from an arena. For calloc (zeroed: non-NULL), *zeroed says whether
 * the block reads zero already (then it came alone, and untouched). Out of memory, it may
 * try once more (see init_release_for_retry). */
static void *malloc_slow(fm_tcache *tc, unsigned cls, bool *zeroed) {
  for (bool retried = false;; retried = true) {
    if (fm_unlikely(tc->state == FM_TCACHE_DEAD)) {
      void *block = init_process() ? arena_malloc_one(cls) : NULL;
      if (block) return block;
    } else {
      idle_sweep(tc);
      /* The fast path's compare failed on a bin that is not empty (bin_pop reports it), or
       * a nested call (pthread_setspecific) filled the bin. */
      if (tc->top[cls] != tc->low[cls]) return bin_pop(tc, cls);
      if (refill(tc, cls, zeroed)) return zeroed && *zeroed ? tc->low[cls][0] : bin_pop(tc, cls);
    }
    if (retried || !init_release_for_retry()) break;
  }
  errno = ENOMEM;
  return NULL;
}

void *tcache_malloc_miss(size_t size, unsigned cls) {
  fm_tcache *tc = current();
  return malloc_slow(tc, cls ? cls : size_class_of(size), NULL);   /* the table is filled now */
}

void *tcache_calloc_zeroed(size_t size) {
  unsigned cls = size_class_of(size);   /* 0 before set-up: class 0's bin is always empty */
  bool zeroed = false;
  void *p;
  if (tcache_tls.top[cls] != tcache_tls.low[cls]) {
    p = bin_pop(&tcache_tls, cls);
  } else {
    fm_tcache *tc = current();
    p = malloc_slow(tc, cls ? cls : size_class_of(size), &zeroed);   /* the table is filled now */
  }
  if (p && !zeroed) memset(p, 0, size);
  return p;
}

void *tcache_malloc_pages(size_t size) {
  fm_tcache *tc = &tcache_tls;
  if (fm_unlikely(tc->state != FM_TCACHE_LIVE)) return NULL;
  unsigned pages = (unsigned)((size + FM_PAGE_SIZE - 1) / FM_PAGE_SIZE);
  /* A block one page longer serves too: with blocks of random lengths, more mallocs find
   * one. */
  const uint8_t *count = tc->bins->page_blocks_count;
  if (!count[pages] && pages < FM_PAGES_PER_UNIT && count[pages + 1]) pages++;
  if (count[pages]) {
    void *p = page_block_take(tc, pages);
    mark_set(p, NULL);
    tc->activity[FM_CLASS_PAGES] |= BIN_REFILLED;
    return p;
  }
  clock_count(tc, FM_TICK_FREES / FM_TICK_PAGE_FREES);
  bool zeroed;
  return arena_alloc_pages(tc->arena, size, 0, &zeroed);
}

/* ---- free's slow paths ---- */

/* A block's second word is a mark only if the block is free, and a live block may hold
 * anything there, old marks included (a program may copy uninitialized bytes). A mark
 * naming a slot of this thread's bin that holds p is proof; FM_FREED_MARK is checked
 * against the span; a slot of another thread's bins cannot be checked without reading that
 * thread's bounds, which could be gone with it. */
fm_block_state tcache_block_state(void *p, unsigned cls) {
  if (!FM_FREE_MARK) return BLOCK_LIVE;
  void **mark = ((void **const *)p)[1];
  /* (a block in its span, or in its arena's box: the arena drains its boxes first) */
  if (mark_freed_or((uintptr_t)mark, FM_BOXED_BIT))
    return arena_small_is_free(p) ? BLOCK_FREE : BLOCK_LIVE;
  if ((uintptr_t)mark & (sizeof(void *) - 1)) return BLOCK_LIVE;   /* no slot's address */
  fm_tcache *tc = &tcache_tls;
  if (tc->state == FM_TCACHE_LIVE && mark >= tc->bins->slots && mark < tc->layout_end)
    return mark >= tc->low[cls] && mark < tc->top[cls] && *mark == p ? BLOCK_FREE : BLOCK_LIVE;
  return unit_map_class_checked(mark) == FM_CLASS_BINS ? BLOCK_UNSURE : BLOCK_LIVE;
}

/* free of a page block of the thread's arena: onto its length's stack in the cache while
 * that has room, else back to the arena (giving back the cached block instead, to keep the
 * newer one, would store into a block long out of the CPU's cache). A block of another
 * arena goes to that arena's list of handed-over blocks. A pointer that starts no live
 * block gets the arena's verdict. */
static fm_noinline void free_pages_slow(void *p) {
  fm_tcache *tc = current();
  unsigned pages = page_block_pages(p);
  if (!pages || tc->state != FM_TCACHE_LIVE) return arena_free_pages(p);
  /* (a sweep may give the cached blocks back: before reading them) */
  clock_count(tc, FM_TICK_FREES / FM_TICK_PAGE_FREES);
  /* (cached here, it would go back through its arena's lock when this cache overflows,
   * while that arena's threads take the lock for their own page blocks) */
  fm_arena *owner = chunk_of(p)->arena;
  if (owner != tc->arena) {
    if (tcache_page_block_is_free(p)) diag_fatal(DIAG_DOUBLE_FREE, p);
    return arena_hand_over_page_block(owner, p);
  }
  if (page_block_cached(tc, p, pages) || tcache_page_block_is_free(p))
    diag_fatal(DIAG_DOUBLE_FREE, p);
  tc->activity[FM_CLASS_PAGES] |= BIN_OVERFLOWED;
  if (tc->bins->page_blocks_count[pages] == FM_PAGE_BLOCKS_A_LENGTH ||
      tc->bins->page_blocks_pages + pages > FM_PAGE_CACHE_PAGES)
    return arena_free_pages(p);
  mark_set(p, (const void *)FM_FREED_MARK);
  page_block_put(tc, p, pages);
}

/* free of p, not NULL, whose unit-map class is cls (not a page block's). */
static fm_noinline void free_slow(void *p, unsigned cls) {
  if (cls == 0 || cls == FM_CLASS_BINS) diag_fatal(DIAG_INVALID_FREE, p);
  if (cls > FM_NUM_SPAN_CLASSES) {
    large_path_sweep();
    return cls == FM_CLASS_MAPPED ? mapped_free(p, thread_arena()) : arena_free_span_block(p);
  }
  if ((uintptr_t)p & 15) diag_fatal(DIAG_INVALID_FREE, p);
  /* A thread whose first call is free was dealt the block by the thread that made it. In
   * the bin it would be the block of this thread's first malloc, and of every one after
   * (a bin is a stack), so the two threads would go on writing one cache line; it goes
   * back to its span instead. */
  bool foreign = tcache_tls.state == FM_TCACHE_BOOT;
  fm_tcache *tc = current();
  if (tcache_block_state(p, cls) == BLOCK_FREE) diag_fatal(DIAG_DOUBLE_FREE, p);
  if (fm_unlikely(tc->state == FM_TCACHE_DEAD || foreign)) {
    mark_set(p, (const void *)FM_FREED_MARK);
    arena_free_blocks(&p, 1, tc->arena, false);   /* (NULL when dead) */
    return;
  }
  idle_sweep(tc);
  if (bin_count(tc, cls) == bin_limit(tc, cls)) overflow(tc, cls);
  bin_push(tc, cls, p);
  room_set(tc, cls);
}

/* free never changes errno: the OS calls on its slow paths put it back (os.c), and so
 * does a thread's set-up (current), the only other place where it may be set. */
void tcache_free_miss(void *p, unsigned cls) {
  /* free(NULL), which many programs call freely, first: class 0's bin is always full, so
   * each one comes here. */
  if (!p) return;
  fm_tcache *tc = &tcache_tls;
  /* A live bin with room: its countdown ran out. The fast path's push, and every
   * FM_TICK_FREES frees the purge clock. (A cache not live has every limit 0.) */
  if (cls - 1u < FM_NUM_SPAN_CLASSES && bin_count(tc, cls) < bin_limit(tc, cls)) {
    int32_t limit = bin_limit(tc, cls);
    if (2 * bin_count(tc, cls) <= limit && (size_t)limit * size_class_size[cls] < FM_CYCLING_BIN_BYTES)
      grow(tc, cls);
    tc->activity[cls] |= BIN_CYCLED;
    bin_push(tc, cls, p);
    clock_count(tc, room_set(tc, cls) + 1);
    return;
  }
  /* A page block's own path, a tail call: it needs none of free_slow's stack frame. */
  if (cls == FM_CLASS_PAGES) return free_pages_slow(p);
  free_slow(p, cls);
}
