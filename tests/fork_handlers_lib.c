/* A library that registers fork handlers in its constructor, before fastmalloc's first
 * malloc registers its own (as OpenBLAS does, say): glibc then runs its prepare handler
 * after fastmalloc's, which holds every allocator lock by then, and its child handler
 * before fastmalloc's, which resets them. Both handlers allocate past the thread cache:
 * a span block and a mapped one. The first prepare also forks, and checks that the
 * allocator's locks stay taken afterwards: fork_handlers_progress, which another thread
 * of the probe bumps after each span malloc, must stand still. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

atomic_ulong fork_handlers_progress;
int fork_handlers_nested_failures;   /* the locks came free inside the outer fork */

static void *kept;
static int nested;   /* 0: not yet, 1: forking now, 2: done */

static void allocate(void) {
  char *span = malloc(200000), *mapped = malloc(3 << 20);
  if (!span || !mapped) abort();
  memset(span, 1, 200000);
  memset(mapped, 2, 4096);
  free(span);
  free(kept);
  kept = mapped;
}

static void prepare(void) {
  allocate();
  if (nested) return;
  nested = 1;
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  if (pid > 0) waitpid(pid, NULL, 0);
  usleep(20000);   /* a span malloc already past the lock may still count once */
  unsigned long settled = atomic_load(&fork_handlers_progress);
  usleep(20000);
  if (atomic_load(&fork_handlers_progress) != settled) fork_handlers_nested_failures++;
  nested = 2;
}

__attribute__((constructor)) static void register_handlers(void) {
  pthread_atfork(prepare, allocate, allocate);
}
