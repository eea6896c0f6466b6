/* For stats_test.py: allocates blocks of every kind, frees some, then calls malloc_stats()
 * (stderr) and malloc_info(0, stdout), keeping its blocks until exit. With argument
 * "thread", a second thread allocates first, into the other arena. */
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *kept[600];

static void *allocate(void *arg) {
  unsigned first = (unsigned)(uintptr_t)arg;
  for (unsigned i = first; i < first + 300; i++) {
    size_t n = i % 50 ? 16 + i * 7 % 4000 : i % 100 ? 20000 : 3 << 20;
    kept[i] = malloc(n);
    if (!kept[i]) abort();
    memset(kept[i], 1, n < 4096 ? n : 4096);
  }
  for (unsigned i = first; i < first + 300; i += 3) {
    free(kept[i]);
    kept[i] = NULL;
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "thread") == 0) {
    pthread_t t;
    if (pthread_create(&t, NULL, allocate, (void *)300) || pthread_join(t, NULL)) return 1;
  }
  allocate(0);
  malloc_stats();
  fflush(stdout);
  return malloc_info(0, stdout) == 0 && malloc_info(1, stdout) != 0 ? 0 : 1;
}
