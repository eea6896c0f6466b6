/* Threads: random malloc/free/realloc with payload checks in 8 threads (also while the main
 * thread trims over and over), producer/consumer frees, errno under contended locks,
 * short-lived threads, thread exit with cached blocks, allocation from a pthread key
 * destructor that runs after fastmalloc's own, calloc after remote frees, blocks handed
 * to new threads (no false sharing), large blocks traded between threads, live blocks that
 * look freed. Worker threads never call cmocka: they count failures for the main thread. */
#include "fm_test.h"

#include <pthread.h>
#include <stdatomic.h>

/* Failures seen in worker threads: counted, the first one described by what went wrong
 * and a number (the block size unless the text says otherwise). */
static atomic_uint failures;
static char first_failure[256];

static void record_failure(const char *what, size_t value) {
  if (atomic_fetch_add(&failures, 1) == 0)
    snprintf(first_failure, sizeof first_failure, "%s: %zu", what, value);
}

static void assert_no_failures(void) {
  unsigned f = atomic_exchange(&failures, 0);
  if (f) fail_msg("%u failures in threads; first: %s", f, first_failure);
}

/* A self-describing block: its size and seed in the first 16 bytes, the pattern after. */
struct block_head {
  size_t n;
  uint64_t seed;
};

static void block_write(void *p, size_t n, uint64_t seed) {
  struct block_head h = {n, seed};
  memcpy(p, &h, sizeof h);
  fmt_fill((char *)p + sizeof h, n - sizeof h, seed);
}

/* Checks the block's first min(recorded size, upto) bytes, its owner and its usable size;
 * returns its recorded size (0 when the header itself is corrupted). */
static size_t block_verify(const void *p, size_t upto) {
  struct block_head h;
  memcpy(&h, p, sizeof h);
  size_t n = h.n < upto ? h.n : upto;
  if (h.n < sizeof h || !fmt_check((const char *)p + sizeof h, n - sizeof h, h.seed)) {
    record_failure("payload corrupted", h.n);
    return 0;
  }
  if (!fm_owns(p)) record_failure("block not owned by fastmalloc", h.n);
  if (malloc_usable_size((void *)p) < n) record_failure("usable size below request", n);
  return h.n;
}

static size_t random_size(uint64_t *rng) {
  unsigned r = (unsigned)(fmt_rand(rng) % 1000);
  uint64_t x = fmt_rand(rng);
  if (r < 800) return 16 + x % 241;
  if (r < 970) return 257 + x % 7936;
  if (r < 998) return 8193 + x % 24576;
  if (x % 8) return 32769 + x % (224 * FMT_KIB);
  return FMT_MIB + x % (3 * FMT_MIB);   /* 1 in 4000: a block in its own mapping */
}

static void block_free(void *p) {
  errno = 99;
  free(p);
  if (errno != 99) record_failure("free changed errno from 99 to", (size_t)errno);
}

/* ---- 8 threads of random operations, trading blocks through a shared exchange ---- */

enum { RT_THREADS = 8, RT_SLOTS = 256, RT_OPS = 50000, RT_EXCHANGE = 64 };
static _Atomic(void *) exchange[RT_EXCHANGE];

static void *random_worker(void *arg) {
  uint64_t rng = fmt_seed_state((uintptr_t)arg);
  void *slot[RT_SLOTS] = {0};
  for (int op = 0; op < RT_OPS; op++) {
    unsigned s = (unsigned)(fmt_rand(&rng) % RT_SLOTS), r = (unsigned)(fmt_rand(&rng) % 100);
    uint64_t seed = fmt_rand(&rng);
    if (!slot[s]) {
      size_t n = random_size(&rng);
      void *p;
      if (r < 80) {
        p = malloc(n);
      } else if (r < 90) {
        p = calloc(1, n);
        if (p && !fmt_is_zero(p, n)) record_failure("calloc not zeroed", n);
      } else if (r < 95) {
        p = memalign(r % 2 ? 64 : 4096, n);
        if (p && !fmt_aligned(p, r % 2 ? 64 : 4096)) record_failure("memalign misaligned", n);
      } else {
        p = realloc(NULL, n);
      }
      if (!p) {
        record_failure("allocation failed", n);
        continue;
      }
      block_write(p, n, seed);
      slot[s] = p;
      continue;
    }
    size_t n = block_verify(slot[s], SIZE_MAX);
    if (r < 45) {
      block_free(slot[s]);
      slot[s] = NULL;
    } else if (r < 75) {
      size_t m = random_size(&rng);
      void *q = realloc(slot[s], m);
      if (!q) {
        record_failure("realloc failed", m);
        continue;
      }
      block_verify(q, m);
      block_write(q, m, seed);
      slot[s] = q;
    } else if (r < 90) {
      slot[s] = atomic_exchange(&exchange[seed % RT_EXCHANGE], slot[s]);
      if (slot[s]) block_verify(slot[s], SIZE_MAX);
    } else {
      /* Scribble over the slack past the request: it must belong to this block alone. */
      fmt_fill_usable(slot[s], n, 0xCD);
    }
  }
  for (int s = 0; s < RT_SLOTS; s++)
    if (slot[s]) {
      block_verify(slot[s], SIZE_MAX);
      block_free(slot[s]);
    }
  return NULL;
}

/* Live blocks that carry the free mark in their second word, as a program that copies
 * stale bytes makes them, freed from several threads (many of them by another thread than
 * the one that allocated) while other threads start, allocate, free and exit: each such
 * free searches the other threads' bins, which must never show it a live block (a false
 * "double free detected") nor send it outside a bins' array. In a child, for 2 s. */
enum { MARKED_WORKERS = 2, MARKED_CHURNERS = 3, MARKED_SHARED = 4096, MARKED_BATCH = 512 };
static uintptr_t free_mark;
static atomic_int marked_stop;
static _Atomic(void *) marked_shared[MARKED_SHARED];

static void *marked_worker(void *arg) {
  uint64_t rng = fmt_seed_state((uintptr_t)arg);
  void *batch[MARKED_BATCH];
  while (!atomic_load(&marked_stop)) {
    unsigned n = 1 + fmt_rand(&rng) % MARKED_BATCH;
    for (unsigned i = 0; i < n; i++) {
      size_t size = 16 + fmt_rand(&rng) % (fmt_rand(&rng) % 8 ? 256 : 32768);
      uintptr_t *p = malloc(size);
      if (!p) _exit(91);
      p[0] = i;
      if (fmt_rand(&rng) % 4 == 0) p[1] = free_mark;
      batch[i] = p;
    }
    for (unsigned i = 0; i < n; i++) {
      if (fmt_rand(&rng) % 3 == 0)   /* whoever takes it out next frees it */
        free(atomic_exchange(&marked_shared[fmt_rand(&rng) % MARKED_SHARED], batch[i]));
      else
        free(batch[i]);
    }
  }
  return NULL;
}

static void *marked_short_thread(void *arg) {
  uintptr_t *p[64];
  for (int i = 0; i < 64; i++) {
    if (!(p[i] = malloc(16 + (size_t)i * 8))) _exit(91);
    p[i][1] = free_mark;
  }
  for (int i = 0; i < 64; i++) free(p[i]);
  return arg;
}

static void *marked_churner(void *arg) {
  while (!atomic_load(&marked_stop)) {
    pthread_t t;
    if (pthread_create(&t, NULL, marked_short_thread, NULL) != 0 || pthread_join(t, NULL) != 0)
      _exit(92);
  }
  return arg;
}

static void marked_live_blocks(void *arg) {
  uintptr_t *probe = malloc(64);
  free(probe);
  free_mark = ((volatile uintptr_t *)fmt_launder(probe))[1];   /* read after free, on purpose */
  pthread_t workers[MARKED_WORKERS], churners[MARKED_CHURNERS];
  for (uintptr_t i = 0; i < MARKED_WORKERS; i++)
    if (pthread_create(&workers[i], NULL, marked_worker, (void *)(i + 1)) != 0) _exit(92);
  for (int i = 0; i < MARKED_CHURNERS; i++)
    if (pthread_create(&churners[i], NULL, marked_churner, NULL) != 0) _exit(92);
  sleep(2);
  atomic_store(&marked_stop, 1);
  for (int i = 0; i < MARKED_WORKERS; i++) pthread_join(workers[i], NULL);
  for (int i = 0; i < MARKED_CHURNERS; i++) pthread_join(churners[i], NULL);
  for (int i = 0; i < MARKED_SHARED; i++) free(marked_shared[i]);
}

static void test_marked_live_blocks_across_threads(void **state) {
  char err[1024];
  int status = fmt_run_child(marked_live_blocks, NULL, 60, err, sizeof err);
  fmt_assert_child_ok(status, err);
  assert_string_equal(err, "");
}

static void test_uses_fastmalloc(void **state) { fmt_assert_uses_fastmalloc(); }

/* Frees (after a check) the blocks the workers left in the exchange. */
static void exchange_drain(void) {
  for (int i = 0; i < RT_EXCHANGE; i++) {
    void *p = atomic_exchange(&exchange[i], NULL);
    if (p) {
      block_verify(p, SIZE_MAX);
      free(p);
    }
  }
}

static void test_random_8_threads(void **state) {
  pthread_t t[RT_THREADS];
  for (uintptr_t i = 0; i < RT_THREADS; i++)
    assert_int_equal(pthread_create(&t[i], NULL, random_worker, (void *)(i + 1)), 0);
  for (int i = 0; i < RT_THREADS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  exchange_drain();
  assert_no_failures();
}

/* The same workers while the main thread trims over and over: each trim purges and
 * unmaps under the arenas' locks while the workers take and give back spans, large
 * mappings and cached blocks (run again with a 1 ms purge delay by ctest, so that purge
 * ticks race with them too). */
static atomic_int workers_done;

static void *random_worker_then_done(void *arg) {
  random_worker(arg);
  atomic_fetch_add(&workers_done, 1);
  return NULL;
}

static void test_random_threads_while_trimming(void **state) {
  pthread_t t[RT_THREADS];
  atomic_store(&workers_done, 0);
  for (uintptr_t i = 0; i < RT_THREADS; i++)
    assert_int_equal(pthread_create(&t[i], NULL, random_worker_then_done, (void *)(i + 101)), 0);
  unsigned trims = 0;
  while (atomic_load(&workers_done) < RT_THREADS) {
    malloc_trim(0);
    trims++;
    usleep(200);
  }
  for (int i = 0; i < RT_THREADS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  exchange_drain();
  print_message("%u trims while the workers ran\n", trims);
  assert_no_failures();
  assert_true(trims > 0);
}

/* ---- producer/consumer: every block is freed by a thread that did not allocate it ---- */

enum { PC_PRODUCERS = 2, PC_CONSUMERS = 2, PC_BLOCKS = 100000, PC_QUEUE = 1024, PC_BATCH = 32 };
static struct {
  pthread_mutex_t lock;
  pthread_cond_t not_empty, not_full;
  void *item[PC_QUEUE];
  unsigned head, count, producers_done;
} queue = {.lock = PTHREAD_MUTEX_INITIALIZER,
           .not_empty = PTHREAD_COND_INITIALIZER,
           .not_full = PTHREAD_COND_INITIALIZER};

static void *producer(void *arg) {
  uint64_t rng = fmt_seed_state((uintptr_t)arg);
  for (int i = 0; i < PC_BLOCKS; i++) {
    size_t n = fmt_rand(&rng) % 100 ? 16 + fmt_rand(&rng) % 4080 : 4096 + fmt_rand(&rng) % 61440;
    void *p = malloc(n);
    if (!p) {
      record_failure("producer malloc failed", n);
      continue;
    }
    block_write(p, n, fmt_rand(&rng));
    pthread_mutex_lock(&queue.lock);
    while (queue.count == PC_QUEUE) pthread_cond_wait(&queue.not_full, &queue.lock);
    queue.item[(queue.head + queue.count++) % PC_QUEUE] = p;
    pthread_cond_signal(&queue.not_empty);
    pthread_mutex_unlock(&queue.lock);
  }
  pthread_mutex_lock(&queue.lock);
  queue.producers_done++;
  pthread_cond_broadcast(&queue.not_empty);
  pthread_mutex_unlock(&queue.lock);
  return NULL;
}

static void *consumer(void *arg) {
  for (;;) {
    void *got[PC_BATCH];
    unsigned n = 0;
    pthread_mutex_lock(&queue.lock);
    while (queue.count == 0 && queue.producers_done < PC_PRODUCERS)
      pthread_cond_wait(&queue.not_empty, &queue.lock);
    while (n < PC_BATCH && queue.count) {
      got[n++] = queue.item[queue.head];
      queue.head = (queue.head + 1) % PC_QUEUE;
      queue.count--;
    }
    pthread_cond_broadcast(&queue.not_full);
    pthread_mutex_unlock(&queue.lock);
    if (n == 0) return NULL;
    for (unsigned i = 0; i < n; i++) {
      size_t len = block_verify(got[i], SIZE_MAX);
      block_free(got[i]);
      if (i == 0) {
        void *z = calloc(1, len ? len : 16);
        if (!z || !fmt_is_zero(z, len)) record_failure("calloc after remote free", len);
        free(z);
      }
    }
  }
}

static void producer_consumer_round(void) {
  pthread_t p[PC_PRODUCERS], c[PC_CONSUMERS];
  queue.producers_done = 0;
  for (uintptr_t i = 0; i < PC_CONSUMERS; i++)
    assert_int_equal(pthread_create(&c[i], NULL, consumer, NULL), 0);
  for (uintptr_t i = 0; i < PC_PRODUCERS; i++)
    assert_int_equal(pthread_create(&p[i], NULL, producer, (void *)(i + 100)), 0);
  for (int i = 0; i < PC_PRODUCERS; i++) assert_int_equal(pthread_join(p[i], NULL), 0);
  for (int i = 0; i < PC_CONSUMERS; i++) assert_int_equal(pthread_join(c[i], NULL), 0);
  assert_int_equal(queue.count, 0);
}

/* Two rounds; remotely freed blocks must come back to use, so the second round maps
 * little more than the first (each round allocates about 500 MB in total). */
static void test_producer_consumer(void **state) {
  producer_consumer_round();
  assert_no_failures();
  size_t after_first = fm_mapped_bytes();
  producer_consumer_round();
  assert_no_failures();
  size_t after_second = fm_mapped_bytes();
  if (after_second > after_first + 16 * FMT_MIB)
    fail_msg("mapped %zu after round 1, %zu after round 2", after_first, after_second);
}

/* ---- 8 threads overflowing their caches at once: contended arena locks ---- */

enum { CT_THREADS = 8, CT_BLOCKS = 20000, CT_ROUNDS = 400 };

/* Batches larger than a thread cache, so every round refills and flushes through the
 * arenas; free must keep errno even when it waits for a lock. */
static void *contended_worker(void *arg) {
  void **b = malloc(CT_BLOCKS * sizeof *b);
  if (!b) {
    record_failure("malloc failed", CT_BLOCKS * sizeof *b);
    return NULL;
  }
  for (int r = 0; r < CT_ROUNDS; r++) {
    for (int i = 0; i < CT_BLOCKS; i++)
      if (!(b[i] = malloc(16 + (size_t)(i % 8) * 16))) record_failure("malloc failed", 16);
    for (int i = 0; i < CT_BLOCKS; i++) block_free(b[i]);
  }
  free(b);
  return NULL;
}

static void test_contended_free_keeps_errno(void **state) {
  pthread_t t[CT_THREADS];
  for (int i = 0; i < CT_THREADS; i++)
    assert_int_equal(pthread_create(&t[i], NULL, contended_worker, NULL), 0);
  for (int i = 0; i < CT_THREADS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  assert_no_failures();
}

/* ---- short-lived threads ---- */

/* One block of every class and two large ones, filled and freed: the thread exits with
 * its cache full. */
static void *short_lived(void *arg) {
  size_t cls[FMT_MAX_CLASSES + 2];
  unsigned nc = fmt_class_sizes(cls);
  cls[nc++] = 64 * FMT_KIB + 1;
  cls[nc++] = 300 * FMT_KIB;
  void *p[FMT_MAX_CLASSES + 2];
  for (unsigned i = 0; i < nc; i++) {
    if (!(p[i] = malloc(cls[i]))) {
      record_failure("short-lived malloc failed", cls[i]);
      return NULL;
    }
    block_write(p[i], cls[i], i + (uintptr_t)arg);
  }
  for (unsigned i = 0; i < nc; i++) {
    block_verify(p[i], SIZE_MAX);
    free(p[i]);
  }
  return NULL;
}

static void run_short_lived(unsigned rounds, unsigned width) {
  for (unsigned r = 0; r < rounds; r++) {
    pthread_t t[8];
    for (uintptr_t i = 0; i < width; i++)
      assert_int_equal(pthread_create(&t[i], NULL, short_lived, (void *)(r * width + i)), 0);
    for (unsigned i = 0; i < width; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  }
}

/* 1000 threads (4 at a time) map no more than a chunk beyond what the first 48 did;
 * each thread touches about 500 KiB, so leaked caches would cost hundreds of MiB. */
static void test_short_lived_threads(void **state) {
  run_short_lived(12, 4);
  assert_no_failures();
  size_t warm = fm_mapped_bytes();
  run_short_lived(250, 4);
  assert_no_failures();
  size_t after = fm_mapped_bytes();
  if (after > warm + 4 * FMT_MIB)
    fail_msg("mapped %zu after 48 threads, %zu after 1000 more", warm, after);
}

/* ---- a thread exits holding cached blocks, its own and others' ---- */

enum { EX_BLOCKS = 2000 };
static void *main_blocks[EX_BLOCKS];

static void *exit_with_cache(void *arg) {
  uintptr_t round = (uintptr_t)arg;
  void **mine = malloc(EX_BLOCKS * sizeof *mine);
  if (!mine) {
    record_failure("malloc in exiting thread failed", EX_BLOCKS * sizeof *mine);
    return NULL;
  }
  for (unsigned i = 0; i < EX_BLOCKS; i++) {
    size_t n = 16 + (i * 37) % 3000;
    if (!(mine[i] = malloc(n))) {
      record_failure("malloc in exiting thread failed", n);
      return NULL;
    }
    block_write(mine[i], n, round * EX_BLOCKS + i);
  }
  for (unsigned i = 0; i < EX_BLOCKS; i++) {
    block_verify(mine[i], SIZE_MAX);
    free(mine[i]);
  }
  for (unsigned i = 0; i < EX_BLOCKS; i += 2) {
    block_verify(main_blocks[i], SIZE_MAX);
    free(main_blocks[i]);
  }
  free(mine);
  return NULL;
}

static void test_exit_holding_cache(void **state) {
  size_t warm = 0;
  for (uintptr_t round = 0; round < 100; round++) {
    for (unsigned i = 0; i < EX_BLOCKS; i++) {
      size_t n = 16 + (i * 53) % 3000;
      assert_non_null(main_blocks[i] = malloc(n));
      block_write(main_blocks[i], n, i + 7);
    }
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, exit_with_cache, (void *)round), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    /* The exited thread's blocks come back to use; all must be distinct and intact. */
    void *fresh[EX_BLOCKS];
    for (unsigned i = 0; i < EX_BLOCKS; i++) {
      size_t n = 16 + (i * 37) % 3000;
      assert_non_null(fresh[i] = malloc(n));
      block_write(fresh[i], n, 1000000 + i);
    }
    for (unsigned i = 0; i < EX_BLOCKS; i++) {
      block_verify(fresh[i], SIZE_MAX);
      free(fresh[i]);
      if (i % 2) {
        block_verify(main_blocks[i], SIZE_MAX);
        free(main_blocks[i]);
      }
    }
    assert_no_failures();
    if (round == 4) warm = fm_mapped_bytes();
  }
  size_t after = fm_mapped_bytes();
  if (after > warm + 8 * FMT_MIB) fail_msg("mapped %zu after 5 rounds, %zu after 100", warm, after);
}

/* ---- a key destructor that runs after fastmalloc's thread-exit flush ---- */

enum { KEYS = 40, KD_BLOCKS = 64 };
static pthread_key_t late_key;
static atomic_uint destructor_rounds;

struct bundle {
  unsigned round;
  void *block[KD_BLOCKS];
};

/* Verifies and frees the thread's blocks, then allocates, reallocs and frees with no
 * thread cache left; re-arms itself once so it also runs in glibc's second round. */
static void late_destructor(void *arg) {
  struct bundle *b = arg;
  for (unsigned i = 0; i < KD_BLOCKS; i++) {
    if (b->block[i]) {
      block_verify(b->block[i], SIZE_MAX);
      free(b->block[i]);
    }
    size_t n = 16 + i * 200 + (i == KD_BLOCKS - 1) * 100000;
    b->block[i] = malloc(n);
    if (!b->block[i]) {
      record_failure("malloc in destructor failed", n);
      continue;
    }
    block_write(b->block[i], n, i * 3 + b->round);
  }
  for (unsigned i = 0; i < KD_BLOCKS; i += 2) {
    size_t n = 40 + i * 500;
    void *q = realloc(b->block[i], n);
    if (!q) {
      record_failure("realloc in destructor failed", n);
      continue;
    }
    block_verify(q, n);
    block_write(q, n, i);
    b->block[i] = q;
  }
  unsigned char *z = calloc(100, 10);
  if (!z || !fmt_is_zero(z, 1000)) record_failure("calloc in destructor", 1000);
  free(z);
  atomic_fetch_add(&destructor_rounds, 1);
  if (b->round++ == 0) {
    if (pthread_setspecific(late_key, b)) record_failure("re-arming the key failed, key", late_key);
    return;
  }
  for (unsigned i = 0; i < KD_BLOCKS; i++) {
    if (b->block[i]) block_verify(b->block[i], SIZE_MAX);
    free(b->block[i]);
  }
  free(b);
}

static void *key_thread(void *arg) {
  struct bundle *b = calloc(1, sizeof *b);
  if (!b) {
    record_failure("calloc failed", sizeof *b);
    return NULL;
  }
  for (unsigned i = 0; i < KD_BLOCKS; i++) {
    size_t n = 16 + i * 100;
    if ((b->block[i] = malloc(n))) block_write(b->block[i], n, i);
  }
  void *junk[200];
  for (int i = 0; i < 200; i++) junk[i] = malloc(16 + (size_t)i * 8);
  for (int i = 0; i < 200; i++) free(junk[i]);
  if (pthread_setspecific(late_key, b)) record_failure("pthread_setspecific failed, key", late_key);
  return NULL;
}

static void test_key_destructor_after_cache(void **state) {
  free(malloc(1)); /* fastmalloc is set up, so its key is older than ours */
  pthread_key_t filler[KEYS];
  for (int i = 0; i < KEYS; i++) assert_int_equal(pthread_key_create(&filler[i], NULL), 0);
  assert_int_equal(pthread_key_create(&late_key, late_destructor), 0);
  assert_true(late_key >= 32); /* pthread_setspecific callocs its second-level block */
  for (uintptr_t i = 0; i < 20; i++) {
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, key_thread, (void *)i), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
  }
  assert_no_failures();
  assert_int_equal(atomic_load(&destructor_rounds), 40);
  pthread_key_delete(late_key);
  for (int i = 0; i < KEYS; i++) pthread_key_delete(filler[i]);
}

/* ---- dirty blocks freed by another thread come back zeroed from calloc ---- */

enum { CZ_BLOCKS = 5000 };
static void *dirty[CZ_BLOCKS];

static void *dirty_allocator(void *arg) {
  for (unsigned i = 0; i < CZ_BLOCKS; i++) {
    if (!(dirty[i] = malloc(16 + (i * 16) % 2048))) {
      record_failure("malloc failed", 16 + (i * 16) % 2048);
      continue;
    }
    fmt_fill_usable(dirty[i], 0, 0xEE);
  }
  return NULL;
}

static void *dirty_freer(void *arg) {
  for (unsigned i = 0; i < CZ_BLOCKS; i++) free(dirty[i]);
  return NULL;
}

static void *zero_checker(void *arg) {
  void **p = malloc(CZ_BLOCKS * sizeof *p);
  if (!p) {
    record_failure("malloc failed", CZ_BLOCKS * sizeof *p);
    return NULL;
  }
  for (unsigned i = 0; i < CZ_BLOCKS; i++) {
    size_t n = 16 + (i * 16) % 2048;
    p[i] = calloc(n, 1);
    if (!p[i] || !fmt_is_zero(p[i], n)) record_failure("calloc after remote free", n);
  }
  for (unsigned i = 0; i < CZ_BLOCKS; i++) free(p[i]);
  free(p);
  return NULL;
}

static void test_calloc_after_remote_free(void **state) {
  for (int round = 0; round < 5; round++) {
    void *(*steps[])(void *) = {dirty_allocator, dirty_freer, zero_checker};
    for (int s = 0; s < 3; s++) {
      pthread_t t;
      assert_int_equal(pthread_create(&t, NULL, steps[s], NULL), 0);
      assert_int_equal(pthread_join(t, NULL), 0);
    }
    dirty_allocator(NULL);
    dirty_freer(NULL);
    zero_checker(NULL);
  }
  assert_no_failures();
}

/* ---- blocks a thread of another arena freed come back once each ---- */

/* The main thread makes HB_BLOCKS blocks of each of three classes, more than a bin holds;
 * a new thread (of another arena where there are several) frees them all and ends, so they
 * are handed over to the main thread's arena, a box per class, whose refills take them
 * back into its bins; what a box has no room for goes to the spans. No block comes back
 * twice: the blocks of each round are distinct, and each keeps what was written into it;
 * and none is lost: the rounds after the second map little more. */
enum { HB_BLOCKS = 3000, HB_CLASSES = 3, HB_ROUNDS = 8 };
static const size_t hb_size[HB_CLASSES] = {16, 96, 640};

static void *free_all_handed(void *arg) {
  void **blocks = arg;
  for (int i = 0; i < HB_BLOCKS * HB_CLASSES; i++) free(blocks[i]);
  return NULL;
}

static void test_handed_over_blocks_come_back_once(void **state) {
  enum { N = HB_BLOCKS * HB_CLASSES };
  void **blocks = malloc(N * sizeof *blocks), **sorted = malloc(N * sizeof *sorted);
  assert_non_null(blocks);
  assert_non_null(sorted);
  size_t mapped_after_two = 0;
  for (int round = 0; round < HB_ROUNDS; round++) {
    if (round == 2) mapped_after_two = fm_mapped_bytes();
    for (int i = 0; i < N; i++) {
      assert_non_null(blocks[i] = malloc(hb_size[i % HB_CLASSES]));
      fmt_fill(blocks[i], hb_size[i % HB_CLASSES], (uint64_t)i);
    }
    for (int i = 0; i < N; i++)
      if (!fmt_check(blocks[i], hb_size[i % HB_CLASSES], (uint64_t)i))
        fail_msg("round %d: block %p of %zu bytes was written by another malloc", round,
                 blocks[i], hb_size[i % HB_CLASSES]);
    memcpy(sorted, blocks, N * sizeof *sorted);
    qsort(sorted, N, sizeof *sorted, fmt_compare_addresses);
    for (int i = 1; i < N; i++)
      if (sorted[i] == sorted[i - 1]) fail_msg("round %d: %p handed out twice", round, sorted[i]);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, free_all_handed, blocks), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
  }
  if (fm_mapped_bytes() > mapped_after_two + 4 * FMT_MIB)
    fail_msg("mapped %zu bytes after round 2, %zu after round %d", mapped_after_two,
             fm_mapped_bytes(), HB_ROUNDS);
  free(sorted);
  free(blocks);
}

/* ---- blocks handed to new threads: no false sharing ---- */

/* Two new threads each free a block the main thread made, a neighbour of the other's in
 * one cache line, then malloc a block of that size: blocks in two different lines, else
 * the two threads would write one line. (A bin is a stack: a thread whose cache took the
 * block it was given would get it straight back.) */
enum { LINE = 64 };
static pthread_barrier_t handed_freed, handed_allocated;

static void *free_given_then_allocate(void *arg) {
  void **block = arg;
  free(*block);   /* this thread's first call into the allocator */
  pthread_barrier_wait(&handed_freed);
  *block = malloc(16);
  if (*block) memset(*block, 1, 16);
  pthread_barrier_wait(&handed_allocated);   /* both blocks live at once */
  pthread_barrier_wait(&handed_allocated);
  free(*block);
  return NULL;
}

/* Two of `made` in one cache line: their indices in *a and *b; false when none are. */
static bool pair_in_a_line(void *const *made, int n, int *a, int *b) {
  for (*a = 0; *a < n; ++*a)
    for (*b = *a + 1; *b < n; ++*b)
      if ((uintptr_t)made[*a] / LINE == (uintptr_t)made[*b] / LINE) return true;
  return false;
}

static void test_handed_blocks_not_shared(void **state) {
  /* The main thread's bin may hold blocks the earlier tests freed anywhere, in any order;
   * past them, a refill brings at least 32 neighbours, 4 to a line. */
  enum { MADE = 96 };
  void *made[MADE];
  for (int i = 0; i < MADE; i++) assert_non_null(made[i] = malloc(16));
  int a, b;
  assert_true(pair_in_a_line(made, MADE, &a, &b));
  void *block[2] = {made[a], made[b]};
  for (int i = 0; i < MADE; i++)
    if (i != a && i != b) free(made[i]);
  assert_int_equal(pthread_barrier_init(&handed_freed, NULL, 2), 0);
  assert_int_equal(pthread_barrier_init(&handed_allocated, NULL, 3), 0);
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&t[i], NULL, free_given_then_allocate, &block[i]), 0);
  pthread_barrier_wait(&handed_allocated);
  assert_non_null(block[0]);
  assert_non_null(block[1]);
  void *got[2] = {block[0], block[1]};
  pthread_barrier_wait(&handed_allocated);
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  pthread_barrier_destroy(&handed_freed);
  pthread_barrier_destroy(&handed_allocated);
  if ((uintptr_t)got[0] / LINE == (uintptr_t)got[1] / LINE)
    fail_msg("two threads got blocks %p and %p, in one cache line", got[0], got[1]);
}

/* A thread frees a block handed to it, whose neighbour in its cache line the main thread
 * keeps, then mallocs a block of that size: not in that line. The freed block went back to
 * its span (see test_handed_blocks_not_shared), the span's lowest free one, where a refill
 * would start; the two threads would write one line. A real check with one arena
 * (test_threads_one_arena); with more, the thread may take another arena's span. */
static void *free_given_then_keep(void *arg) {
  void **block = arg;
  free(*block);
  *block = malloc(16);
  return NULL;
}

static void test_refill_starts_in_a_line_of_its_own(void **state) {
  /* Every free 16-byte block already in the spans goes to the main thread's cache, so the
   * blocks made next are new ones in the last span, and the one handed on is its lowest
   * free block once freed. */
  enum { FILL = 20000 };
  void **fill = malloc(FILL * sizeof *fill);
  assert_non_null(fill);
  for (int i = 0; i < FILL; i++) assert_non_null(fill[i] = malloc(16));
  void *made[8];
  for (int i = 0; i < 8; i++) assert_non_null(made[i] = malloc(16));
  int pair = -1;
  for (int i = 0; i < 7 && pair < 0; i++)
    if ((uintptr_t)made[i] / LINE == (uintptr_t)made[i + 1] / LINE) pair = i;
  assert_true(pair >= 0);
  void *block = made[pair];
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, free_given_then_keep, &block), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_non_null(block);
  if ((uintptr_t)block / LINE == (uintptr_t)made[pair + 1] / LINE)
    fail_msg("a thread got block %p, in the cache line of live block %p", block, made[pair + 1]);
  free(block);
  for (int i = 0; i < 8; i++)
    if (i != pair) free(made[i]);
  for (int i = 0; i < FILL; i++) free(fill[i]);
  free(fill);
}

/* ---- large blocks (mappings of their own) traded between 8 threads ---- */

enum { LX_THREADS = 8, LX_ROUNDS = 60, LX_EXCHANGE = 8 };
static _Atomic(void *) large_exchange[LX_EXCHANGE];

/* The block's size and seed at its start, and a seeded word at the start of each later
 * page: enough to catch one mapping handed to two owners, without filling megabytes. */
static void large_mark(unsigned char *p, size_t n, uint64_t seed) {
  struct block_head h = {n, seed};
  memcpy(p, &h, sizeof h);
  for (size_t off = 4096; off + 8 <= n; off += 4096) {
    uint64_t w = seed ^ off;
    memcpy(p + off, &w, 8);
  }
}

static bool large_marked(const unsigned char *p) {
  struct block_head h;
  memcpy(&h, p, sizeof h);
  for (size_t off = 4096; off + 8 <= h.n; off += 4096) {
    uint64_t w;
    memcpy(&w, p + off, 8);
    if (w != (h.seed ^ off)) return false;
  }
  return malloc_usable_size((void *)p) >= h.n;
}

static bool large_zeroed(const unsigned char *p, size_t n) {
  for (size_t off = 0; off < n; off += 4096)
    if (!fmt_is_zero(p + off, n - off < 64 ? n - off : 64)) return false;
  return p[n - 1] == 0;
}

static void *large_trader(void *arg) {
  uint64_t rng = fmt_seed_state((uintptr_t)arg);
  for (int r = 0; r < LX_ROUNDS; r++) {
    size_t n = 3 * FMT_MIB / 2 + fmt_rand(&rng) % (5 * FMT_MIB);
    bool zeroed = r % 3 == 0;
    unsigned char *p = zeroed ? calloc(1, n) : malloc(n);
    if (!p) {
      record_failure("large malloc failed", n);
      continue;
    }
    if (zeroed && !large_zeroed(p, n)) record_failure("large calloc not zeroed", n);
    large_mark(p, n, fmt_rand(&rng));
    p = atomic_exchange(&large_exchange[fmt_rand(&rng) % LX_EXCHANGE], p);
    if (p && !large_marked(p)) record_failure("large block overwritten", ((size_t *)p)[0]);
    free(p);
  }
  return NULL;
}

/* Blocks freed into one thread's cache of mappings are taken by others; then
 * malloc_trim(0) empties every thread's cache, not only the caller's. */
static void test_large_blocks_across_threads(void **state) {
  malloc_trim(0);
  size_t before = fm_mapped_bytes();
  pthread_t t[LX_THREADS];
  for (uintptr_t i = 0; i < LX_THREADS; i++)
    assert_int_equal(pthread_create(&t[i], NULL, large_trader, (void *)(i + 7)), 0);
  for (int i = 0; i < LX_THREADS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  for (int i = 0; i < LX_EXCHANGE; i++) {
    unsigned char *p = atomic_exchange(&large_exchange[i], NULL);
    if (p && !large_marked(p)) record_failure("large block overwritten", ((size_t *)p)[0]);
    free(p);
  }
  assert_no_failures();
  malloc_trim(0);
  size_t after = fm_mapped_bytes();
  if (after > before + 16 * FMT_MIB)
    fail_msg("mapped %zu before the threads, %zu after them and malloc_trim(0)", before, after);
}

/* With 16 arenas (the test_threads_16_arenas run), 8 live threads each take an arena of
 * their own, so their first blocks lie in 8 different chunks (an arena's chunks are its
 * own). With the default (one arena per CPU) there may be fewer arenas than threads, and
 * nothing to tell; on 9 CPUs or more the default gives as many, so the setting's own effect
 * is checked by settings_probe, with one arena. */
enum { OWN_ARENA_THREADS = 8 };
static pthread_barrier_t all_allocated;

static void *allocate_and_wait(void *arg) {
  void **block = arg;
  *block = malloc(64);
  pthread_barrier_wait(&all_allocated);   /* all alive at once: none reuses another's arena */
  pthread_barrier_wait(&all_allocated);
  free(*block);
  return NULL;
}

static void test_threads_take_own_arenas(void **state) {
  const char *setting = getenv("FASTMALLOC_ARENAS");
  if (!setting || atoi(setting) <= OWN_ARENA_THREADS) {
    print_message("FASTMALLOC_ARENAS=%s: checked in the run with 16 arenas\n", setting ? setting : "");
    return;
  }
  pthread_t t[OWN_ARENA_THREADS];
  void *block[OWN_ARENA_THREADS];
  assert_int_equal(pthread_barrier_init(&all_allocated, NULL, OWN_ARENA_THREADS + 1), 0);
  for (int i = 0; i < OWN_ARENA_THREADS; i++)
    assert_int_equal(pthread_create(&t[i], NULL, allocate_and_wait, &block[i]), 0);
  pthread_barrier_wait(&all_allocated);
  unsigned distinct = 0;
  for (int i = 0; i < OWN_ARENA_THREADS; i++) {
    uintptr_t chunk = (uintptr_t)block[i] >> 22;   /* 4 MiB chunks */
    bool seen = false;
    for (int j = 0; j < i; j++) seen |= ((uintptr_t)block[j] >> 22) == chunk;
    distinct += !seen;
  }
  pthread_barrier_wait(&all_allocated);
  for (int i = 0; i < OWN_ARENA_THREADS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  pthread_barrier_destroy(&all_allocated);
  if (distinct != OWN_ARENA_THREADS)
    fail_msg("%d live threads with %s arenas allocated in %u chunks", OWN_ARENA_THREADS, setting, distinct);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_uses_fastmalloc),
      cmocka_unit_test(test_random_8_threads),
      cmocka_unit_test(test_random_threads_while_trimming),
      cmocka_unit_test(test_producer_consumer),
      cmocka_unit_test(test_contended_free_keeps_errno),
      cmocka_unit_test(test_short_lived_threads),
      cmocka_unit_test(test_exit_holding_cache),
      cmocka_unit_test(test_key_destructor_after_cache),
      cmocka_unit_test(test_calloc_after_remote_free),
      cmocka_unit_test(test_handed_over_blocks_come_back_once),
      cmocka_unit_test(test_handed_blocks_not_shared),
      cmocka_unit_test(test_refill_starts_in_a_line_of_its_own),
      cmocka_unit_test(test_large_blocks_across_threads),
      cmocka_unit_test(test_threads_take_own_arenas),
      cmocka_unit_test(test_marked_live_blocks_across_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
