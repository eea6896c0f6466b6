/* A library that registers fork handlers in its constructor, before fastmalloc's first
 * malloc registers its own (as OpenBLAS does, say): glibc then runs its prepare handler
 * after fastmalloc's, which has taken every allocator lock for the fork by then, and its
 * child handler before fastmalloc's, which frees them. Both handlers allocate past the
 * thread cache: a span block and a mapped one. The first prepare also forks (its child
 * allocates), then checks that another thread of the probe still allocates inside the
 * window: fork_handlers_progress, which it bumps after each span malloc, must move. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

atomic_ulong fork_handlers_progress;
int fork_handlers_nested_failures;   /* the fork inside the outer fork's window failed */
int fork_handlers_blocked;           /* the other thread could not allocate in the window */

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
  if (pid == 0) {
    char *p = malloc(200000);
    if (!p) _exit(2);
    memset(p, 4, 200000);
    free(p);
    _exit(0);
  }
  int status;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
    fork_handlers_nested_failures++;
  /* Still inside the outer fork's window: the other thread goes on allocating (a bound
   * of 5 s for it to be scheduled, not a timing). */
  unsigned long start = atomic_load(&fork_handlers_progress);
  for (int i = 0; i < 500 && atomic_load(&fork_handlers_progress) == start; i++) usleep(10000);
  if (atomic_load(&fork_handlers_progress) == start) fork_handlers_blocked++;
  nested = 2;
}

__attribute__((constructor)) static void register_handlers(void) {
  pthread_atfork(prepare, allocate, allocate);
}
