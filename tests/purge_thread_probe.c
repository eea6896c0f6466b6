/* FASTMALLOC_PURGE_THREAD=1: a program that frees its heap and then makes no call at all
 * gets its pages back from fastmalloc's purge thread, named fm-purge, within a few purge
 * delays (a bound on progress: 3 s, 30 delays), but for those its thread cache's blocks lie
 * on (at most a few MiB). With `none`, run without the setting: no such thread exists.
 * Exit 0 on success; 2 when the heap or the RSS cannot be had. */
#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "probe_rss.h"

/* Whether one of the process's threads is named fm-purge. */
static bool purge_thread_exists(void) {
  DIR *tasks = opendir("/proc/self/task");
  struct dirent *task;
  bool found = false;
  while (tasks && (task = readdir(tasks))) {
    char path[300], name[32] = "";
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", task->d_name);
    int fd = open(path, O_RDONLY);
    if (fd < 0) continue;
    ssize_t len = read(fd, name, sizeof name - 1);
    close(fd);
    found |= len > 0 && strncmp(name, "fm-purge\n", 9) == 0;
  }
  if (tasks) closedir(tasks);
  return found;
}

enum { BLOCKS = 300000 };
static void *heap[BLOCKS];

int main(int argc, char **argv) {
  bool expect_thread = !(argc > 1 && strcmp(argv[1], "none") == 0);
  if (purge_thread_exists() != expect_thread) {
    fprintf(stderr, "purge thread %s\n", expect_thread ? "missing" : "running unasked");
    return 1;
  }
  if (!expect_thread) return 0;
  size_t rss0 = probe_rss(), total = 0;
  if (!rss0) return 2;
  for (unsigned i = 0; i < BLOCKS; i++) {
    /* mostly 16-256 bytes, some page blocks, a few large ones */
    size_t n = i % 3000 == 2999 ? (128 << 10) + (i * 7919) % (896 << 10)
               : i % 100 == 99  ? 4096 + (i * 131) % (28 << 10)
                                : 16 + (i * 37) % 241;
    heap[i] = malloc(n);
    if (!heap[i]) return 2;
    memset(heap[i], 1, n);
    total += n;
  }
  for (unsigned i = 0; i < BLOCKS; i++) free(heap[(i * 7919u) % BLOCKS]);   /* (7919: prime) */
  size_t rss1 = probe_rss(), rss2 = rss1;
  int waits = 0;
  for (; waits < 300 && (rss2 = probe_rss()) > rss0 + total / 4; waits++) usleep(10 * 1000);
  printf("heap %zu: rss %zu before, %zu freed, %zu after %d waits of 10 ms\n", total, rss0, rss1,
         rss2, waits);
  return waits < 300 ? 0 : 1;
}
