/* For the probes that run under an address-space limit: where the windowed unit map lies.
 * (Plain C, no cmocka: the probes are programs of their own.) */
#ifndef FM_UNIT_MAP_PLACE_H
#define FM_UNIT_MAP_PLACE_H

#include <stdbool.h>
#include <stdio.h>

/* Whether a mapping starts at one of the quiet places src/chunk.c puts a windowed map in
 * (16, 32 or 48 TiB): a foreign pointer's entry is then read in unmapped space. */
static inline bool unit_map_in_quiet_place(void) {
  FILE *maps = fopen("/proc/self/maps", "r");
  char line[512];
  bool found = false;
  while (maps && !found && fgets(line, sizeof line, maps)) {
    unsigned long start;   /* (the pages made writable split the map into several lines) */
    found = sscanf(line, "%lx-", &start) == 1 &&
            (start == 0x100000000000ul || start == 0x200000000000ul || start == 0x300000000000ul);
  }
  if (maps) fclose(maps);
  return found;
}

#endif
