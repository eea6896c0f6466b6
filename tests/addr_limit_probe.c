/* Run under an address-space limit (ulimit -v 1000000) far smaller than the unit map's
 * usual 2 GiB reservation, so fastmalloc falls back to a windowed unit map. Small, span and
 * mapped blocks must all work there; a request beyond the limit must answer NULL with
 * ENOMEM; a stack pointer must not be taken for a block. Exit 0 on success. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastmalloc.h"

static int fail(const char *what, size_t n) {
  printf("FAIL: %s (size %zu, errno %d)\n", what, n, errno);
  return 1;
}

int main(void) {
  for (unsigned i = 0; i < 2000; i++) {
    size_t n = 16 + (size_t)i * 97 % 70000;   /* small classes, spans and mapped blocks */
    char *p = malloc(n);
    if (!p) return fail("malloc", n);
    if (!fm_owns(p)) return fail("a block not from fastmalloc", n);
    memset(p, (int)i, n);
    char *q = realloc(p, n * 2);
    if (!q) return fail("realloc", n * 2);
    if (q[n - 1] != (char)i) return fail("realloc lost the contents", n * 2);
    free(q);
  }
  size_t big = (size_t)256 << 20;   /* well inside the limit */
  char *p = malloc(big);
  if (!p) return fail("malloc", big);
  memset(p, 1, big);
  free(p);
  size_t too_big = (size_t)2 << 30;   /* over the limit */
  errno = 0;
  if (malloc(too_big) || errno != ENOMEM) return fail("malloc over the limit", too_big);
  int local;
  if (fm_owns(&local)) return fail("fm_owns(stack pointer)", 0);
  puts("every request within the limit worked");
  return 0;
}
