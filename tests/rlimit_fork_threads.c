/* Threads under a 200 MB RLIMIT_AS set in a fork child, or by one thread while another
 * allocates: 8 small-stack threads must start and allocate until malloc fails, each failure
 * NULL with ENOMEM. Exit 0 when both cases pass (run it without fastmalloc as the control). */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define LIMIT ((rlim_t)200000000)
enum { THREADS = 8, STACK = 256 << 10 };

static const char *test_case = "";
static atomic_uint failures;

static __attribute__((format(printf, 1, 2))) void failed(const char *fmt, ...) {
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  atomic_fetch_add(&failures, 1);
  fprintf(stderr, "rlimit_fork_threads %s: FAIL: %s\n", test_case, line);
}

static uint64_t next_random(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Allocates blocks of mixed sizes (16 B - 8 MiB) until a malloc of 64 bytes or less fails,
 * halving the largest size asked for at each failure; checks each failure; frees them all.
 * The blocks are linked through their first word. Returns how many failed. */
static unsigned allocate_until_failure(uint64_t seed) {
  uint64_t rng = seed | 1;
  void *list = NULL;
  size_t most = 8 * MIB;
  unsigned refused = 0;
  for (unsigned long n = 0; n < 4000000; n++) {
    size_t size = 16 + next_random(&rng) % most;
    errno = 0;
    void **p = malloc(size);
    if (!p) {
      refused++;
      if (errno != ENOMEM) failed("a failed malloc set errno %d, not ENOMEM", errno);
      if (size <= 64) break;
      most = most / 2 > 48 ? most / 2 : 48;
      continue;
    }
    p[0] = list;
    ((char *)p)[size - 1] = 1;
    list = p;
  }
  if (!refused) failed("malloc never failed");
  while (list) {
    void *next = *(void **)list;
    free(list);
    list = next;
  }
  return refused;
}

/* The threads start allocating once all are created: the memory runs out after every stack
 * is mapped (a pthread_create refused then would be the program's doing, not the allocator's). */
static pthread_mutex_t go_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t go_cond = PTHREAD_COND_INITIALIZER;
static bool go;

static void *allocator(void *arg) {
  pthread_mutex_lock(&go_lock);
  while (!go) pthread_cond_wait(&go_cond, &go_lock);
  pthread_mutex_unlock(&go_lock);
  allocate_until_failure((uintptr_t)arg);
  return NULL;
}

/* Starts THREADS threads with small stacks that allocate until malloc fails; joins them. */
static void run_threads(uint64_t seed) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, STACK);
  pthread_t t[THREADS];
  unsigned started = 0;
  for (unsigned i = 0; i < THREADS; i++) {
    int rc = pthread_create(&t[i], &attr, allocator, (void *)(uintptr_t)(seed + i));
    if (rc) {
      failed("pthread_create of thread %u failed: %s", i + 1, strerror(rc));
      break;
    }
    started++;
  }
  pthread_mutex_lock(&go_lock);
  go = true;
  pthread_cond_broadcast(&go_cond);
  pthread_mutex_unlock(&go_lock);
  for (unsigned i = 0; i < started; i++) pthread_join(t[i], NULL);
  pthread_attr_destroy(&attr);
}

static bool set_limit(void) {
  struct rlimit limit;   /* the hard limit stays as it is */
  getrlimit(RLIMIT_AS, &limit);
  limit.rlim_cur = limit.rlim_max < LIMIT ? limit.rlim_max : LIMIT;
  if (setrlimit(RLIMIT_AS, &limit) == 0) return true;
  failed("setrlimit failed: %s", strerror(errno));
  return false;
}

/* After all the threads: the heap is whole again. */
static void check_heap_works(void) {
  void *p = malloc(MIB), *q = malloc(100);
  if (!p || !q) failed("malloc failed after the threads freed everything");
  free(p);
  free(q);
}

/* Case 1: the limit set in a fork child, before its threads start. */
static void limit_in_child(void) {
  if (!set_limit()) return;
  run_threads(1);
  check_heap_works();
}

/* Case 2: the limit set by one thread while another allocates and frees. */
static atomic_bool stop;

static void *churner(void *arg) {
  uint64_t rng = 77;
  void *slot[64] = {0};
  while (!atomic_load(&stop)) {
    unsigned i = (unsigned)(next_random(&rng) % 64);
    free(slot[i]);
    size_t size = 16 + next_random(&rng) % (next_random(&rng) % 8 ? 4096 : 2 * MIB);
    errno = 0;
    slot[i] = malloc(size);
    if (!slot[i] && errno != ENOMEM) failed("a failed malloc set errno %d, not ENOMEM", errno);
  }
  for (unsigned i = 0; i < 64; i++) free(slot[i]);
  return NULL;
}

static void *limiter(void *arg) {
  usleep(20000);   /* while the churner runs */
  set_limit();
  return NULL;
}

static void limit_from_thread(void) {
  pthread_t c, l;
  if (pthread_create(&c, NULL, churner, NULL) || pthread_create(&l, NULL, limiter, NULL)) {
    failed("pthread_create failed before the limit");
    return;
  }
  pthread_join(l, NULL);
  run_threads(100);
  atomic_store(&stop, true);
  pthread_join(c, NULL);
  check_heap_works();
}

/* Runs a case in a fork child; true when it exits 0. */
static bool run_case(const char *name, void (*fn)(void)) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    test_case = name;
    fn();
    _exit(atomic_load(&failures) ? 1 : 0);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return false;
  bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (WIFSIGNALED(status))
    fprintf(stderr, "rlimit_fork_threads %s: FAIL: killed by signal %d\n", name, WTERMSIG(status));
  printf("rlimit_fork_threads %s: %s\n", name, ok ? "ok" : "FAIL");
  return ok;
}

int main(void) {
  free(malloc(100));   /* the allocator is set up before any limit, as in a real program */
  bool ok = run_case("limit-in-fork-child", limit_in_child);
  ok &= run_case("limit-from-a-thread", limit_from_thread);
  return ok ? 0 : 1;
}
