/* An address-space limit set after fastmalloc's set-up (setrlimit in main, as a program
 * that caps itself does): blocks of every kind, new mappings included, keep coming, and a
 * thread (whose stack is a mapping) still starts. Exit 0 on success. */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "fastmalloc.h"

/* The largest anonymous mapping's size, from /proc/self/maps; 0 when it cannot be read. */
static unsigned long largest_anonymous_mapping(void) {
  FILE *maps = fopen("/proc/self/maps", "r");
  char line[512];
  unsigned long largest = 0;
  while (maps && fgets(line, sizeof line, maps)) {
    unsigned long start, end, inode;
    if (sscanf(line, "%lx-%lx %*s %*s %*s %lu", &start, &end, &inode) == 3 && inode == 0 &&
        !strstr(line, "[stack") && end - start > largest)
      largest = end - start;
  }
  if (maps) fclose(maps);
  return largest;
}

static void *thread_allocates(void *arg) {
  char *p = malloc(70000);
  if (p) memset(p, 3, 70000);
  free(p);
  return p;
}

int main(void) {
  char *early = malloc(100);   /* set-up, without a limit: the whole unit map */
  if (!early) return 1;
  memset(early, 1, 100);
  /* Address space held but not used stays small: no reservation of a size to matter
   * under a limit (the chunks fastmalloc maps are 4 MiB each). */
  unsigned long largest = largest_anonymous_mapping();
  if (largest >= ((unsigned long)64 << 20)) {
    printf("FAIL: an anonymous mapping of %lu bytes after set-up\n", largest);
    return 1;
  }
  struct rlimit limit = {(rlim_t)1 << 30, (rlim_t)1 << 30};
  if (setrlimit(RLIMIT_AS, &limit) != 0) {
    printf("FAIL: setrlimit errno %d\n", errno);
    return 1;
  }
  const size_t sizes[] = {16, 5000, 100000, (size_t)3 << 20, (size_t)64 << 20, (size_t)300 << 20};
  for (int round = 0; round < 3; round++) {
    for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) {
      char *p = malloc(sizes[i]);
      if (!p || !fm_owns(p)) {
        printf("FAIL: malloc(%zu) under a late limit, errno %d\n", sizes[i], errno);
        return 1;
      }
      memset(p, 2, sizes[i]);
      free(p);
    }
  }
  /* A thread's stack is a mapping of the program's own: it must still fit. */
  pthread_t thread;
  void *result;
  if (pthread_create(&thread, NULL, thread_allocates, NULL) != 0 ||
      pthread_join(thread, &result) != 0 || !result) {
    puts("FAIL: a thread could not start or allocate under the limit");
    return 1;
  }
  free(NULL);
  if (early[99] != 1) return 1;
  free(early);
  int local;
  if (fm_owns(&local)) return 1;
  puts("every request under a limit set after set-up worked");
  return 0;
}
