/* A library that registers fork handlers in its constructor, before fastmalloc's first
 * malloc registers its own (as OpenBLAS does, say): glibc then runs its prepare handler
 * after fastmalloc's, which holds every allocator lock by then, and its child handler
 * before fastmalloc's, which resets them. Both handlers allocate past the thread cache:
 * a span block and a mapped one. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static void *kept;

static void allocate(void) {
  char *span = malloc(200000), *mapped = malloc(3 << 20);
  if (!span || !mapped) abort();
  memset(span, 1, 200000);
  memset(mapped, 2, 4096);
  free(span);
  free(kept);
  kept = mapped;
}

__attribute__((constructor)) static void register_handlers(void) {
  pthread_atfork(allocate, allocate, allocate);
}
