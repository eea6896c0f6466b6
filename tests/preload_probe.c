/* Run under LD_PRELOAD by the preload test; deliberately not linked with fastmalloc. Exit 0
 * when fastmalloc serves this program (its malloc, libc's internal allocations, a thread's),
 * 2 when fastmalloc is absent, 1 when it is loaded but something is not served by it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int (*owns)(const void *);
static int failures;

static void expect_owned(const void *p, const char *what) {
  if (!p || !owns(p)) {
    printf("not fastmalloc's: %s\n", what);
    failures++;
  }
}

static void *thread_alloc(void *arg) { return malloc(1000); }

int main(void) {
  owns = (int (*)(const void *))dlsym(RTLD_DEFAULT, "fm_owns");
  if (!owns) {
    puts("fastmalloc absent");
    return 2;
  }
  Dl_info info;
  if (!dladdr(dlsym(RTLD_DEFAULT, "malloc"), &info) || !strstr(info.dli_fname, "libfastmalloc")) {
    puts("malloc does not resolve into libfastmalloc");
    failures++;
  }
  void *p = malloc(100), *c = calloc(10, 10), *r = realloc(malloc(10), 5000);
  expect_owned(p, "malloc");
  expect_owned(c, "calloc");
  expect_owned(r, "realloc");
  char *s = strdup("libc allocates this");
  expect_owned(s, "strdup");
  char *line = NULL;
  size_t cap = 0;
  FILE *f = fopen("/proc/self/maps", "r");
  if (f && getline(&line, &cap, f) > 0) expect_owned(line, "getline");
  else failures++;
  pthread_t t;
  void *tp = NULL;
  if (pthread_create(&t, NULL, thread_alloc, NULL) || pthread_join(t, &tp)) failures++;
  expect_owned(tp, "malloc in a thread");
  free(p);
  free(c);
  free(r);
  free(s);
  free(line);
  free(tp);
  if (f) fclose(f);
  puts(failures ? "fastmalloc loaded but not in use" : "fastmalloc in use");
  return failures ? 1 : 0;
}
