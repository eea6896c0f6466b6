/* Out of memory under a 512 MiB RLIMIT_AS: 9 threads use every allocation function until each
 * fails (NULL and ENOMEM; posix_memalign returns it), alignment, zeroing and the blocks of failed
 * reallocs checked; then all is freed and malloc works again. Exit 0 when all holds. */
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define LIMIT ((rlim_t)512 * MIB)
enum { THREADS = 9, STACK = 1 << 20, MAX_TRIES = 2000000 };

static atomic_uint failures;
/* fastmalloc's posix_memalign keeps errno as it was; glibc's sets it to ENOMEM on failure. */
static bool keeps_errno;

static __attribute__((format(printf, 2, 3))) void failed(unsigned thread, const char *fmt, ...) {
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (atomic_fetch_add(&failures, 1) < 20) fprintf(stderr, "oom_threads: FAIL (thread %u): %s\n", thread, line);
}

/* A block held by a thread (32 bytes or more): linked through its first word, its size in
 * the second, the size's low byte in its last byte. */
typedef struct held {
  struct held *next;
  size_t size;
} held;

typedef struct worker {
  unsigned id;
  uint64_t rng;
  held *list;
  size_t asked;   /* the size of the last new block asked for; SIZE_MAX for a growth */
  unsigned long blocks, refusals[9];
} worker;

static uint64_t next_random(worker *w) {
  w->rng ^= w->rng << 13;
  w->rng ^= w->rng >> 7;
  w->rng ^= w->rng << 17;
  return w->rng;
}

static void keep(worker *w, void *p, size_t size) {
  held *h = p;
  h->next = w->list;
  h->size = size;
  ((char *)p)[size - 1] = (char)size;
  w->list = h;
  w->blocks++;
}

/* Reads every byte of a small block, and a byte a page (and the last one) of a big one: the
 * pages calloc left untouched stay out of memory. */
static bool zeroed(const unsigned char *p, size_t size) {
  size_t step = size <= 64 * KIB ? 1 : 4096;
  for (size_t i = 0; i < size; i += step)
    if (p[i]) return false;
  return p[size - 1] == 0;
}

enum fn { F_MALLOC, F_CALLOC, F_REALLOC, F_ALIGNED_ALLOC, F_POSIX_MEMALIGN, F_MEMALIGN, F_VALLOC,
          F_PVALLOC, F_REALLOCARRAY, F_COUNT };
static const char *const fn_name[F_COUNT] = {"malloc", "calloc", "realloc", "aligned_alloc",
                                             "posix_memalign", "memalign", "valloc", "pvalloc",
                                             "reallocarray"};

/* One allocation of `size` with function f; a success is kept (its alignment and zeroing
 * checked), a failure checked. Returns whether it succeeded. */
static bool allocate(worker *w, enum fn f, size_t size) {
  size_t align = (size_t)16 << next_random(w) % 17;   /* 16 B .. 1 MiB */
  void *p = NULL;
  int rc = 0;
  errno = 0;
  w->asked = size;
  switch (f) {
  case F_MALLOC: p = malloc(size); break;
  case F_CALLOC: p = calloc(size / 16, 16); size = size / 16 * 16; break;
  case F_REALLOC:
  case F_REALLOCARRAY: {
    /* Grow the newest block (it must survive a failure), or start one. */
    held *last = w->list;
    if (last && next_random(w) % 2) {
      size_t old = last->size, grown = old * 2 + size;
      held *next = last->next;
      w->asked = SIZE_MAX;
      void *q = f == F_REALLOC ? realloc(last, grown) : reallocarray(last, grown / 16, 16);
      if (!q) {
        if (errno != ENOMEM) failed(w->id, "%s: errno %d, not ENOMEM", fn_name[f], errno);
        if (last->size != old || last->next != next || ((char *)last)[old - 1] != (char)old)
          failed(w->id, "%s that failed changed the block", fn_name[f]);
        return false;
      }
      w->list = next;
      keep(w, q, f == F_REALLOC ? grown : grown / 16 * 16);
      w->blocks--;
      return true;
    }
    p = f == F_REALLOC ? realloc(NULL, size) : reallocarray(NULL, size / 16, 16);
    if (f == F_REALLOCARRAY) size = size / 16 * 16;
    break;
  }
  case F_ALIGNED_ALLOC: p = aligned_alloc(align, size); break;
  case F_POSIX_MEMALIGN:
    errno = 12345;
    rc = posix_memalign(&p, align, size);
    if (keeps_errno && errno != 12345) failed(w->id, "posix_memalign changed errno to %d", errno);
    if (rc && rc != ENOMEM) failed(w->id, "posix_memalign returned %d, not ENOMEM", rc);
    if (rc) p = NULL;
    break;
  case F_MEMALIGN: p = memalign(align, size); break;
  case F_VALLOC: p = valloc(size); align = 4096; break;
  case F_PVALLOC:
    p = pvalloc(size);
    align = 4096;
    size = (size + 4095) & ~(size_t)4095;
    break;
  default: break;
  }
  if (!p) {
    if (f != F_POSIX_MEMALIGN && errno != ENOMEM)
      failed(w->id, "%s(%zu) failed with errno %d, not ENOMEM", fn_name[f], size, errno);
    return false;
  }
  bool aligned_fn = f == F_ALIGNED_ALLOC || f == F_POSIX_MEMALIGN || f == F_MEMALIGN ||
                    f == F_VALLOC || f == F_PVALLOC;
  if ((uintptr_t)p % (aligned_fn ? align : 16))
    failed(w->id, "%s(%zu): %p not aligned to %zu", fn_name[f], size, p, aligned_fn ? align : 16);
  if (f == F_CALLOC && !zeroed(p, size)) failed(w->id, "calloc(%zu): not zeroed", size);
  if (malloc_usable_size(p) < size) failed(w->id, "%s(%zu): usable size too small", fn_name[f], size);
  keep(w, p, size);
  return true;
}

/* Function f until it fails for a request of 64 bytes or less: each failure halves the
 * largest size asked for, from 8 MiB. */
static void exhaust(worker *w, enum fn f) {
  size_t most = 8 * MIB;
  for (unsigned long tries = 0; tries < MAX_TRIES; tries++) {
    size_t size = 32 + next_random(w) % most;   /* (past the header: see keep) */
    if (allocate(w, f, size)) continue;
    w->refusals[f]++;
    if (w->asked <= 64) return;
    most = most / 2 > 48 ? most / 2 : 48;
  }
  failed(w->id, "%s still succeeding after %d tries", fn_name[f], MAX_TRIES);
}

static pthread_barrier_t all_started, all_done;

static void *run(void *arg) {
  worker *w = arg;
  pthread_barrier_wait(&all_started);   /* the memory runs out after every stack is mapped */
  for (unsigned k = 0; k < F_COUNT; k++) exhaust(w, (enum fn)((w->id + k) % F_COUNT));
  pthread_barrier_wait(&all_done);   /* every thread out of memory before any frees */
  for (held *h = w->list, *next; h; h = next) {
    next = h->next;
    if (((char *)h)[h->size - 1] != (char)h->size) failed(w->id, "a held block changed");
    free(h);
  }
  w->list = NULL;
  return NULL;
}

int main(void) {
  free(malloc(100));   /* the allocator is set up before the limit, as in a real program */
  keeps_errno = dlsym(RTLD_DEFAULT, "fm_owns") != NULL;
  struct rlimit limit;   /* the hard limit stays as it is */
  getrlimit(RLIMIT_AS, &limit);
  limit.rlim_cur = limit.rlim_max < LIMIT ? limit.rlim_max : LIMIT;
  if (setrlimit(RLIMIT_AS, &limit)) {
    perror("oom_threads: setrlimit");
    return 1;
  }
  pthread_barrier_init(&all_started, NULL, THREADS);
  pthread_barrier_init(&all_done, NULL, THREADS);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, STACK);
  static worker w[THREADS];
  pthread_t t[THREADS];
  unsigned started = 0;
  for (unsigned i = 0; i < THREADS; i++) {
    w[i] = (worker){.id = i, .rng = 0x9E3779B97F4A7C15ULL * (i + 1)};
    int rc = pthread_create(&t[i], &attr, run, &w[i]);
    if (rc) {
      fprintf(stderr, "oom_threads: FAIL: pthread_create of thread %u: %s (RLIMIT_AS %zu MiB)\n",
              i + 1, strerror(rc), (size_t)(LIMIT / MIB));
      return 1;   /* (the others wait at the barrier until the process ends) */
    }
    started++;
  }
  unsigned long blocks = 0, refusals[F_COUNT] = {0};
  for (unsigned i = 0; i < started; i++) {
    pthread_join(t[i], NULL);
    blocks += w[i].blocks;
    for (unsigned f = 0; f < F_COUNT; f++) refusals[f] += w[i].refusals[f];
  }
  void *again = malloc(16 * MIB), *small = malloc(100);
  if (!again || !small) failed(THREADS, "malloc after everything was freed failed");
  free(again);
  free(small);
  printf("oom_threads: %lu blocks held at the peak; failures:", blocks);
  for (unsigned f = 0; f < F_COUNT; f++) printf(" %s %lu", fn_name[f], refusals[f]);
  printf("\n");
  if (atomic_load(&failures)) {
    printf("oom_threads: FAIL: %u checks failed\n", atomic_load(&failures));
    return 1;
  }
  printf("oom_threads: ok\n");
  return 0;
}
