/* Linked with libfastmalloc.a by the static-link tests (fully static, and into a dynamic
 * executable): proves that its malloc and libc's internal allocations are fastmalloc's, in
 * the main thread, in a second thread and in a fork child, and that the first calls work
 * before any constructor has run (.preinit_array). Exit 0 when all hold. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fastmalloc.h>

static int failures;

#define EXPECT(cond)                                                      \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "static_prog:%d: failed: %s\n", __LINE__, #cond); \
      failures++;                                                         \
    }                                                                     \
  } while (0)

/* The process's first allocations, before fastmalloc's constructor: one of each path that
 * finds a size class (through the thread cache's table, the global one, or by alignment). */
static void *early[5];

static void allocate_early(void) {
  early[0] = malloc(2000);
  early[1] = calloc(1, 4096);
  early[2] = realloc(NULL, 30000);
  early[3] = malloc(100);
  if (posix_memalign(&early[4], 16, 3000) != 0) early[4] = NULL;
}
__attribute__((section(".preinit_array"), used)) static void (*const preinit)(void) = allocate_early;

static void *thread_alloc(void *arg) {
  char *p = strdup("allocated in a thread");
  return p && fm_owns(p) ? p : NULL;
}

int main(void) {
  for (int i = 0; i < 5; i++) {
    EXPECT(early[i] && fm_owns(early[i]));
    free(early[i]);
  }
  void *p = malloc(100), *c = calloc(10, 10), *r = realloc(malloc(10), 100000);
  void *a = aligned_alloc(4096, 100), *pm = NULL;
  EXPECT(fm_owns(p) && fm_owns(c) && fm_owns(r) && fm_owns(a));
  EXPECT(posix_memalign(&pm, 64, 100) == 0 && fm_owns(pm));
  char *s = strdup("libc allocates this");
  EXPECT(fm_owns(s));
  char *line = NULL;
  size_t cap = 0;
  FILE *f = fopen("/proc/self/maps", "r");
  EXPECT(f && getline(&line, &cap, f) > 0 && fm_owns(line));
  pthread_t t;
  void *tp = NULL;
  EXPECT(pthread_create(&t, NULL, thread_alloc, NULL) == 0 && pthread_join(t, &tp) == 0 && tp);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    void *q = malloc(5000);
    _exit(q && fm_owns(q) && fm_owns(s) ? 0 : 1);
  }
  int status = -1;
  EXPECT(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
         WEXITSTATUS(status) == 0);
  free(p);
  free(c);
  free(r);
  free(a);
  free(pm);
  free(s);
  free(line);
  free(tp);
  fclose(f);
  char *big = malloc(8 << 20);   /* freed, its mapping waits in the large-block cache */
  EXPECT(big != NULL);
  free(big);
  EXPECT(malloc_trim(0) == 1);   /* which trim gives back */
  printf("static_prog: %s, fastmalloc %s\n", failures ? "FAILED" : "ok", fm_version());
  return failures != 0;
}
