/* Run under valgrind's memcheck by the valgrind test, linked with libfastmalloc.so or with
 * libfastmalloc.a. MODE clean frees all it allocates; leak, overflow and double-free each
 * make one error memcheck must report. Prints whether malloc's blocks are fastmalloc's:
 * under memcheck they must not be (memcheck's own malloc replaces fastmalloc's). */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fastmalloc.h>

/* Past the end of a 100-byte block, through a variable so the compiler cannot see it. */
static volatile size_t past_end = 100;

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "clean";
  char *p = malloc(100);
  if (!p) return 1;
  memset(p, 'x', 100);
  printf("malloc's blocks are fastmalloc's: %s\n", fm_owns(p) ? "yes" : "no");

  /* Every allocation function once, all freed. */
  char *c = calloc(10, 10), *s = strdup("a string"), *r = realloc(malloc(10), 5000);
  void *a = aligned_alloc(64, 128), *m = memalign(4096, 100), *pm = NULL;
  if (!c || !s || !r || !a || !m || posix_memalign(&pm, 32, 200) != 0) return 1;
  free(c);
  free(s);
  free(r);
  free(a);
  free(m);
  free(pm);

  if (strcmp(mode, "leak") == 0) {
    p = NULL;   /* the 100-byte block is lost */
  } else if (strcmp(mode, "overflow") == 0) {
    p[past_end] = 'y';
  } else if (strcmp(mode, "double-free") == 0) {
    free(p);
  }
  free(p);
  puts("done");
  return 0;
}
