/* Run under LD_PRELOAD of fastmalloc and linked with fork_handlers_lib, whose fork
 * handlers, registered before fastmalloc's, allocate (and the first prepare forks):
 * forks while another thread keeps the allocator's locks busy must neither hang nor break
 * the heap, in parent or child, nor keep that thread waiting. Exit 0 on success; a hang
 * ends in SIGALRM. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static atomic_bool stop;
extern atomic_ulong fork_handlers_progress;
extern int fork_handlers_nested_failures, fork_handlers_blocked;

static void *churn(void *arg) {
  while (!atomic_load(&stop)) {
    free(malloc(100000));   /* a span: the arena lock */
    atomic_fetch_add(&fork_handlers_progress, 1);
    free(malloc(2 << 20));  /* a mapping: the large-block cache's lock */
    free(malloc(64));
  }
  return arg;
}

int main(void) {
  alarm(50);
  pthread_t t;
  if (pthread_create(&t, NULL, churn, NULL)) return 1;
  for (int i = 0; i < 50; i++) {
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
      char *p = malloc(500000);
      if (!p) _exit(2);
      memset(p, 3, 500000);
      free(p);
      _exit(0);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
      printf("FAIL: child %d ended with status %#x\n", i, status);
      return 1;
    }
  }
  atomic_store(&stop, true);
  pthread_join(t, NULL);
  if (fork_handlers_nested_failures) {
    puts("FAIL: the child of a fork inside another fork's handlers failed");
    return 1;
  }
  if (fork_handlers_blocked) {
    puts("FAIL: a thread could not allocate while a fork's handlers ran");
    return 1;
  }
  puts("50 forks with early fork handlers that allocate");
  return 0;
}
