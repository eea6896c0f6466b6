/* Giving memory back (issue 5): malloc_trim(0) after freeing a large heap lowers RSS and
 * returns 1; memory freed and purged is correct when reused; RSS does not grow with the
 * number of threads created and joined. Checks amounts only, never time. */
#include "fm_test.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/resource.h>

static void test_uses_fastmalloc(void **state) { fmt_assert_uses_fastmalloc(); }

/* Small blocks, of 16-256 bytes. */
static size_t small_size(unsigned i) { return 16 + (i * 37) % 241; }

/* Mixed sizes: mostly small, some span-sized, a few large blocks. */
static size_t heap_size(unsigned i) {
  if (i % 3000 == 2999) return 128 * FMT_KIB + (i * 7919) % (896 * FMT_KIB);
  if (i % 100 == 99) return 4 * FMT_KIB + (i * 131) % (28 * FMT_KIB);
  return small_size(i);
}

static void shuffle(unsigned *order, unsigned n, uint64_t seed) {
  uint64_t rng = fmt_seed_state(seed);
  for (unsigned i = 0; i < n; i++) order[i] = i;
  for (unsigned i = n - 1; i > 0; i--) {
    unsigned j = (unsigned)(fmt_rand(&rng) % (i + 1)), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
}

enum { HEAP_BLOCKS = 300000 };
static void *heap[HEAP_BLOCKS];
static unsigned order[HEAP_BLOCKS];

/* Allocates a heap of blocks of size_of(i) bytes, touching every requested byte; returns
 * the bytes requested. */
static size_t build_heap_of(size_t (*size_of)(unsigned), unsigned char fill) {
  size_t total = 0;
  for (unsigned i = 0; i < HEAP_BLOCKS; i++) {
    size_t n = size_of(i);
    assert_non_null(heap[i] = malloc(n));
    memset(heap[i], fill, n);
    total += n;
  }
  return total;
}

/* The mixed heap. */
static size_t build_heap(unsigned char fill) { return build_heap_of(heap_size, fill); }

/* Frees heap[0 .. n) in random order. */
static void free_heap_shuffled_n(unsigned n, uint64_t seed) {
  shuffle(order, n, seed);
  for (unsigned i = 0; i < n; i++) {
    free(heap[order[i]]);
    heap[order[i]] = NULL;
  }
}

static void free_heap_shuffled(uint64_t seed) { free_heap_shuffled_n(HEAP_BLOCKS, seed); }

static void test_trim_lowers_rss(void **state) {
  size_t rss0 = fmt_rss();
  size_t total = build_heap(0x11);
  size_t rss1 = fmt_rss();
  if (rss1 < rss0 + total / 10 * 9)
    fail_msg("heap of %zu bytes raised RSS only from %zu to %zu", total, rss0, rss1);
  free_heap_shuffled(1);
  int released = malloc_trim(0);
  size_t rss2 = fmt_rss();
  print_message("heap %zu: rss %zu -> %zu -> %zu after malloc_trim\n", total, rss0, rss1, rss2);
  assert_int_equal(released, 1);
  assert_int_equal(malloc_trim(0), 0);   /* nothing new to give back */
  if (rss2 > rss0 + total / 4)
    fail_msg("after malloc_trim RSS is %zu, was %zu before a %zu-byte heap", rss2, rss0, total);
}

/* malloc_trim(0) also purges the whole pages of free blocks inside spans that keep a live
 * block: with one block in 1000 kept, nearly every page of the heap goes back, the kept
 * blocks' contents stay. */
static void test_trim_purges_partly_used_spans(void **state) {
  malloc_trim(0);
  size_t rss0 = fmt_rss();
  size_t total = build_heap_of(small_size, 0x3C);
  for (unsigned i = 0; i < HEAP_BLOCKS; i++)
    if (i % 1000) {
      free(heap[i]);
      heap[i] = NULL;
    } else {
      fmt_fill(heap[i], small_size(i), i);
    }
  assert_int_equal(malloc_trim(0), 1);
  size_t rss1 = fmt_rss();
  print_message("heap %zu: rss %zu -> %zu after freeing 999 of 1000 and malloc_trim\n", total, rss0, rss1);
  if (rss1 > rss0 + total / 4)
    fail_msg("after malloc_trim RSS is %zu, was %zu before a %zu-byte heap", rss1, rss0, total);
  for (unsigned i = 0; i < HEAP_BLOCKS; i += 1000) {
    if (!fmt_check(heap[i], small_size(i), i)) fail_msg("kept block %u changed by a purge", i);
    free(heap[i]);
    heap[i] = NULL;
  }
}

/* Goes on allocating a little (`count` blocks of `size` bytes, at most 4096, every 10 ms,
 * for at most 1000 rounds: 100 purge delays, a bound on progress, not a timing) until at
 * most `bound` bytes are mapped; returns the mapped bytes then. */
static size_t allocate_until_mapped_at_most(size_t bound, int count, size_t size) {
  static void *blocks[4096];
  assert_true(count <= 4096);
  size_t mapped = fm_mapped_bytes();
  for (int round = 0; round < 1000 && mapped > bound; round++) {
    usleep(10 * 1000);
    for (int i = 0; i < count; i++) assert_non_null(blocks[i] = malloc(size));
    for (int i = 0; i < count; i++) free(blocks[i]);
    mapped = fm_mapped_bytes();
  }
  return mapped;
}

/* Builds a heap of blocks of size_of(i) bytes and frees it in random order (seed), then
 * goes on allocating rounds of `count` blocks of `size` bytes until at most a quarter of
 * the heap's bytes stays mapped beyond what was mapped before it. */
static void check_freed_heap_unmapped(size_t (*size_of)(unsigned), unsigned seed, int count,
                                      size_t size) {
  malloc_trim(0);
  size_t mapped0 = fm_mapped_bytes();
  size_t total = build_heap_of(size_of, (unsigned char)(seed * 0x11));
  size_t mapped1 = fm_mapped_bytes();
  free_heap_shuffled(seed);
  size_t mapped2 = allocate_until_mapped_at_most(mapped0 + total / 4, count, size);
  print_message("heap %zu: mapped %zu -> %zu -> %zu\n", total, mapped0, mapped1, mapped2);
  if (mapped2 > mapped0 + total / 4)
    fail_msg("10 s after freeing a %zu-byte heap, %zu bytes are mapped (%zu before it)", total,
             mapped2, mapped0);
}

/* Without malloc_trim, the chunks of a heap that was freed go back to the OS a few purge
 * ticks later (all but a small reserve), once the thread cache, which still holds blocks
 * from all over the heap, has shrunk: the program goes on allocating a little, so the
 * cache's slow paths run its idle sweeps and the arena's purge ticks. A bound on progress,
 * not a timing: it allows 100 purge delays. */
static void test_freed_heap_unmapped_without_trim(void **state) {
  check_freed_heap_unmapped(heap_size, 3, 4096, 1000);
}

/* The same when the program goes on with large blocks only, which bypass the thread
 * cache: their slow paths run its idle sweeps too, so the blocks it still holds from all
 * over the heap go back. */
static void test_freed_heap_unmapped_with_large_blocks_only(void **state) {
  check_freed_heap_unmapped(heap_size, 6, 8, 100 * FMT_KIB);
}

/* A quarter of the blocks of 1000 bytes, the rest of 48: spans of both classes in every
 * chunk. */
static size_t interleaved_size(unsigned i) { return i % 4 == 3 ? 1000 : 48; }

/* The same when the program goes on with a size the heap had all over its chunks: the
 * empty spans of that class that its rounds take again lie in every chunk of the freed
 * heap. They must move down to the lowest chunks, so the others drain. */
static void test_freed_heap_unmapped_while_its_spans_cycle(void **state) {
  check_freed_heap_unmapped(interleaved_size, 5, 4096, 1000);
}

/* A program that reaches its arena seldom (one large block every 20 ms) still gets a freed
 * heap purged a purge delay or two later, as every free that reaches the arena reads the
 * clock. The heap is another thread's, whose exit gave its cached blocks back, so no
 * cache pins its spans. A bound on progress (at most 60 such frees, each 20 ms or more
 * after the last: 12 purge delays), not a timing. */
static void *heap_built_and_freed(void *arg) {
  build_heap(0x44);
  free_heap_shuffled(4);
  return arg;
}

/* A malloc and a free of a chunk span's block, which no thread cache holds: both reach the
 * arena, whose free path reads the purge clock. */
static void arena_malloc_and_free(void) { free(fmt_launder(malloc(100 * FMT_KIB))); }

static void test_freed_heap_purged_at_few_arena_frees(void **state) {
  malloc_trim(0);
  size_t rss0 = fmt_rss(), total = 0;
  for (unsigned i = 0; i < HEAP_BLOCKS; i++) total += heap_size(i);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, heap_built_and_freed, NULL), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  int frees = 0;
  while (fmt_rss() > rss0 + total / 4 && frees < 1000) {
    usleep(20 * 1000);
    arena_malloc_and_free();
    frees++;
  }
  print_message("heap %zu: purged after %d arena frees 20 ms apart\n", total, frees);
  if (frees > 60) fail_msg("a freed %zu-byte heap was still resident after %d arena frees", total, frees);
}

/* Page faults of the process so far. */
static long minor_faults(void) {
  struct rusage usage;
  assert_int_equal(getrusage(RUSAGE_SELF, &usage), 0);
  return usage.ru_minflt;
}

/* Waits a purge delay and a half, then reaches the arena, which runs a purge tick then. */
static void pause_for_a_tick(void) {
  usleep(150 * 1000);
  arena_malloc_and_free();
}

/* A heap freed and built again a few purge ticks later reuses its pages: a tick keeps as
 * many units resident as the arena took in one of its last ticks (the heap's first build),
 * so the second build faults in few pages, where purged units would fault in every one.
 * Blocks of 128 KiB, spans of their own, which no thread cache holds. Three ticks pass
 * between the builds: one to see the freed units stay free, the next two to purge them. */
static void test_heap_built_again_after_ticks_reuses_pages(void **state) {
  enum { BLOCKS = 256, SIZE = 128 * FMT_KIB };
  malloc_trim(0);
  pause_for_a_tick();   /* so the first build's units are all taken within one tick */
  for (int build = 0; build < 2; build++) {
    long faults = minor_faults();
    for (unsigned i = 0; i < BLOCKS; i++) {
      assert_non_null(heap[i] = malloc(SIZE));
      memset(heap[i], build + 1, SIZE);
    }
    faults = minor_faults() - faults;
    long pages = (long)BLOCKS * SIZE / 4096;
    print_message("build %d: %ld page faults for %ld pages\n", build, faults, pages);
    if (build == 1 && faults > pages / 2)
      fail_msg("a heap built again 3 purge ticks after it was freed faulted in %ld of its %ld "
               "pages", faults, pages);
    free_heap_shuffled_n(BLOCKS, (uint64_t)build + 11);
    for (int tick = 0; build == 0 && tick < 3; tick++) pause_for_a_tick();
  }
}

/* A program that frees its heap and goes on working a little (256 blocks of 48 bytes every
 * 10 ms, all malloc'ed then all freed, or one at a time) gets the heap's pages back without
 * malloc_trim, though its few blocks never leave the thread cache's fast paths: the bins'
 * free countdowns bring a slow path, which reads the purge clock, every so many frees. A
 * bound on progress (at most 300 rounds, 30 purge delays), not a timing. */
static void check_freed_heap_purged_while_cycling(bool batch, uint64_t seed) {
  static void *blocks[256];
  malloc_trim(0);
  size_t rss0 = fmt_rss(), total = build_heap((unsigned char)seed);
  size_t rss1 = fmt_rss();
  free_heap_shuffled(seed);
  int rounds = 0;
  while (fmt_rss() > rss0 + total / 4 && rounds < 300) {
    usleep(10 * 1000);
    for (int i = 0; i < 256; i++) {
      assert_non_null(blocks[i] = malloc(48));
      memset(blocks[i], i, 48);
      if (!batch) free(blocks[i]);
    }
    if (batch)
      for (int i = 0; i < 256; i++) free(blocks[i]);
    rounds++;
  }
  print_message("heap %zu: rss %zu -> %zu, then %zu after %d rounds\n", total, rss0, rss1,
                fmt_rss(), rounds);
  if (rounds == 300)
    fail_msg("3 s after freeing a %zu-byte heap, RSS is %zu (%zu before it)", total, fmt_rss(), rss0);
}

static void test_freed_heap_purged_while_cycling_a_batch(void **state) {
  check_freed_heap_purged_while_cycling(true, 7);
}

static void test_freed_heap_purged_while_cycling_pairs(void **state) {
  check_freed_heap_purged_while_cycling(false, 8);
}

/* Two threads that pass blocks to each other (each frees the other's last round, then
 * allocates its own): RSS after 400 rounds stays within 16 MiB of where 40 rounds left it.
 * Small blocks, 2000 a round of 16 bytes to 2 KiB: blocks stranded in the freeing thread's
 * cache, or spans the owner never reuses, would add up to about 2 MiB a round. Page
 * blocks, 200 a round of 8-64 KiB: blocks handed to the owning arena and never freed there
 * would add up to about 7 MiB a round. */
enum { PASS_BLOCKS = 2000, PASS_ROUNDS = 400, PASS_WARM = 40 };
static void *pass_blocks[2][PASS_BLOCKS];
static pthread_barrier_t pass_round;
static size_t pass_rss_warm;
static struct { unsigned blocks; size_t least, range; } pass_kind;

static void *pass_blocks_run(void *arg) {
  unsigned me = (unsigned)(uintptr_t)arg;
  uint64_t rng = fmt_seed_state(me + 11);
  for (int round = 0; round < PASS_ROUNDS; round++) {
    for (unsigned i = 0; i < pass_kind.blocks; i++) {
      free(pass_blocks[!me][i]);   /* the other thread's, from the last round */
      pass_blocks[!me][i] = NULL;
    }
    pthread_barrier_wait(&pass_round);
    for (unsigned i = 0; i < pass_kind.blocks; i++) {
      size_t n = pass_kind.least + fmt_rand(&rng) % pass_kind.range;
      assert_non_null(pass_blocks[me][i] = malloc(n));
      memset(pass_blocks[me][i], (int)i, n < 4096 ? n : 4096);
    }
    pthread_barrier_wait(&pass_round);
    if (round == PASS_WARM && me == 0) pass_rss_warm = fmt_rss();
  }
  return arg;
}

static void expect_passed_blocks_rss_bounded(unsigned blocks, size_t least, size_t most) {
  pass_kind.blocks = blocks;
  pass_kind.least = least;
  pass_kind.range = most - least + 1;
  pthread_t t[2];
  assert_int_equal(pthread_barrier_init(&pass_round, NULL, 2), 0);
  for (uintptr_t i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&t[i], NULL, pass_blocks_run, (void *)i), 0);
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  size_t rss_end = fmt_rss();
  for (int me = 0; me < 2; me++)
    for (unsigned i = 0; i < blocks; i++) {
      free(pass_blocks[me][i]);
      pass_blocks[me][i] = NULL;
    }
  pthread_barrier_destroy(&pass_round);
  print_message("blocks of %zu-%zu bytes passed between threads: rss %zu after %d rounds, "
                "%zu after %d\n", least, most, pass_rss_warm, PASS_WARM, rss_end, PASS_ROUNDS);
  if (rss_end > pass_rss_warm + 16 * FMT_MIB)
    fail_msg("RSS grew from %zu to %zu while two threads passed blocks of %zu-%zu bytes",
             pass_rss_warm, rss_end, least, most);
}

static void test_blocks_passed_between_threads_rss_bounded(void **state) {
  expect_passed_blocks_rss_bounded(PASS_BLOCKS, 16, 2048);
}

static void test_page_blocks_passed_between_threads_rss_bounded(void **state) {
  expect_passed_blocks_rss_bounded(200, 8 * 1024 + 1, 64 * 1024);
}

/* A thread's cache holds at most its byte budget (FASTMALLOC_TCACHE_MAX, 4 MiB by default):
 * a thread that malloc'ed and freed 2 MiB of each class from 1 KiB to 4 KiB over and over,
 * so that its bins grew, then waits, pins no more than that (plus a little) after the main
 * thread's trim, which cannot reach its cache. Without the budget it pins 8.6 MiB. */
enum { BUDGET_CLASSES = 9, BUDGET_BYTES_PER_CLASS = 2 << 20, BUDGET_MOST_BLOCKS = 2048 };
static void *budget_blocks[BUDGET_CLASSES][BUDGET_MOST_BLOCKS];
static pthread_barrier_t budget_phase;

static size_t budget_class_size(unsigned c) {   /* 1, 1.25, 1.5, 1.75, 2, ..., 3.5 KiB, 4 KiB */
  return c == BUDGET_CLASSES - 1 ? 4096 : (1024u << (c / 4)) + (c % 4) * (256u << (c / 4));
}

static void *grow_cache_then_wait(void *arg) {
  for (int round = 0; round < 6; round++) {
    for (int pass = 0; pass < 2; pass++) {
      for (unsigned c = 0; c < BUDGET_CLASSES; c++) {
        size_t size = budget_class_size(c), n = BUDGET_BYTES_PER_CLASS / size;
        if (n > BUDGET_MOST_BLOCKS) n = BUDGET_MOST_BLOCKS;
        for (size_t i = 0; i < n; i++) {
          if (pass == 0) {
            assert_non_null(budget_blocks[c][i] = malloc(size));
            memset(budget_blocks[c][i], 1, size);
          } else {
            free(budget_blocks[c][i]);
          }
        }
      }
    }
  }
  pthread_barrier_wait(&budget_phase);   /* its cache grown */
  pthread_barrier_wait(&budget_phase);   /* measured */
  return arg;
}

static void test_thread_cache_within_budget(void **state) {
  malloc_trim(0);
  size_t rss0 = fmt_rss();
  pthread_t t;
  assert_int_equal(pthread_barrier_init(&budget_phase, NULL, 2), 0);
  assert_int_equal(pthread_create(&t, NULL, grow_cache_then_wait, NULL), 0);
  pthread_barrier_wait(&budget_phase);
  malloc_trim(0);
  size_t rss1 = fmt_rss();
  pthread_barrier_wait(&budget_phase);
  assert_int_equal(pthread_join(t, NULL), 0);
  pthread_barrier_destroy(&budget_phase);
  print_message("a waiting thread's grown cache pins %zu KiB\n", (rss1 - rss0) >> 10);
  if (rss1 > rss0 + 6 * FMT_MIB)
    fail_msg("RSS %zu with a waiting thread's grown cache, %zu before: over its 4 MiB budget", rss1, rss0);
}

/* Past 8 live threads, each thread's cache grows to its share of the process-wide bound
 * (8 x the 4 MiB budget), not to a whole budget: 16 threads with a cache that grow their caches at once
 * hold about 1.9 MiB each, where the first ones to grow would otherwise take 3.5 MiB each
 * and leave the rest of them next to nothing. Each thread's holdings are what mallinfo2's
 * in-use bytes lose when it exits (its cache flushed), the threads ending one at a time. */
enum { SHARERS = 16 };
static pthread_barrier_t sharers_ready;
static sem_t sharer_may_end[SHARERS];

static void *grow_share_then_wait(void *arg) {
  free(fmt_launder(malloc(16)));   /* its cache set up: a live cache */
  pthread_barrier_wait(&sharers_ready);   /* all live before any grows */
  fmt_grow_cache();
  pthread_barrier_wait(&sharers_ready);
  while (sem_wait(&sharer_may_end[(uintptr_t)arg]) && errno == EINTR) continue;
  return NULL;
}

static void test_many_threads_share_the_grown_bound(void **state) {
  pthread_t t[SHARERS];
  size_t held[SHARERS], least = SIZE_MAX, most = 0;
  assert_int_equal(pthread_barrier_init(&sharers_ready, NULL, SHARERS + 1), 0);
  for (uintptr_t i = 0; i < SHARERS; i++) {
    assert_int_equal(sem_init(&sharer_may_end[i], 0, 0), 0);
    assert_int_equal(pthread_create(&t[i], NULL, grow_share_then_wait, (void *)i), 0);
  }
  pthread_barrier_wait(&sharers_ready);
  pthread_barrier_wait(&sharers_ready);   /* all grown */
  for (unsigned i = 0; i < SHARERS; i++) {
    size_t before = mallinfo2().uordblks;
    assert_int_equal(sem_post(&sharer_may_end[i]), 0);
    assert_int_equal(pthread_join(t[i], NULL), 0);
    size_t after = mallinfo2().uordblks;
    held[i] = before > after ? before - after : 0;
    if (held[i] < least) least = held[i];
    if (held[i] > most) most = held[i];
    sem_destroy(&sharer_may_end[i]);
  }
  pthread_barrier_destroy(&sharers_ready);
  print_message("%d threads' grown caches: %zu to %zu KiB\n", SHARERS, least >> 10, most >> 10);
  if (most > 2 * FMT_MIB + FMT_MIB / 4)
    fail_msg("a thread cached %zu bytes, over its share (1.9 MiB) of the bound", most);
  if (least < FMT_MIB / 2)
    fail_msg("a thread cached only %zu bytes: the threads before it took its share", least);
}

/* A freed large mapping waits in the large-block cache for the next large request; a
 * program that then only allocates small blocks still gets it unmapped by the purge
 * ticks its frees run. The same bound on progress as above. */
static void test_cached_mapping_unmapped_without_trim(void **state) {
  enum { BIG = 20 << 20 };
  malloc_trim(0);
  char *big = malloc(BIG);
  assert_non_null(big);
  memset(big, 0x33, BIG);
  size_t mapped1 = fm_mapped_bytes();
  free(big);
  size_t mapped2 = allocate_until_mapped_at_most(mapped1 - BIG / 2, 4096, 48);
  print_message("mapped %zu with a %d-byte block, %zu after its free\n", mapped1, BIG, mapped2);
  if (mapped2 + BIG / 2 > mapped1)
    fail_msg("10 s after freeing a %d-byte block, %zu bytes are mapped (%zu with it)", BIG,
             mapped2, mapped1);
}

/* A heap built and freed by another thread, still alive, is purged by this one's trim. */
static pthread_barrier_t phase;

static void *other_thread_heap(void *arg) {
  build_heap(0x22);
  free_heap_shuffled(2);
  pthread_barrier_wait(&phase); /* heap freed */
  pthread_barrier_wait(&phase); /* main has trimmed and measured */
  return NULL;
}

static void test_trim_purges_other_threads_memory(void **state) {
  size_t rss0 = fmt_rss(), total = 0;
  for (unsigned i = 0; i < HEAP_BLOCKS; i++) total += heap_size(i);
  assert_int_equal(pthread_barrier_init(&phase, NULL, 2), 0);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, other_thread_heap, NULL), 0);
  pthread_barrier_wait(&phase);
  int released = malloc_trim(0);
  size_t rss1 = fmt_rss();
  pthread_barrier_wait(&phase);
  assert_int_equal(pthread_join(t, NULL), 0);
  pthread_barrier_destroy(&phase);
  assert_int_equal(released, 1);   /* it gave that heap's pages back */
  if (rss1 > rss0 + total / 4)
    fail_msg("RSS %zu after trim, %zu before another thread's %zu-byte heap", rss1, rss0, total);
}

/* Purged memory comes back writable, calloc'd blocks zeroed; purging never touches live
 * blocks that share spans with freed ones. */
static void test_reuse_after_purge(void **state) {
  build_heap(0xA5);
  free_heap_shuffled(3);
  assert_int_equal(fm_trim(), 1);
  for (unsigned i = 0; i < HEAP_BLOCKS; i++) {
    size_t n = heap_size(i);
    assert_non_null(heap[i] = calloc(1, n));
    if (!fmt_is_zero(heap[i], n)) fail_msg("calloc(%zu) after purge not zeroed", n);
  }
  for (unsigned i = 0; i < HEAP_BLOCKS; i++) {
    size_t n = heap_size(i);
    fmt_fill(heap[i], n, i);
  }
  /* Free every other block: spans now mix live and free blocks. */
  for (unsigned i = 0; i < HEAP_BLOCKS; i += 2) {
    memset(heap[i], 0x5A, heap_size(i));
    free(heap[i]);
    heap[i] = NULL;
  }
  malloc_trim(0);
  for (unsigned i = 1; i < HEAP_BLOCKS; i += 2)
    if (!fmt_check(heap[i], heap_size(i), i)) fail_msg("live block %u changed by a purge", i);
  for (unsigned i = 0; i < HEAP_BLOCKS; i += 2) {
    size_t n = heap_size(i);
    assert_non_null(heap[i] = calloc(n, 1));
    if (!fmt_is_zero(heap[i], n)) fail_msg("calloc(%zu) into a half-free span not zeroed", n);
    fmt_fill(heap[i], n, i);
  }
  for (unsigned i = 0; i < HEAP_BLOCKS; i++)
    if (!fmt_check(heap[i], heap_size(i), i)) fail_msg("block %u overwritten after reuse", i);
  free_heap_shuffled(4);
  malloc_trim(0);
  /* Aligned blocks and a growing realloc, both from purged memory. */
  void *a[1000];
  for (unsigned i = 0; i < 1000; i++) {
    assert_non_null(a[i] = aligned_alloc(4096, 4096));
    assert_true(fmt_aligned(a[i], 4096));
    fmt_fill(a[i], 4096, i);
  }
  for (unsigned i = 0; i < 1000; i++) {
    assert_true(fmt_check(a[i], 4096, i));
    free(a[i]);
  }
  malloc_trim(0);
  unsigned char *g = NULL;
  for (size_t n = 64; n <= 8 * FMT_MIB; n *= 2) {
    assert_non_null(g = realloc(g, n));
    if (n > 64 && !fmt_check(g, n / 2, 99)) fail_msg("realloc to %zu after purge lost data", n);
    fmt_fill(g, n, 99);
  }
  free(g);
}

/* ---- thread churn ---- */

enum { CHURN_WIDTH = 8, CHURN_BLOCKS = 64 };
static atomic_uint churn_failures;

/* Allocates about 64 KiB in mixed sizes, touches all of it and frees it. */
static void *churn_thread(void *arg) {
  void *p[CHURN_BLOCKS];
  for (unsigned i = 0; i < CHURN_BLOCKS; i++) {
    size_t n = 16 + ((uintptr_t)arg * 131 + i * 67) % 2032;
    if (!(p[i] = malloc(n))) {
      atomic_fetch_add(&churn_failures, 1);
      return NULL;
    }
    memset(p[i], (int)i, n);
  }
  for (unsigned i = 0; i < CHURN_BLOCKS; i++) free(p[i]);
  return NULL;
}

static void churn(unsigned rounds) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * FMT_KIB);
  for (unsigned r = 0; r < rounds; r++) {
    pthread_t t[CHURN_WIDTH];
    for (uintptr_t i = 0; i < CHURN_WIDTH; i++)
      assert_int_equal(pthread_create(&t[i], &attr, churn_thread, (void *)(r * 8 + i)), 0);
    for (unsigned i = 0; i < CHURN_WIDTH; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  }
  pthread_attr_destroy(&attr);
}

/* calloc of a block whose units were purged (here by malloc_trim) or never used skips its
 * memset: the pages read zero already, and stay out of RSS until the program writes them.
 * So do the blocks of a page or more of a size class, taken one by one from spans of such
 * units. A block calloc takes from memory a freed block dirtied is cleared (test_api). */
static void test_calloc_of_purged_units_untouched(void **state) {
  enum { MOST = 128 };
  const struct { size_t size, count; } runs[] = {
      {768 * FMT_KIB, 8},    /* spans of 12 units, from the chunks */
      {20 * FMT_KIB, MOST},  /* blocks of pages */
      {4 * FMT_KIB, MOST},   /* the smallest size that calloc takes this way */
  };
  unsigned char *blocks[MOST];
  for (unsigned r = 0; r < sizeof runs / sizeof runs[0]; r++) {
    size_t size = runs[r].size, count = runs[r].count;
    malloc_trim(0);
    size_t rss0 = fmt_rss();
    for (size_t i = 0; i < count; i++) {
      assert_non_null(blocks[i] = calloc(1, size));
      assert_true(fm_owns(blocks[i]));
    }
    size_t rss1 = fmt_rss();
    for (size_t i = 0; i < count; i++) {
      if (!fmt_is_zero(blocks[i], size)) fail_msg("calloc(1, %zu) not zeroed", size);
      memset(blocks[i], 0x77, size);
      free(blocks[i]);
    }
    print_message("%zu callocs of %zu bytes: rss %zu -> %zu\n", count, size, rss0, rss1);
    if (rss1 > rss0 + count * size / 4)
      fail_msg("%zu callocs of %zu bytes raised RSS from %zu to %zu", count, size, rss0, rss1);
  }
}

/* Pages the OS refuses to purge (locked ones: madvise fails) stay dirty, so calloc clears
 * them when it hands them out again. A live block keeps their 4 MiB chunk from being
 * unmapped by malloc_trim. */
static void test_calloc_after_refused_purge(void **state) {
  const size_t size = 768 * FMT_KIB;
  unsigned char *keeper = malloc(size), *p = malloc(size);
  assert_non_null(keeper);
  assert_non_null(p);
  if ((uintptr_t)keeper >> 22 != (uintptr_t)p >> 22) fail_msg("%p and %p in two chunks", keeper, p);
  if (mlock(p, size) != 0) fail_msg("mlock of %zu bytes: %s", size, strerror(errno));
  memset(p, 0x55, size);
  free(p);
  malloc_trim(0);   /* its purge is refused */
  unsigned char *q = calloc(1, size);
  assert_ptr_equal(q, p);   /* the same units: those still resident come first */
  if (!fmt_is_zero(q, size)) fail_msg("calloc(1, %zu) of locked units not zeroed", size);
  assert_int_equal(munlock(q, size), 0);
  free(q);
  free(keeper);
}

/* 3000 threads leave RSS within 4 MiB of where 64 left it (leaked per-thread caches would
 * add about 64 KiB each: 190 MiB). */
static void test_thread_churn_rss(void **state) {
  churn(8);
  size_t rss_warm = fmt_rss();
  churn(375);
  size_t rss_after = fmt_rss();
  assert_int_equal(atomic_load(&churn_failures), 0);
  print_message("thread churn: rss %zu after 64 threads, %zu after 3064\n", rss_warm, rss_after);
  if (rss_after > rss_warm + 4 * FMT_MIB)
    fail_msg("RSS grew from %zu to %zu over 3000 threads", rss_warm, rss_after);
}

/* A program that frees one structure and builds another of blocks of another size class
 * (C++ map nodes of 80 bytes, then list nodes of 64) builds it in the memory the first
 * one left: RSS grows by less than half the second's bytes. Without it the blocks the
 * thread's cache keeps of the first, scattered over every span of their class, keep
 * those spans from emptying, and the second takes new memory (1.5 MiB here). */
enum { FIRST_NODES = 20000, SECOND_NODES = 24000 };
static void *nodes[SECOND_NODES];

static void test_freed_structure_serves_other_class(void **state) {
  malloc_trim(0);
  for (unsigned i = 0; i < FIRST_NODES; i++) {
    assert_non_null(nodes[i] = malloc(80));
    memset(nodes[i], 1, 80);
  }
  shuffle(order, FIRST_NODES, 7);   /* freed as a tree is, out of address order */
  for (unsigned i = 0; i < FIRST_NODES; i++) free(nodes[order[i]]);
  size_t rss_freed = fmt_rss();
  for (unsigned i = 0; i < SECOND_NODES; i++) {
    assert_non_null(nodes[i] = malloc(64));
    memset(nodes[i], 2, 64);
  }
  size_t rss_built = fmt_rss();
  for (unsigned i = 0; i < SECOND_NODES; i++) free(nodes[i]);
  print_message("another class after a freed one: RSS %zu KiB before, %zu KiB after %zu KiB of it\n",
                rss_freed >> 10, rss_built >> 10, (size_t)SECOND_NODES * 64 >> 10);
  if (rss_built > rss_freed + SECOND_NODES * 64 / 2)
    fail_msg("RSS grew from %zu to %zu: the freed blocks' memory was not reused", rss_freed, rss_built);
}

/* realloc of a large block that must move, whose mapping the program split (mprotect on a
 * page inside it): the kernel refuses to move and grow such a mapping in one call, and the
 * fallback must neither fail nor leave its destination mapped once the block is freed. */
static void test_realloc_moves_split_mapping(void **state) {
  size_t n = 4 * FMT_MIB;
  malloc_trim(0);
  size_t mapped_before = fm_mapped_bytes();
  for (int round = 0; round < 3; round++) {
    char *p = malloc(n);
    assert_non_null(p);
    fmt_fill(p, n, 41);
    /* The mapping ends at end: make sure something follows it (EEXIST: something does). */
    char *end = p + malloc_usable_size(p);
    void *guard = mmap(end, 65536, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    assert_true(guard == end || (guard == MAP_FAILED && errno == EEXIST));
    assert_int_equal(mprotect(p + FMT_MIB - 64, 4096, PROT_READ | PROT_WRITE | PROT_EXEC), 0);
    char *q = realloc(p, 2 * n);
    assert_non_null(q);
    if (!fmt_check(q, n, 41)) fail_msg("realloc of a split mapping lost contents");
    free(q);
    if (guard != MAP_FAILED) munmap(guard, 65536);
  }
  malloc_trim(0);
  size_t mapped_after = fm_mapped_bytes();
  print_message("split-mapping realloc: mapped %zu before, %zu after\n", mapped_before, mapped_after);
  if (mapped_after > mapped_before + FMT_MIB)
    fail_msg("mapped bytes grew from %zu to %zu: a move left its destination behind",
             mapped_before, mapped_after);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_uses_fastmalloc),
      cmocka_unit_test(test_trim_lowers_rss),
      cmocka_unit_test(test_trim_purges_partly_used_spans),
      cmocka_unit_test(test_freed_heap_unmapped_without_trim),
      cmocka_unit_test(test_freed_heap_unmapped_while_its_spans_cycle),
      cmocka_unit_test(test_freed_heap_unmapped_with_large_blocks_only),
      cmocka_unit_test(test_cached_mapping_unmapped_without_trim),
      cmocka_unit_test(test_freed_heap_purged_at_few_arena_frees),
      cmocka_unit_test(test_freed_heap_purged_while_cycling_a_batch),
      cmocka_unit_test(test_freed_heap_purged_while_cycling_pairs),
      cmocka_unit_test(test_heap_built_again_after_ticks_reuses_pages),
      cmocka_unit_test(test_blocks_passed_between_threads_rss_bounded),
      cmocka_unit_test(test_page_blocks_passed_between_threads_rss_bounded),
      cmocka_unit_test(test_thread_cache_within_budget),
      cmocka_unit_test(test_many_threads_share_the_grown_bound),
      cmocka_unit_test(test_trim_purges_other_threads_memory),
      cmocka_unit_test(test_reuse_after_purge),
      cmocka_unit_test(test_calloc_of_purged_units_untouched),
      cmocka_unit_test(test_calloc_after_refused_purge),
      cmocka_unit_test(test_thread_churn_rss),
      cmocka_unit_test(test_freed_structure_serves_other_class),
      cmocka_unit_test(test_realloc_moves_split_mapping),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
