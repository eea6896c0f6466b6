/* Stress harness: T threads of seeded random heap operations (every allocation function, all
 * block kinds, frees by other threads, trims, forks), checking a pattern over every block.
 * Usage: stress [--seconds N] [--threads T] [--seed S] [--fork-every K] [--max-mib M] */
/* -DSTRESS_FM_API: calls the fm_ names, for the sanitizer builds, where the libc names are the
 * sanitizer's; memalign and valloc then map to fm_aligned_alloc. */
#ifdef STRESS_FM_API
#include "fm_api_names.h"
#endif

#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

enum op_kind {
  OP_MALLOC, OP_CALLOC, OP_REALLOC, OP_ALIGNED_ALLOC, OP_POSIX_MEMALIGN, OP_MEMALIGN,
  OP_VALLOC, OP_FREE, OP_REMOTE_FREE, OP_PASS, OP_USABLE, OP_TRIM, OP_FORK, OP_KINDS
};
static const char *const op_name[OP_KINDS] = {
    "malloc", "calloc", "realloc", "aligned_alloc", "posix_memalign", "memalign",
    "valloc", "free", "remote_free", "pass", "usable_size", "trim", "fork"};

/* The run's settings (read-only once the threads start). */
static double seconds = 10;
static unsigned nthreads = 4;
static uint64_t seed = 1;
static uint64_t fork_every;   /* 0: no forks */
static size_t max_live = 192 * MIB;   /* bytes requested and not freed, all threads together */
static uint64_t deadline_ns;

static atomic_size_t live_bytes;

typedef struct {
  void *p;
  size_t n;   /* bytes requested: the pattern covers them */
} block;

enum { SLOTS = 512, QUEUES = 8, QUEUE_LEN = 128 };

typedef struct worker {
  unsigned id;
  uint64_t rng;
  uint64_t op;          /* operations done */
  const char *doing;    /* the operation under way, for reports */
  block slot[SLOTS];
  uint64_t count[OP_KINDS];
  pthread_t thread;
} worker;

/* Blocks passed between threads: whoever pops one checks and frees it. */
static struct {
  pthread_mutex_t lock;
  unsigned head, len;
  block item[QUEUE_LEN];
} queue[QUEUES];

/* ---- reports ---- */

/* Writes the report with write(2) (no stdio lock, usable in a fork child) and aborts. */
static __attribute__((noreturn, format(printf, 3, 4))) void die(const worker *w, const void *p,
                                                                const char *fmt, ...) {
  char line[512];
  int len = snprintf(line, sizeof line, "stress: FAILED seed %" PRIu64 " thread %u op %" PRIu64
                     " (%s) ptr %p: ", seed, w ? w->id : 0, w ? w->op : 0,
                     w && w->doing ? w->doing : "-", p);
  va_list ap;
  va_start(ap, fmt);
  if (len > 0 && (size_t)len < sizeof line) len += vsnprintf(line + len, sizeof line - (size_t)len, fmt, ap);
  va_end(ap);
  if (len < 0) len = 0;
  if ((size_t)len > sizeof line - 2) len = (int)sizeof line - 2;
  line[len++] = '\n';
  ssize_t unused = write(STDERR_FILENO, line, (size_t)len);
  (void)unused;
  abort();
}

/* ---- patterns ---- */

static uint64_t rand64(uint64_t *s) {   /* xorshift64* */
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1DULL;
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x7FB5D329728EA185ULL;
  x ^= x >> 27;
  x *= 0x81DADEF4BC2DD44DULL;
  return x ^ (x >> 33);
}

/* Word i of the pattern of a block at address a of n bytes, whose key is
 * pattern_key(a, n): distinct for every word of every block. */
static inline uint64_t pattern_key(const void *a, size_t n) {
  return mix((uintptr_t)a ^ ((uint64_t)n << 47) ^ ((uint64_t)n >> 17));
}
static inline uint64_t pattern_word(uint64_t key, size_t i) {
  return (key ^ i) * 0x9E3779B97F4A7C15ULL;
}

/* Hides a pointer's origin, so _FORTIFY_SOURCE does not bound writes into the slack past
 * the request, and the compiler cannot reason about the block. */
static inline void *launder(void *p) {
  __asm__ volatile("" : "+r"(p));
  return p;
}

static void pattern_fill(void *p, size_t n) {
  unsigned char *b = p;
  uint64_t key = pattern_key(p, n);
  size_t words = n / 8;
  for (size_t i = 0; i < words; i++) {
    uint64_t w = pattern_word(key, i);
    memcpy(b + 8 * i, &w, 8);
  }
  uint64_t w = pattern_word(key, words);
  memcpy(b + 8 * words, &w, n % 8);
}

/* Checks bytes from .. len - 1 at q (from a multiple of 8, len <= n) against the pattern of
 * a block at address a of n bytes; dies at the first difference. */
static void pattern_check_from(const worker *w, const void *q, size_t from, size_t len,
                               const void *a, size_t n, const char *what) {
  const unsigned char *b = q;
  uint64_t key = pattern_key(a, n);
  for (size_t i = from / 8; i * 8 < len; i++) {
    uint64_t want = pattern_word(key, i), got = 0;
    size_t take = len - 8 * i < 8 ? len - 8 * i : 8;
    memcpy(&got, b + 8 * i, take);
    if (take < 8) want &= ((uint64_t)1 << (8 * take)) - 1;
    if (got != want) {
      size_t at = 8 * i;
      while (at < 8 * i + take && b[at] == (unsigned char)(want >> (8 * (at - 8 * i)))) at++;
      die(w, q, "%s: pattern of (%p, %zu bytes) broken at offset %zu of %zu (byte 0x%02x)", what,
          a, n, at, len, b[at]);
    }
  }
}

static void pattern_check(const worker *w, const void *q, size_t len, const void *a, size_t n,
                          const char *what) {
  pattern_check_from(w, q, 0, len, a, n, what);
}

static void check_zero(const worker *w, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i]) die(w, p, "calloc of %zu bytes: byte %zu is 0x%02x", n, i, b[i]);
}

/* ---- sizes ---- */

/* A size from one of the block kinds: small classes, page blocks, chunk spans, mappings of
 * their own (the big ones rarely: each is written and read whole). */
static size_t random_size(worker *w) {
  uint64_t r = rand64(&w->rng), x = rand64(&w->rng);
  unsigned pick = (unsigned)(r % 1000);
  if (pick < 500) return 1 + x % 256;
  if (pick < 800) return 1 + x % (12 * KIB);
  if (pick < 950) return 12 * KIB + 1 + x % (52 * KIB);
  if (pick < 996) return 64 * KIB + 1 + x % (960 * KIB);
  return MIB + 1 + x % (3 * MIB);
}

/* A size for realloc: near the old one (in place growth or shrink), or any. */
static size_t resize_to(worker *w, size_t old) {
  uint64_t r = rand64(&w->rng);
  switch (r % 4) {
  case 0: return old + 1 + rand64(&w->rng) % (old / 2 + 16);                      /* grow a bit */
  case 1: return old > 1 ? old - rand64(&w->rng) % (old / 2 + 1) : 1;             /* shrink */
  case 2: return old < 4 * MIB ? old * 2 + rand64(&w->rng) % 4096 : old / 2 + 1;   /* double */
  default: return random_size(w);
  }
}

/* 16 B .. 64 KiB, and now and then 128 KiB .. 4 MiB. */
static size_t random_alignment(worker *w) {
  uint64_t r = rand64(&w->rng);
  if (r % 64 == 0) return (size_t)128 * KIB << (r >> 8) % 6;
  return (size_t)16 << (r >> 8) % 13;
}

/* ---- live bytes ---- */

static bool reserve(size_t n) {
  size_t was = atomic_fetch_add(&live_bytes, n);
  if (was + n <= max_live) return true;
  atomic_fetch_sub(&live_bytes, n);
  return false;
}

static void unreserve(size_t n) { atomic_fetch_sub(&live_bytes, n); }

/* ---- operations ---- */

static void take(worker *w, void *p, size_t n, size_t align, const char *what) {
  if (!p) die(w, p, "%s of %zu bytes (alignment %zu) failed: %s", what, n, align, strerror(errno));
  if (align && ((uintptr_t)p & (align - 1)))
    die(w, p, "%s of %zu bytes: not aligned to %zu", what, n, align);
}

static void check_block(worker *w, const block *b, const char *what) {
  pattern_check(w, b->p, b->n, b->p, b->n, what);
}

static void release(worker *w, block *b) {
  check_block(w, b, "before free");
  free(b->p);
  unreserve(b->n);
  b->p = NULL;
}

static bool queue_push(block b) {
  unsigned q = (unsigned)(mix((uintptr_t)b.p) % QUEUES);
  bool done = false;
  pthread_mutex_lock(&queue[q].lock);
  if (queue[q].len < QUEUE_LEN) {
    queue[q].item[(queue[q].head + queue[q].len++) % QUEUE_LEN] = b;
    done = true;
  }
  pthread_mutex_unlock(&queue[q].lock);
  return done;
}

static bool queue_pop(unsigned q, block *out) {
  bool got = false;
  pthread_mutex_lock(&queue[q].lock);
  if (queue[q].len) {
    *out = queue[q].item[queue[q].head];
    queue[q].head = (queue[q].head + 1) % QUEUE_LEN;
    queue[q].len--;
    got = true;
  }
  pthread_mutex_unlock(&queue[q].lock);
  return got;
}

/* A new block in slot b (empty) with one of the allocation functions. */
static void allocate(worker *w, block *b) {
  size_t n = random_size(w);
  uint64_t r = rand64(&w->rng) % 100;
  size_t count = 1 + rand64(&w->rng) % 8;   /* calloc's element count */
  if (r >= 55 && r < 70) n = (n + count - 1) / count * count;
  if (!reserve(n)) return;
  void *p = NULL;
  size_t align = 0;
  enum op_kind kind;
  if (r < 55) {
    kind = OP_MALLOC;
    w->doing = "malloc";
    p = malloc(n);
  } else if (r < 70) {
    kind = OP_CALLOC;
    w->doing = "calloc";
    p = calloc(count, n / count);
    take(w, p, n, 0, "calloc");
    check_zero(w, p, n);
  } else if (r < 80) {
    kind = OP_ALIGNED_ALLOC;
    w->doing = "aligned_alloc";
    align = random_alignment(w);
    p = aligned_alloc(align, n);
  } else if (r < 88) {
    kind = OP_POSIX_MEMALIGN;
    w->doing = "posix_memalign";
    align = random_alignment(w);
    int rc = posix_memalign(&p, align, n);
    if (rc) die(w, NULL, "posix_memalign(%zu, %zu) returned %d", align, n, rc);
  } else if (r < 95) {
    kind = OP_MEMALIGN;
    w->doing = "memalign";
    align = random_alignment(w);
    p = memalign(align, n);
  } else {
    kind = OP_VALLOC;
    w->doing = "valloc";
    align = 4096;
    p = valloc(n);
  }
  take(w, p, n, align, w->doing);
  pattern_fill(p, n);
  b->p = p;
  b->n = n;
  w->count[kind]++;
}

static void resize(worker *w, block *b) {
  size_t m = resize_to(w, b->n);
  if (m > b->n && !reserve(m - b->n)) return;
  w->doing = "realloc";
  check_block(w, b, "before realloc");
  void *q = realloc(b->p, m);
  take(w, q, m, 0, "realloc");
  size_t kept = m < b->n ? m : b->n;
  pattern_check(w, q, kept, b->p, b->n, "after realloc (kept prefix)");
  if (m < b->n) unreserve(b->n - m);
  pattern_fill(q, m);
  b->p = q;
  b->n = m;
  w->count[OP_REALLOC]++;
}

/* malloc_usable_size covers the request, and all of it is the block's own: the slack is
 * written over, and the request's pattern rewritten (a write into another block would show
 * when that one is checked). */
static void usable(worker *w, block *b) {
  w->doing = "malloc_usable_size";
  size_t u = malloc_usable_size(b->p);
  if (u < b->n) die(w, b->p, "malloc_usable_size %zu below the %zu bytes requested", u, b->n);
  memset((char *)launder(b->p) + b->n, 0xA5, u - b->n);
  size_t tail = b->n < 64 ? 0 : (b->n - 64) & ~(size_t)7;   /* the rest: before its free */
  pattern_check_from(w, b->p, tail, b->n, b->p, b->n, "after writing the slack");
  w->count[OP_USABLE]++;
}

/* ---- fork ---- */

/* In the child: this thread's blocks and the queued ones (queues whose lock another thread
 * held at the fork are skipped) keep their patterns and can be freed; new blocks work. */
static void child_work(worker *w) {
  alarm(60);   /* a child that hangs dies of SIGALRM, which the parent reports */
  w->doing = "fork child: inherited block";
  for (unsigned s = 0; s < SLOTS; s++)
    if (w->slot[s].p) check_block(w, &w->slot[s], "in the fork child");
  for (unsigned q = 0; q < QUEUES; q++) {
    if (pthread_mutex_trylock(&queue[q].lock)) continue;
    for (unsigned i = 0; i < queue[q].len; i++)
      check_block(w, &queue[q].item[(queue[q].head + i) % QUEUE_LEN], "queued, in the fork child");
    pthread_mutex_unlock(&queue[q].lock);
  }
  for (unsigned s = 0; s < SLOTS; s += 2)
    if (w->slot[s].p) release(w, &w->slot[s]);
  for (unsigned i = 0; i < 400; i++) {
    block *b = &w->slot[rand64(&w->rng) % SLOTS];
    if (!b->p) allocate(w, b);
    else if (i % 3) resize(w, b);
    else release(w, b);
  }
  for (unsigned s = 0; s < SLOTS; s++)
    if (w->slot[s].p) release(w, &w->slot[s]);
  _exit(0);
}

static void do_fork(worker *w) {
  w->doing = "fork";
  pid_t pid = fork();
  if (pid < 0) die(w, NULL, "fork failed: %s", strerror(errno));
  if (pid == 0) child_work(w);
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) die(w, NULL, "waitpid: %s", strerror(errno));
  if (WIFSIGNALED(status))
    die(w, NULL, "fork child %d killed by signal %d%s", (int)pid, WTERMSIG(status),
        WTERMSIG(status) == SIGALRM ? " (hung for 60 s)" : "");
  if (!WIFEXITED(status) || WEXITSTATUS(status))
    die(w, NULL, "fork child %d exited with status %d", (int)pid, WEXITSTATUS(status));
  w->count[OP_FORK]++;
}

/* ---- the threads ---- */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void step(worker *w) {
  block *b = &w->slot[rand64(&w->rng) % SLOTS];
  uint64_t r = rand64(&w->rng) % 1000;
  w->doing = NULL;
  if (fork_every && w->op % fork_every == fork_every - 1 - (w->id * fork_every / nthreads)) {
    do_fork(w);
  } else if (r == 0 && rand64(&w->rng) % 50 == 0) {
    w->doing = "malloc_trim";
    malloc_trim(0);
    w->count[OP_TRIM]++;
  } else if (!b->p) {
    if (r < 100 && nthreads > 1) {   /* a block another thread passed on */
      block got;
      if (queue_pop((unsigned)(rand64(&w->rng) % QUEUES), &got)) {
        w->doing = "remote free";
        release(w, &got);
        w->count[OP_REMOTE_FREE]++;
        return;
      }
    }
    allocate(w, b);
  } else if (r < 350) {
    w->doing = "free";
    release(w, b);
    w->count[OP_FREE]++;
  } else if (r < 450 && nthreads > 1) {
    w->doing = "pass to another thread";
    check_block(w, b, "before passing on");
    if (queue_push(*b)) {
      b->p = NULL;
      w->count[OP_PASS]++;
    }
  } else if (r < 750) {
    resize(w, b);
  } else if (r < 850) {
    usable(w, b);
  } else {
    w->doing = "check";
    check_block(w, b, "check");
  }
}

static void *run(void *arg) {
  worker *w = arg;
  while ((w->op & 63) || now_ns() < deadline_ns) {
    step(w);
    w->op++;
  }
  w->doing = "final free";
  for (unsigned s = 0; s < SLOTS; s++)
    if (w->slot[s].p) release(w, &w->slot[s]);
  return NULL;
}

static void usage(void) {
  fprintf(stderr, "usage: stress [--seconds N] [--threads T] [--seed S] [--fork-every K] "
                  "[--max-mib M]\n");
  exit(2);
}

static uint64_t number(const char *s) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno || end == s || *end) usage();
  return v;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (i + 1 == argc) usage();
    const char *opt = argv[i], *val = argv[++i];
    if (!strcmp(opt, "--seconds")) seconds = (double)number(val);
    else if (!strcmp(opt, "--threads")) nthreads = (unsigned)number(val);
    else if (!strcmp(opt, "--seed")) seed = number(val);
    else if (!strcmp(opt, "--fork-every")) fork_every = number(val);
    else if (!strcmp(opt, "--max-mib")) max_live = (size_t)number(val) * MIB;
    else usage();
  }
  if (nthreads < 1 || nthreads > 256 || max_live < 16 * MIB) usage();
  for (unsigned q = 0; q < QUEUES; q++) pthread_mutex_init(&queue[q].lock, NULL);
  worker *workers = calloc(nthreads, sizeof *workers);
  if (!workers) return 1;
  deadline_ns = now_ns() + (uint64_t)(seconds * 1e9);
  for (unsigned t = 0; t < nthreads; t++) {
    worker *w = &workers[t];
    w->id = t;
    w->rng = mix(seed * 0x9E3779B97F4A7C15ULL + t + 1) | 1;
    int rc = pthread_create(&w->thread, NULL, run, w);
    if (rc) die(NULL, NULL, "pthread_create: %s", strerror(rc));
  }
  uint64_t total[OP_KINDS] = {0}, ops = 0;
  for (unsigned t = 0; t < nthreads; t++) {
    pthread_join(workers[t].thread, NULL);
    for (int k = 0; k < OP_KINDS; k++) total[k] += workers[t].count[k];
    ops += workers[t].op;
  }
  /* What is still queued: checked and freed here. */
  worker main_worker = {.id = nthreads, .doing = "draining the queues"};
  for (unsigned q = 0; q < QUEUES; q++) {
    block b;
    while (queue_pop(q, &b)) release(&main_worker, &b);
  }
  if (atomic_load(&live_bytes) != 0)
    die(NULL, NULL, "%zu bytes still counted live after the run", atomic_load(&live_bytes));
  char line[512];
  int len = snprintf(line, sizeof line, "stress: ok, seed %" PRIu64 ", %u threads, %g s, %" PRIu64
                     " operations:", seed, nthreads, seconds, ops);
  for (int k = 0; k < OP_KINDS && len > 0 && (size_t)len < sizeof line; k++)
    len += snprintf(line + len, sizeof line - (size_t)len, " %s %" PRIu64, op_name[k], total[k]);
  puts(line);
  free(workers);
  return 0;
}
