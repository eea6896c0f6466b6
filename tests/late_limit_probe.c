/* An address-space limit set after fastmalloc's set-up (setrlimit in main, as a program
 * that caps itself does), far below the unit map's 2 GiB reservation: the map narrows to a
 * window, moved to a quiet part of the address space, and blocks of every kind, new
 * mappings included, keep coming. Exit 0 on success. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "fastmalloc.h"
#include "unit_map_place.h"

/* The unit map's 2 GiB reservation: the anonymous mappings around its largest read-only
 * piece (the pages holding entries are read-write and split it). */
static bool find_reservation(unsigned long *lo, unsigned long *hi) {
  FILE *maps = fopen("/proc/self/maps", "r");
  if (!maps) return false;
  unsigned long starts[4096], ends[4096];
  bool anon_rx[4096];
  int n = 0, biggest = -1;
  char line[512];
  while (n < 4096 && fgets(line, sizeof line, maps)) {
    char perms[8];
    unsigned long inode;
    if (sscanf(line, "%lx-%lx %7s %*s %*s %lu", &starts[n], &ends[n], perms, &inode) != 4) continue;
    anon_rx[n] = inode == 0 && (strcmp(perms, "r--p") == 0 || strcmp(perms, "rw-p") == 0);
    if (anon_rx[n] && perms[1] == '-' && (biggest < 0 || ends[n] - starts[n] > ends[biggest] - starts[biggest]))
      biggest = n;
    n++;
  }
  fclose(maps);
  if (biggest < 0 || ends[biggest] - starts[biggest] < (1ul << 30)) return false;
  int first = biggest, last = biggest;
  while (first > 0 && anon_rx[first - 1] && ends[first - 1] == starts[first]) first--;
  while (last + 1 < n && anon_rx[last + 1] && starts[last + 1] == ends[last]) last++;
  *lo = starts[first];
  *hi = ends[last];
  return true;
}

/* Whether an anonymous read-only mapping (a page of the map never written) lies in [lo, hi). */
static bool read_only_left_in(unsigned long lo, unsigned long hi) {
  FILE *maps = fopen("/proc/self/maps", "r");
  char line[512];
  bool left = false;
  while (maps && !left && fgets(line, sizeof line, maps)) {
    unsigned long start, end, inode;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s %*s %*s %lu", &start, &end, perms, &inode) != 4) continue;
    left = inode == 0 && strcmp(perms, "r--p") == 0 && start < hi && end > lo;
  }
  if (maps) fclose(maps);
  return left;
}

int main(void) {
  char *early = malloc(100);   /* set-up, without a limit: the whole unit map */
  if (!early) return 1;
  memset(early, 1, 100);
  unsigned long reserved_lo, reserved_hi;
  if (!find_reservation(&reserved_lo, &reserved_hi)) {
    puts("FAIL: no 2 GiB unit-map reservation found before the limit");
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
  /* The narrowed map moved to a quiet place (its window starts at 16, 32 or 48 TiB), so a
   * foreign pointer's entry is not read in the holes it gave back. */
  if (!unit_map_in_quiet_place()) {
    puts("FAIL: the narrowed unit map did not move to a quiet place");
    return 1;
  }
  if (read_only_left_in(reserved_lo, reserved_hi)) {
    puts("FAIL: part of the old unit map stayed mapped after the move");
    return 1;
  }
  free(NULL);   /* its entry now in the moved map's zero page */
  if (early[99] != 1) return 1;
  free(early);
  int local;
  if (fm_owns(&local)) return 1;
  puts("every request under a limit set after set-up worked");
  return 0;
}
