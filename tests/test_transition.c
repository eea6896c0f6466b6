/* The moment a process goes multi-threaded: a single-threaded phase leaves live blocks,
 * cached blocks and half-used refill batches; then pthread_create, and both threads allocate
 * and free (including each other's blocks) from what that phase left. Its own process. */
#include "fm_test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/single_threaded.h>

enum { PER_CLASS = 60, ROUNDS = 200 };
static size_t cls[FMT_MAX_CLASSES];
static unsigned nclasses;
/* Left by the single-threaded phase: live blocks of every class, half for each thread. */
static void *left[FMT_MAX_CLASSES][PER_CLASS];
static pthread_barrier_t start;
static atomic_uint failures;

static uint64_t left_seed(unsigned c, unsigned i) { return c * 1000 + i; }

/* Frees this thread's half of `left`, then allocates and frees blocks of every class with
 * payload checks, the other thread doing the same at the same moment. */
static void both_threads_work(unsigned me) {
  pthread_barrier_wait(&start);
  for (unsigned c = 0; c < nclasses; c++)
    for (unsigned i = me; i < PER_CLASS; i += 2) {
      if (!fmt_check(left[c][i], cls[c], left_seed(c, i)) || !fm_owns(left[c][i]))
        atomic_fetch_add(&failures, 1);
      free(left[c][i]);
    }
  void *mine[FMT_MAX_CLASSES][8];
  for (unsigned r = 0; r < ROUNDS; r++) {
    for (unsigned c = 0; c < nclasses; c++)
      for (unsigned k = 0; k < 8; k++) {
        if (!(mine[c][k] = malloc(cls[c]))) {
          atomic_fetch_add(&failures, 1);
          return;
        }
        fmt_fill(mine[c][k], cls[c], (uintptr_t)mine[c][k] + me);
      }
    for (unsigned c = 0; c < nclasses; c++)
      for (unsigned k = 0; k < 8; k++) {
        if (!fmt_check(mine[c][k], cls[c], (uintptr_t)mine[c][k] + me))
          atomic_fetch_add(&failures, 1);
        free(mine[c][k]);
      }
  }
}

static void *second_thread(void *arg) {
  both_threads_work(1);
  return NULL;
}

static void test_uses_fastmalloc(void **state) {
  assert_true(__libc_single_threaded);
  fmt_assert_uses_fastmalloc();
}

static void test_going_multi_threaded(void **state) {
  assert_true(__libc_single_threaded);
  nclasses = fmt_class_sizes(cls);
  /* Single-threaded: fill every class (live blocks and half-used spans), free every other
   * block of a second set into the thread cache, take one more block just before
   * pthread_create and another of the same class just after. */
  void *cached[FMT_MAX_CLASSES][PER_CLASS / 2];
  for (unsigned c = 0; c < nclasses; c++) {
    for (unsigned i = 0; i < PER_CLASS; i++) {
      assert_non_null(left[c][i] = malloc(cls[c]));
      fmt_fill(left[c][i], cls[c], left_seed(c, i));
    }
    for (unsigned i = 0; i < PER_CLASS / 2; i++) assert_non_null(cached[c][i] = malloc(cls[c]));
  }
  for (unsigned c = 0; c < nclasses; c++)
    for (unsigned i = 0; i < PER_CLASS / 2; i += 2) free(cached[c][i]);
  void *one = malloc(12345);
  assert_non_null(one);

  assert_int_equal(pthread_barrier_init(&start, NULL, 2), 0);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, second_thread, NULL), 0);
  assert_false(__libc_single_threaded);
  void *after = malloc(12345);
  assert_non_null(after);
  assert_ptr_not_equal(after, one);
  both_threads_work(0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(atomic_load(&failures), 0);
  for (unsigned c = 0; c < nclasses; c++)
    for (unsigned i = 1; i < PER_CLASS / 2; i += 2) free(cached[c][i]);
  free(one);
  free(after);
  pthread_barrier_destroy(&start);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_uses_fastmalloc),
      cmocka_unit_test(test_going_multi_threaded),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
