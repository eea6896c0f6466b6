/* fork against libc's stdio and NSS locks, which glibc's fork takes after the atfork handlers:
 * threads fork while others getline from pipes and fflush(NULL) (--nss: make their first NSS
 * lookups). A hang is the failure. Usage: fork_stdio [--seconds N] [--rounds R] [--nss] */
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { FORKERS = 4, READERS = 8, NSS_FORKERS = 2, NSS_LOOKERS = 4, NSS_LOOKUPS = 10 };

static double seconds = 3;
static uint64_t deadline_ns;
static atomic_bool stop;
static atomic_uint failures;
static atomic_ulong forks, lines, flushes, lookups;

static void failed(const char *what, long value) {
  atomic_fetch_add(&failures, 1);
  fprintf(stderr, "fork_stdio: FAIL: %s (%ld)\n", what, value);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static bool time_up(void) { return atomic_load(&stop) || now_ns() >= deadline_ns; }

static uint64_t next_random(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* ---- forking ---- */

/* The child allocates and frees a little (every kind of block) and exits; it dies of
 * SIGALRM if that hangs. */
static void fork_once(uint64_t *rng) {
  pid_t pid = fork();
  if (pid < 0) {
    failed("fork failed, errno", errno);
    return;
  }
  if (pid == 0) {
    alarm(20);
    void *p[8];
    for (int i = 0; i < 8; i++) {
      size_t size = 16 + next_random(rng) % (i < 6 ? 4096 : 2 << 20);
      if (!(p[i] = malloc(size))) _exit(3);
      memset(p[i], i, size);
    }
    for (int i = 0; i < 8; i++) free(p[i]);
    _exit(0);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) {
      failed("waitpid failed, errno", errno);
      return;
    }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    failed("a fork child failed, wait status", status);
  atomic_fetch_add(&forks, 1);
}

static void *forker(void *arg) {
  uint64_t rng = 0x9E3779B97F4A7C15ULL * ((uintptr_t)arg + 1);
  while (!time_up()) fork_once(&rng);
  return NULL;
}

/* ---- getline from pipes, fflush(NULL) ---- */

typedef struct pipe_pair {
  int fd[2];
  unsigned id;
} pipe_pair;

/* Lines "<length>:<byte repeated>\n" of 0 - 64 KiB (a few to 256 KiB), so getline's buffer
 * grows through every kind of block. */
static void *writer(void *arg) {
  pipe_pair *pp = arg;
  uint64_t rng = 0x2545F4914F6CDD1DULL * (pp->id + 1);
  size_t room = 300 << 10;
  char *line = malloc(room);
  if (!line) {
    failed("writer malloc failed", 0);
    close(pp->fd[1]);
    return NULL;
  }
  while (!time_up()) {
    uint64_t r = next_random(&rng);
    size_t body = r % 4 ? r % 256 : r % 16 ? (r >> 8) % (64 << 10) : (r >> 8) % (256 << 10);
    int head = snprintf(line, 32, "%zu:", body);
    memset(line + head, 'a' + (int)(r % 26), body);
    line[head + body] = '\n';
    size_t len = (size_t)head + body + 1, done = 0;
    while (done < len) {
      ssize_t w = write(pp->fd[1], line + done, len - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        failed("write to the pipe failed, errno", errno);
        goto out;
      }
      done += (size_t)w;
    }
  }
out:
  free(line);
  close(pp->fd[1]);
  return NULL;
}

static void *reader(void *arg) {
  pipe_pair *pp = arg;
  FILE *in = fdopen(pp->fd[0], "r");
  if (!in) {
    failed("fdopen failed, errno", errno);
    return NULL;
  }
  char *buf = NULL;
  size_t cap = 0;
  ssize_t len;
  for (unsigned long n = 1; (len = getline(&buf, &cap, in)) >= 0; n++) {
    char *colon = memchr(buf, ':', (size_t)len);
    size_t body = colon ? strtoul(buf, NULL, 10) : 0;
    if (!colon || (size_t)(colon - buf) + 1 + body + 1 != (size_t)len)
      failed("a line came out wrong, length", len);
    atomic_fetch_add(&lines, 1);
    if (n % 4 == 0) {   /* a new buffer: getline mallocs and reallocs it again */
      free(buf);
      buf = NULL;
      cap = 0;
    }
  }
  free(buf);
  fclose(in);
  return NULL;
}

static void *flusher(void *arg) {
  while (!time_up()) {
    fflush(NULL);
    atomic_fetch_add(&flushes, 1);
  }
  return NULL;
}

/* 4 threads fork in a loop, 8 getline from pipes that 8 writers feed, one calls fflush(NULL),
 * which locks every FILE under the list lock: an allocator whose prepare handler holds its locks
 * while fork waits for the list lock deadlocks with a getline waiting in realloc. */
static int run_stdio(void) {
  static pipe_pair pp[READERS];
  pthread_t w[READERS], r[READERS], f[FORKERS], fl;
  for (unsigned i = 0; i < READERS; i++) {
    pp[i].id = i;
    if (pipe(pp[i].fd)) {
      perror("fork_stdio: pipe");
      return 1;
    }
  }
  for (unsigned i = 0; i < READERS; i++)
    if (pthread_create(&r[i], NULL, reader, &pp[i]) || pthread_create(&w[i], NULL, writer, &pp[i]))
      return 1;
  if (pthread_create(&fl, NULL, flusher, NULL)) return 1;
  for (uintptr_t i = 0; i < FORKERS; i++)
    if (pthread_create(&f[i], NULL, forker, (void *)i)) return 1;
  for (unsigned i = 0; i < FORKERS; i++) pthread_join(f[i], NULL);
  pthread_join(fl, NULL);
  for (unsigned i = 0; i < READERS; i++) {
    pthread_join(w[i], NULL);
    pthread_join(r[i], NULL);
  }
  printf("fork_stdio: %lu forks, %lu lines read, %lu fflush(NULL) in %g s\n", atomic_load(&forks),
         atomic_load(&lines), atomic_load(&flushes), seconds);
  return 0;
}

/* ---- NSS lookups ---- */

/* A process's first lookup loads the NSS configuration: each round is a fresh process whose
 * lookups start while its threads fork. (glibc 2.36 holds the database lock only to check and
 * swap the configuration, and allocates outside it; a libc that allocates under it would
 * deadlock here with an allocator that holds its locks across fork.) */
static pthread_barrier_t round_start;

static void *nss_forker(void *arg) {
  uint64_t rng = 0x9E3779B97F4A7C15ULL * ((uintptr_t)arg + 1);
  pthread_barrier_wait(&round_start);
  while (!atomic_load(&stop)) fork_once(&rng);
  return NULL;
}

static void *looker(void *arg) {
  pthread_barrier_wait(&round_start);
  /* The _r forms: getpwnam's static result is rewritten by the other lookers meanwhile. */
  char buffer[4096];
  struct passwd entry, *pw;
  for (int i = 0; i < NSS_LOOKUPS; i++) {
    int rc = getpwnam_r("root", &entry, buffer, sizeof buffer, &pw);
    if (rc || !pw) failed("getpwnam_r(\"root\") found nothing, error", rc);
    else if (pw->pw_uid != 0) failed("getpwnam_r(\"root\") gave uid", pw->pw_uid);
    rc = getpwuid_r(0, &entry, buffer, sizeof buffer, &pw);
    if (rc || !pw) failed("getpwuid_r(0) found nothing, error", rc);
    else if (strcmp(pw->pw_name, "root") != 0) failed("getpwuid_r(0) gave another name", 0);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    rc = getaddrinfo("localhost", "80", &hints, &res);
    if (rc) failed("getaddrinfo(\"localhost\") failed, code", rc);
    else freeaddrinfo(res);
    atomic_fetch_add(&lookups, 1);
  }
  return NULL;
}

static void nss_round(void) {
  atomic_store(&failures, 0); /* the parent's count of failed rounds is not this round's */
  pthread_t f[NSS_FORKERS], l[NSS_LOOKERS];
  pthread_barrier_init(&round_start, NULL, NSS_FORKERS + NSS_LOOKERS);
  for (uintptr_t i = 0; i < NSS_FORKERS; i++)
    if (pthread_create(&f[i], NULL, nss_forker, (void *)i)) _exit(4);
  for (unsigned i = 0; i < NSS_LOOKERS; i++)
    if (pthread_create(&l[i], NULL, looker, NULL)) _exit(4);
  for (unsigned i = 0; i < NSS_LOOKERS; i++) pthread_join(l[i], NULL);
  atomic_store(&stop, true);
  for (unsigned i = 0; i < NSS_FORKERS; i++) pthread_join(f[i], NULL);
  _exit(atomic_load(&failures) ? 1 : 0);
}

static int run_nss(void) {
  unsigned long rounds = 0;
  while (!time_up()) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork_stdio: fork");
      return 1;
    }
    if (pid == 0) nss_round();
    int status;
    while (waitpid(pid, &status, 0) < 0)
      if (errno != EINTR) return 1;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed("a round failed, wait status", status);
    rounds++;
  }
  printf("fork_stdio --nss: %lu rounds in %g s\n", rounds, seconds);
  return 0;
}

int main(int argc, char **argv) {
  bool nss = false;
  int rounds = 1, rc = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--nss")) nss = true;
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: fork_stdio [--seconds N] [--rounds R] [--nss]\n");
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  for (int r = 0; r < rounds && !rc; r++) {
    atomic_store(&stop, false);
    atomic_store(&forks, 0);
    atomic_store(&lines, 0);
    atomic_store(&flushes, 0);
    deadline_ns = now_ns() + (uint64_t)(seconds * 1e9);
    rc = nss ? run_nss() : run_stdio();
  }
  if (rc || atomic_load(&failures)) {
    printf("fork_stdio: FAIL (%u failures)\n", atomic_load(&failures));
    return 1;
  }
  printf("fork_stdio: ok\n");
  return 0;
}
