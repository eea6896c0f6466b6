/* Resident set size in bytes, from /proc/self/statm, read without allocating (so it
 * disturbs no heap it measures); 0 when it cannot be read. For the cmocka suites
 * (fm_test.h) and the probes that run without cmocka. */
#ifndef FM_PROBE_RSS_H
#define FM_PROBE_RSS_H

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

static inline size_t probe_rss(void) {
  char text[128];
  int fd = open("/proc/self/statm", O_RDONLY);
  if (fd < 0) return 0;
  ssize_t len = read(fd, text, sizeof text - 1);
  close(fd);
  if (len <= 0) return 0;
  text[len] = 0;
  unsigned long size_pages, rss_pages;
  if (sscanf(text, "%lu %lu", &size_pages, &rss_pages) != 2) return 0;
  return (size_t)rss_pages * (size_t)sysconf(_SC_PAGESIZE);
}

#endif
