/* Run as `huge_pages_probe on` (the default settings) or `huge_pages_probe off` (with
 * FASTMALLOC_HUGE_PAGES=0): which mappings ask for transparent huge pages, read from the
 * VmFlags of /proc/self/smaps ("hg": MADV_HUGEPAGE). A program's first 80 MiB block finds
 * less than 64 MiB mapped, so it does not ask; an 8 MiB block mapped after it does when on;
 * an 8 MiB calloc never does (its pages stay out of RSS until written). On a kernel
 * without transparent huge pages no mapping can carry the flag, and none is expected to.
 * Exit 0 on success. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

/* Whether the mapping that holds p asks for huge pages; exits when none holds it. */
static bool asks_for_huge_pages(const void *p) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) {
    printf("FAIL: cannot read /proc/self/smaps\n");
    exit(1);
  }
  char line[512];
  bool inside = false;
  while (fgets(line, sizeof line, f)) {
    unsigned long start, end;
    char dash;
    if (sscanf(line, "%lx%c%lx ", &start, &dash, &end) == 3 && dash == '-') {
      inside = (unsigned long)p >= start && (unsigned long)p < end;
    } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
      fclose(f);
      return strstr(line, " hg") != NULL;
    }
  }
  fclose(f);
  printf("FAIL: no mapping holds %p\n", p);
  exit(1);
}

static int check(const char *what, const void *p, bool expected) {
  bool got = asks_for_huge_pages(p);
  printf("%s: %s huge pages%s\n", what, got ? "asks for" : "does not ask for",
         got == expected ? "" : " (FAIL)");
  return got == expected ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc != 2 || (strcmp(argv[1], "on") && strcmp(argv[1], "off"))) {
    printf("usage: huge_pages_probe on|off\n");
    return 2;
  }
  bool thp = access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0;
  bool on = strcmp(argv[1], "on") == 0 && thp;
  if (!thp) printf("kernel without transparent huge pages: no mapping can ask for them\n");
  char *first = malloc(80 * MIB), *big = malloc(8 * MIB), *zeroed = calloc(1, 8 * MIB);
  if (!first || !big || !zeroed) {
    printf("FAIL: out of memory\n");
    return 1;
  }
  int failures = check("first 80 MiB block", first, false) + check("8 MiB block", big, on) +
                 check("8 MiB calloc", zeroed, false);
  free(first);
  free(big);
  free(zeroed);
  return failures ? 1 : 0;
}
