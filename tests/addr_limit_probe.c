/* Run under an address-space limit smaller than fastmalloc's unit-map reservation: every
 * allocation must either work or answer NULL with ENOMEM — never crash, abort, or hand out
 * memory that is not writable. Exit 0 on success; prints how many requests failed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
  unsigned failed = 0;
  for (unsigned i = 0; i < 2000; i++) {
    size_t n = 16 + (size_t)i * 97 % 70000;
    errno = 0;
    char *p = malloc(n);
    if (!p) {
      if (errno != ENOMEM) return 2;
      failed++;
      continue;
    }
    memset(p, (int)i, n);
    char *q = realloc(p, n * 2);
    if (q) p = q;
    free(p);
  }
  printf("%u of 2000 allocations answered ENOMEM\n", failed);
  return 0;
}
