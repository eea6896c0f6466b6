/* Double frees, each in a forked child: of a block on top of its bin, in its middle, at its
 * bottom, after the block went back to its span, across threads, while handed over to its
 * arena (by a thread of another arena, or by one of its own that only frees), of page
 * blocks and large blocks. The child then allocates until fastmalloc
 * reports the duplicate (every pointer it gets at most once: a second would be two owners
 * of one block), and must die of SIGABRT with one line naming the pointer. */
#include "fm_test.h"

#include <pthread.h>
#include <sys/mman.h>

/* What a child leaves for its parent: the pointer the report must name, and why it
 * failed, if it did. */
typedef struct {
  uintptr_t freed_twice;
  char failure[120];
} child_result;
static child_result *result;   /* shared with the children (MAP_SHARED) */

static void child_fails(const char *why) {
  snprintf(result->failure, sizeof result->failure, "%s", why);
  _exit(91);
}

/* The pointers handed out since the double free, in an open-addressing set. */
enum { SEEN_SLOTS = 1 << 16, MALLOCS_MOST = 20000 };
static uintptr_t seen[SEEN_SLOTS];
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;

static void seen_add(void *p) {
  uintptr_t key = (uintptr_t)p;
  pthread_mutex_lock(&seen_lock);
  size_t i = (key >> 4) * 0x9E3779B97F4A7C15ull >> 48;
  for (; seen[i]; i = (i + 1) % SEEN_SLOTS)
    if (seen[i] == key) child_fails("a block was handed out twice");
  seen[i] = key;
  pthread_mutex_unlock(&seen_lock);
}

/* Mallocs of n bytes, kept, until the report ends the child. */
static void allocate(size_t n, unsigned count) {
  for (unsigned i = 0; i < count; i++) {
    void *q = malloc(n);
    if (!q) child_fails("malloc failed");
    seen_add(q);
  }
}

/* The second free has happened: without the check (FM_FREE_MARK=OFF) only the spans catch
 * a double free, when the cache gives the blocks back; with it, the mallocs that follow
 * must reach the duplicate, or a cache's give-back. */
static void after_double_free(size_t n) {
  if (!FM_FREE_MARK) malloc_trim(0);
  allocate(n, MALLOCS_MOST);
  malloc_trim(0);
  child_fails("no report");
}

static void *marked(size_t n) {
  void *p = malloc(n);
  if (!p) child_fails("malloc failed");
  result->freed_twice = (uintptr_t)p;
  return p;
}

/* free(p); free(p): p on top of its bin. */
static void twice_on_top(void *arg) {
  size_t n = (uintptr_t)arg;
  void *p = marked(n);
  free(p);
  free(fmt_launder(p));
  after_double_free(n);
}

/* p in the middle of its bin, then at its bottom. */
static void twice_in_middle(void *arg) {
  size_t n = (uintptr_t)arg;
  void *a = malloc(n), *p = marked(n), *b = malloc(n);
  free(a);
  free(p);
  free(b);
  free(fmt_launder(p));
  after_double_free(n);
}

static void twice_at_bottom(void *arg) {
  size_t n = (uintptr_t)arg;
  void *p = marked(n), *a = malloc(n), *b = malloc(n);
  free(p);
  free(a);
  free(b);
  free(fmt_launder(p));
  after_double_free(n);
}

/* The first free's block went back to its span (malloc_trim flushes the cache) before the
 * second free: the span must not hand it out while the cache holds it too. */
static void twice_after_flush(void *arg) {
  size_t n = (uintptr_t)arg;
  void *keep = malloc(n), *p = marked(n);   /* (keep: the span stays) */
  free(p);
  malloc_trim(0);
  free(fmt_launder(p));
  after_double_free(n);
  free(keep);
}

/* One thread frees, another frees again; both then allocate. The first free's thread
 * waits (its cache lives on) while the other frees and allocates, then allocates too. */
static pthread_barrier_t first_free, second_free;

static void *free_then_allocate(void *arg) {
  size_t n = (uintptr_t)arg;
  free((void *)result->freed_twice);
  pthread_barrier_wait(&first_free);
  pthread_barrier_wait(&second_free);
  if (FM_FREE_MARK) allocate(n, MALLOCS_MOST);   /* (without: its exit gives its copy back) */
  return NULL;
}

static void twice_across_threads(void *arg) {
  size_t n = (uintptr_t)arg;
  void *p = marked(n);
  pthread_t thread;
  pthread_barrier_init(&first_free, NULL, 2);
  pthread_barrier_init(&second_free, NULL, 2);
  if (pthread_create(&thread, NULL, free_then_allocate, arg) != 0) child_fails("thread");
  pthread_barrier_wait(&first_free);
  free(fmt_launder(p));
  if (FM_FREE_MARK) allocate(n, 100);
  pthread_barrier_wait(&second_free);
  pthread_join(thread, NULL);
  after_double_free(n);
}

/* The other order: main's cache holds the first copy, a thread's exit gives its copy back. */
static void *free_in_thread(void *p) {
  free(fmt_launder(p));
  return NULL;
}

static void twice_second_in_thread(void *arg) {
  size_t n = (uintptr_t)arg;
  void *p = marked(n);
  pthread_t thread;
  free(p);
  if (pthread_create(&thread, NULL, free_in_thread, p) != 0) child_fails("thread");
  pthread_join(thread, NULL);
  after_double_free(n);
}

/* A thread of another arena frees the block twice: the first free hands it to its arena
 * (page blocks), the second must not hand it over again. */
static void *free_twice(void *p) {
  free(p);
  free(fmt_launder(p));
  return NULL;
}

static void twice_in_other_thread(void *arg) {
  size_t n = (uintptr_t)arg;
  void *p = marked(n);
  pthread_t thread;
  if (pthread_create(&thread, NULL, free_twice, p) != 0) child_fails("thread");
  pthread_join(thread, NULL);
  after_double_free(n);
}

/* The same with a trim between the frees: the first copy goes back to the main thread's
 * arena from a thread (of another arena, on a machine with two CPUs or more), the second,
 * in the thread's bin, is handed out by the thread's mallocs. The span must not hand its
 * copy out again: the report comes when the main thread's refill reaches it. */
static void *free_trim_free_allocate(void *arg) {
  size_t n = (uintptr_t)arg;
  void *p = (void *)result->freed_twice;
  free(p);
  malloc_trim(0);
  free(fmt_launder(p));
  if (FM_FREE_MARK) allocate(n, 100);   /* (without: its exit gives its copy back) */
  return NULL;
}

static void twice_handed_over(void *arg) {
  void *keep = malloc((uintptr_t)arg);   /* (the span stays through the trim) */
  marked((uintptr_t)arg);
  pthread_t thread;
  if (pthread_create(&thread, NULL, free_trim_free_allocate, arg) != 0) child_fails("thread");
  pthread_join(thread, NULL);
  after_double_free((uintptr_t)arg);
  free(keep);
}

/* A thread of another arena frees a block the main thread made: it waits in the box of
 * its class in the main thread's arena for a refill.
 * Main frees it again: its bin hands it out, and the refill that then takes the box's copy
 * must not hand it out a second time. */
static void twice_while_boxed(void *arg) {
  void *p = marked((uintptr_t)arg);
  pthread_t thread;
  if (pthread_create(&thread, NULL, free_in_thread, p) != 0) child_fails("thread");
  pthread_join(thread, NULL);
  free(fmt_launder(p));
  after_double_free((uintptr_t)arg);
}

/* A thread that only frees (a consumer) frees blocks of n bytes main made: blocks[1] first
 * (a thread's first free goes to the block's span, not its bin), then the marked block,
 * blocks[0], then enough others to overflow its bin, so that they wait in the box of their
 * class in main's arena, whether the thread has an arena of its own or shares main's
 * (FASTMALLOC_ARENAS=1). With twice, it frees the marked block again, and as many others
 * again: both copies wait in the box. */
enum { CONSUMED = 64 };

typedef struct {
  void *blocks[2 * CONSUMED + 1];
  bool twice;
} consumer_job;

static void *consume(void *arg) {
  consumer_job *job = arg;
  free(job->blocks[1]);
  free(job->blocks[0]);
  for (unsigned i = 2; i <= CONSUMED; i++) free(job->blocks[i]);
  if (!job->twice) return NULL;
  free(fmt_launder(job->blocks[0]));
  for (unsigned i = CONSUMED + 1; i <= 2 * CONSUMED; i++) free(job->blocks[i]);
  return NULL;
}

static void consumer_frees(size_t n, bool twice) {
  consumer_job job = {.twice = twice};
  job.blocks[0] = marked(n);
  for (unsigned i = 1; i <= (twice ? 2 : 1) * CONSUMED; i++)
    if (!(job.blocks[i] = malloc(n))) child_fails("malloc failed");
  pthread_t thread;
  if (pthread_create(&thread, NULL, consume, &job) != 0) child_fails("thread");
  pthread_join(thread, NULL);
}

/* Main frees the consumer's boxed block again: its bin hands it out, and the refill that
 * then takes the box's copy must not hand it out a second time. */
static void twice_while_boxed_by_consumer(void *arg) {
  consumer_frees((uintptr_t)arg, false);
  free(fmt_launder((void *)result->freed_twice));
  after_double_free((uintptr_t)arg);
}

/* Both copies in the box: a new thread's refills (with one arena, from that box) take them
 * one at a time, as a refill takes the box's last blocks first, up to its bin's limit,
 * small in a new thread; calloc zeroes the first copy it hands out, mark included: the
 * refill that takes the second must not take it for a block whose page was purged. (With
 * two arenas the new thread has the other one: the trim finds the copies.) */
static void *calloc_until_report(void *arg) {
  for (unsigned i = 0; i < MALLOCS_MOST; i++) {
    void *q = calloc(1, (uintptr_t)arg);
    if (!q) child_fails("calloc failed");
    seen_add(q);
  }
  return NULL;
}

static void twice_boxed_by_consumer(void *arg) {
  consumer_frees((uintptr_t)arg, true);
  if (!FM_FREE_MARK) malloc_trim(0);
  pthread_t thread;
  if (pthread_create(&thread, NULL, calloc_until_report, arg) != 0) child_fails("thread");
  pthread_join(thread, NULL);
  malloc_trim(0);
  child_fails("no report");
}

static const char *const reports[] = {"free(): double free detected",
                                      "double free or corruption of a free block"};

static void expect_double_free_report(void (*fn)(void *), size_t n, const char *what) {
  char err[2048];
  memset(result, 0, sizeof *result);
  memset(seen, 0, sizeof seen);
  int status = fmt_run_child(fn, (void *)(uintptr_t)n, 60, err, sizeof err);
  assert_true(status != -1);
  if (result->failure[0]) fail_msg("%s, %zu bytes: %s", what, n, result->failure);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT)
    fail_msg("%s, %zu bytes: child %s %d, not SIGABRT; stderr: \"%s\"", what, n,
             WIFSIGNALED(status) ? "killed by signal" : "exited with",
             WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), err);
  const char *nl = strchr(err, '\n');
  if (strncmp(err, "fastmalloc: ", 12) != 0 || !nl || nl[1])
    fail_msg("%s, %zu bytes: not one fastmalloc line: \"%s\"", what, n, err);
  bool known = false;
  for (unsigned i = 0; i < sizeof reports / sizeof reports[0]; i++) {
    size_t len = strlen(reports[i]);
    known |= strncmp(err + 12, reports[i], len) == 0 && strncmp(err + 12 + len, " 0x", 3) == 0;
  }
  if (!known) fail_msg("%s, %zu bytes: not a double-free report: \"%s\"", what, n, err);
  uintptr_t named = (uintptr_t)strtoull(strstr(err, " 0x") + 3, NULL, 16);
  if (named != result->freed_twice)
    fail_msg("%s, %zu bytes: the report names %#lx, the block is %#lx", what, n,
             (unsigned long)named, (unsigned long)result->freed_twice);
}

/* Small classes (bins), blocks of pages (their cache, a few a length), a block of a chunk
 * span and one in a mapping of its own. */
static const size_t every_kind[] = {16, 48, 1024, 4000, 12000, 20000, 40000, 200000, 2 * FMT_MIB};
static const size_t in_bins[] = {16, 48, 1024, 4000};

static void test_uses_fastmalloc(void **state) { fmt_assert_uses_fastmalloc(); }

static void test_twice_on_top(void **state) {
  for (unsigned i = 0; i < sizeof every_kind / sizeof *every_kind; i++)
    expect_double_free_report(twice_on_top, every_kind[i], "free(p); free(p)");
}

static void test_twice_deeper_in_bin(void **state) {
  for (unsigned i = 0; i < sizeof every_kind / sizeof *every_kind; i++) {
    expect_double_free_report(twice_in_middle, every_kind[i], "in the middle of its bin");
    expect_double_free_report(twice_at_bottom, every_kind[i], "at the bottom of its bin");
  }
}

static void test_twice_after_flush(void **state) {
  for (unsigned i = 0; i < sizeof in_bins / sizeof *in_bins; i++)
    expect_double_free_report(twice_after_flush, in_bins[i], "after the block's flush");
}

static void test_twice_across_threads(void **state) {
  const size_t sizes[] = {16, 1024, 12000, 20000, 40000};
  for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    expect_double_free_report(twice_across_threads, sizes[i], "freed again by another thread");
    expect_double_free_report(twice_second_in_thread, sizes[i], "second free in a thread");
    expect_double_free_report(twice_in_other_thread, sizes[i], "freed twice by another thread");
  }
}

/* (small blocks: a page block's span may go back at the trim, and its second free then
 * reads "invalid pointer") */
static void test_twice_across_threads_handed_over(void **state) {
  for (unsigned i = 0; i < sizeof in_bins / sizeof *in_bins; i++)
    expect_double_free_report(twice_handed_over, in_bins[i], "freed, trimmed, freed by a thread");
}

static void test_twice_while_handed_over(void **state) {
  for (unsigned i = 0; i < sizeof in_bins / sizeof *in_bins; i++)
    expect_double_free_report(twice_while_boxed, in_bins[i],
                              "freed again while handed over to its arena");
  for (unsigned i = 0; i < sizeof in_bins / sizeof *in_bins; i++)
    expect_double_free_report(twice_while_boxed_by_consumer, in_bins[i],
                              "freed again while a consumer's flush holds it in a box");
  for (unsigned i = 0; i < sizeof in_bins / sizeof *in_bins; i++)
    expect_double_free_report(twice_boxed_by_consumer, in_bins[i],
                              "freed twice by a consumer, both copies boxed");
}

int main(void) {
  result = mmap(NULL, sizeof *result, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (result == MAP_FAILED) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_uses_fastmalloc),
      cmocka_unit_test(test_twice_on_top),
      cmocka_unit_test(test_twice_deeper_in_bin),
      cmocka_unit_test(test_twice_after_flush),
      cmocka_unit_test(test_twice_across_threads),
      cmocka_unit_test(test_twice_across_threads_handed_over),
      cmocka_unit_test(test_twice_while_handed_over),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
