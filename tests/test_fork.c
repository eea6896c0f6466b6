/* fork from a single-threaded process and while threads allocate (from main, a worker, a
 * signal handler), _Fork beside idle threads, vfork+exec and posix_spawn while threads allocate.
 * Children check what they inherited and allocate; they report by exit status, never cmocka. */
#include "fm_test.h"

#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <sys/single_threaded.h>

enum { INHERITED = 3000 };
static void *inherited[INHERITED];

static size_t inherited_size(unsigned i) { return i % 97 ? 16 + (i * 41) % 5000 : 100000 + i; }

static void fill_inherited(void) {
  for (unsigned i = 0; i < INHERITED; i++) {
    assert_non_null(inherited[i] = malloc(inherited_size(i)));
    fmt_fill(inherited[i], inherited_size(i), i);
  }
  /* Leave the thread cache and spans half used: free every third block. */
  for (unsigned i = 0; i < INHERITED; i += 3) {
    free(inherited[i]);
    inherited[i] = NULL;
  }
}

static bool check_and_free_inherited(void) {
  bool ok = true;
  for (unsigned i = 0; i < INHERITED; i++) {
    if (!inherited[i]) continue;
    ok &= fmt_check(inherited[i], inherited_size(i), i) && fm_owns(inherited[i]);
    free(inherited[i]);
    inherited[i] = NULL;
  }
  return ok;
}

/* Allocation work with payload checks, in whatever thread calls it; false on a bad block. */
static bool churn(uint64_t seed, unsigned ops) {
  enum { SLOTS = 128 };
  void *slot[SLOTS] = {0};
  size_t len[SLOTS];
  uint64_t rng = fmt_seed_state(seed);
  bool ok = true;
  for (unsigned op = 0; op < ops; op++) {
    unsigned s = (unsigned)(fmt_rand(&rng) % SLOTS);
    if (slot[s]) {
      ok &= fmt_check(slot[s], len[s], (uintptr_t)slot[s]);
      free(slot[s]);
      slot[s] = NULL;
      continue;
    }
    uint64_t r = fmt_rand(&rng);
    len[s] = r % 200 ? 1 + r % 3000 : 40000 + r % 500000;
    slot[s] = r % 7 ? malloc(len[s]) : aligned_alloc(256, len[s]);
    if (!slot[s]) return false;
    fmt_fill(slot[s], len[s], (uintptr_t)slot[s]);
  }
  for (unsigned s = 0; s < SLOTS; s++)
    if (slot[s]) {
      ok &= fmt_check(slot[s], len[s], (uintptr_t)slot[s]);
      free(slot[s]);
    }
  return ok;
}

static void *churn_thread(void *arg) { return churn((uintptr_t)arg, 20000) ? arg : NULL; }

/* The child's work: inherited blocks intact and freeable, allocation in the child, then two
 * threads of its own. Exit codes say which step failed. */
static void child_work(void *arg) {
  if (!check_and_free_inherited()) _exit(2);
  if (!churn(1, 20000)) _exit(3);
  pthread_t t[2];
  for (uintptr_t i = 0; i < 2; i++)
    if (pthread_create(&t[i], NULL, churn_thread, (void *)(i + 10))) _exit(4);
  for (int i = 0; i < 2; i++) {
    void *r;
    if (pthread_join(t[i], &r) || !r) _exit(5);
  }
  if (!churn(2, 5000)) _exit(6);
}

static void test_fork_single_threaded(void **state) {
  assert_true(__libc_single_threaded); /* runs first: no thread has existed yet */
  fmt_assert_uses_fastmalloc();
  fill_inherited();
  char err[4096];
  fmt_assert_child_ok(fmt_run_child(child_work, NULL, 60, err, sizeof err), err);
  assert_true(__libc_single_threaded);
  assert_true(check_and_free_inherited());
  assert_true(churn(3, 20000));
}

/* ---- fork while other threads allocate ---- */

enum { WORKERS = 3, FORKS = 24 };
static atomic_bool stop;
static atomic_uint worker_errors;

static void *busy_worker(void *arg) {
  uint64_t seed = (uintptr_t)arg;
  while (!atomic_load(&stop))
    if (!churn(seed++, 2000)) atomic_fetch_add(&worker_errors, 1);
  return NULL;
}

static void quick_child(void *arg) {
  if (!churn(7, 5000)) _exit(3);
  pthread_t t;
  void *r;
  if (pthread_create(&t, NULL, churn_thread, (void *)11) || pthread_join(t, &r) || !r) _exit(4);
}

/* A worker that forks too, so fork happens from a thread other than main. */
static void *forking_worker(void *arg) {
  char err[1024];
  uintptr_t failed = 0;
  for (int i = 0; i < FORKS / 4; i++) {
    int status = fmt_run_child(quick_child, NULL, 60, err, sizeof err);
    failed += !(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  return (void *)failed;
}

static void test_fork_while_threads_allocate(void **state) {
  pthread_t w[WORKERS], forker;
  for (uintptr_t i = 0; i < WORKERS; i++)
    assert_int_equal(pthread_create(&w[i], NULL, busy_worker, (void *)(i * 1000000)), 0);
  assert_int_equal(pthread_create(&forker, NULL, forking_worker, NULL), 0);
  for (int i = 0; i < FORKS; i++) {
    char err[4096];
    if (i == 0) fill_inherited();
    fmt_assert_child_ok(fmt_run_child(i == 0 ? child_work : quick_child, NULL, 60, err,
                                      sizeof err),
                        err);
    assert_true(churn(100 + i, 1000));
  }
  assert_true(check_and_free_inherited());
  void *forker_failed;
  assert_int_equal(pthread_join(forker, &forker_failed), 0);
  atomic_store(&stop, true);
  for (int i = 0; i < WORKERS; i++) assert_int_equal(pthread_join(w[i], NULL), 0);
  assert_ptr_equal(forker_failed, NULL);
  assert_int_equal(atomic_load(&worker_errors), 0);
}

/* ---- the process-wide bound on grown caches, after fork ----
 * Threads' caches may grow past their start limits by 8 times the per-thread budget in all,
 * and past 8 live threads each to its share of that. A child keeps only the forking thread,
 * so it must not inherit what the other threads' caches had taken of that bound, nor count
 * them as live: a thread of the child must still be able to grow its cache to the whole
 * per-thread budget (4 MiB). */

enum { GROWERS = 10 };
static pthread_barrier_t grown, forked;

static void *grower(void *arg) {
  fmt_grow_cache();
  pthread_barrier_wait(&grown);
  pthread_barrier_wait(&forked);   /* alive, and so counted, while main forks */
  return NULL;
}

/* A thread started now: how much its cache can grow to hold. */
static void *new_thread_grows(void *arg) { return (void *)(uintptr_t)fmt_grow_cache(); }

static void child_grows_cache(void *arg) {
  pthread_t t;
  void *held;
  if (pthread_create(&t, NULL, new_thread_grows, NULL) || pthread_join(t, &held)) _exit(2);
  if ((uintptr_t)held < 3 * FMT_MIB) {
    fprintf(stderr, "a new thread of the child cached only %zu bytes\n", (size_t)(uintptr_t)held);
    _exit(3);
  }
}

static void test_fork_resets_cache_bound(void **state) {
  pthread_t t[GROWERS];
  assert_int_equal(pthread_barrier_init(&grown, NULL, 2), 0);
  assert_int_equal(pthread_barrier_init(&forked, NULL, GROWERS + 1), 0);
  /* One after the other: the first ones grow to the whole budget, the later ones to their
   * shrinking shares, until together they hold the whole bound. */
  for (int i = 0; i < GROWERS; i++) {
    assert_int_equal(pthread_create(&t[i], NULL, grower, NULL), 0);
    pthread_barrier_wait(&grown);
  }
  /* Here a new thread's cache cannot grow. */
  pthread_t probe;
  void *held;
  assert_int_equal(pthread_create(&probe, NULL, new_thread_grows, NULL), 0);
  assert_int_equal(pthread_join(probe, &held), 0);
  if ((uintptr_t)held >= FMT_MIB) fail_msg("the bound did not bind: a new thread cached %zu bytes",
                                           (size_t)(uintptr_t)held);
  char err[4096];
  fmt_assert_child_ok(fmt_run_child(child_grows_cache, NULL, 60, err, sizeof err), err);
  pthread_barrier_wait(&forked);
  for (int i = 0; i < GROWERS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  pthread_barrier_destroy(&grown);
  pthread_barrier_destroy(&forked);
}

/* ---- fork from a signal handler, while other threads allocate ----
 * The handler interrupts the main thread outside the allocator (in raise), forks, and waits
 * for the child, which allocates and frees. */

static volatile sig_atomic_t handler_status;

static void fork_in_handler(int sig) {
  pid_t pid = fork();
  if (pid == 0) {
    alarm(60);
    _exit(churn(21, 3000) ? 0 : 3);
  }
  int status = -1;
  while (pid > 0 && waitpid(pid, &status, 0) < 0 && errno == EINTR) continue;
  handler_status = pid < 0 ? -1 : status;
}

static pthread_t busy[WORKERS];

static void start_busy_workers(void) {
  atomic_store(&stop, false);
  for (uintptr_t i = 0; i < WORKERS; i++)
    assert_int_equal(pthread_create(&busy[i], NULL, busy_worker, (void *)(i * 1000000 + 7)), 0);
}

static void stop_busy_workers(void) {
  atomic_store(&stop, true);
  for (int i = 0; i < WORKERS; i++) assert_int_equal(pthread_join(busy[i], NULL), 0);
  assert_int_equal(atomic_load(&worker_errors), 0);
}

static void test_fork_from_signal_handler(void **state) {
  struct sigaction sa = {.sa_handler = fork_in_handler}, old;
  sigemptyset(&sa.sa_mask);
  assert_int_equal(sigaction(SIGUSR1, &sa, &old), 0);
  start_busy_workers();
  for (int i = 0; i < 12; i++) {
    handler_status = -2;
    assert_int_equal(raise(SIGUSR1), 0);
    if (!(WIFEXITED(handler_status) && WEXITSTATUS(handler_status) == 0))
      fail_msg("fork %d from the signal handler: wait status %d", i, (int)handler_status);
    assert_true(churn(200 + i, 500));
  }
  stop_busy_workers();
  sigaction(SIGUSR1, &old, NULL);
}

/* ---- _Fork: no fork handlers run. Beside threads that hold no lock (they wait on a
 * barrier), the child allocates, frees and checks what it inherited. ---- */

static pthread_barrier_t idle_start, idle_end;

static void *idle_thread(void *arg) {
  bool ok = churn((uintptr_t)arg, 3000);   /* its cache holds blocks while it waits */
  pthread_barrier_wait(&idle_start);
  pthread_barrier_wait(&idle_end);
  return ok ? arg : NULL;
}

static void test_underscore_fork_beside_idle_threads(void **state) {
  enum { IDLE = 3 };
  pthread_t t[IDLE];
  assert_int_equal(pthread_barrier_init(&idle_start, NULL, IDLE + 1), 0);
  assert_int_equal(pthread_barrier_init(&idle_end, NULL, IDLE + 1), 0);
  for (uintptr_t i = 0; i < IDLE; i++)
    assert_int_equal(pthread_create(&t[i], NULL, idle_thread, (void *)(i + 31)), 0);
  pthread_barrier_wait(&idle_start);
  fill_inherited();
  for (int round = 0; round < 4; round++) {
    fflush(NULL);
    pid_t pid = _Fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      alarm(60);
      if (round == 0 && !check_and_free_inherited()) _exit(2);
      _exit(churn(40 + round, 5000) ? 0 : 3);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      fail_msg("_Fork child %d: wait status %d", round, status);
  }
  assert_true(check_and_free_inherited());
  pthread_barrier_wait(&idle_end);
  for (int i = 0; i < IDLE; i++) {
    void *r;
    assert_int_equal(pthread_join(t[i], &r), 0);
    assert_non_null(r);
  }
  pthread_barrier_destroy(&idle_start);
  pthread_barrier_destroy(&idle_end);
}

/* ---- vfork + exec and posix_spawn while threads allocate: the child shares or replaces
 * the parent's memory at once, and the parent's heap carries on intact. ---- */

static char *const exit_7[] = {"sh", "-c", "exit 7", NULL};

static void test_vfork_exec_while_threads_allocate(void **state) {
  start_busy_workers();
  fill_inherited();
  for (int i = 0; i < 40; i++) {
    pid_t pid = vfork();
    if (pid == 0) {
      execv("/bin/sh", exit_7);
      _exit(127);
    }
    assert_true(pid > 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 7))
      fail_msg("vfork+exec %d: wait status %d", i, status);
    assert_true(churn(300 + i, 300));
  }
  assert_true(check_and_free_inherited());
  stop_busy_workers();
}

static void test_posix_spawn_while_threads_allocate(void **state) {
  start_busy_workers();
  fill_inherited();
  for (int i = 0; i < 40; i++) {
    /* File actions and attributes allocate in the parent. */
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attr;
    assert_int_equal(posix_spawn_file_actions_init(&actions), 0);
    assert_int_equal(posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0), 0);
    assert_int_equal(posix_spawnattr_init(&attr), 0);
    sigset_t none;
    sigemptyset(&none);
    assert_int_equal(posix_spawnattr_setsigmask(&attr, &none), 0);
    assert_int_equal(posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK), 0);
    pid_t pid;
    int rc = i % 2 ? posix_spawnp(&pid, "sh", &actions, &attr, exit_7, environ)
                   : posix_spawn(&pid, "/bin/sh", &actions, &attr, exit_7, environ);
    assert_int_equal(rc, 0);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 7))
      fail_msg("posix_spawn %d: wait status %d", i, status);
    assert_true(churn(400 + i, 300));
  }
  assert_true(check_and_free_inherited());
  stop_busy_workers();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fork_single_threaded),
      cmocka_unit_test(test_fork_while_threads_allocate),
      cmocka_unit_test(test_fork_resets_cache_bound),
      cmocka_unit_test(test_fork_from_signal_handler),
      cmocka_unit_test(test_underscore_fork_beside_idle_threads),
      cmocka_unit_test(test_vfork_exec_while_threads_allocate),
      cmocka_unit_test(test_posix_spawn_while_threads_allocate),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
