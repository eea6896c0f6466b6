/* The heap's figures of stats.h. */
#include "stats.h"

#include <errno.h>

#include "arena.h"
#include "diag.h"
#include "init.h"
#include "mapped.h"

struct mallinfo2 stats_mallinfo2(void) {
  struct mallinfo2 info = {0};
  if (!init_process()) return info;
  mapped_live(&info.hblks, &info.hblkhd);
  info.uordblks = arena_used_bytes() + info.hblkhd;
  info.arena = os_mapped_bytes();
  info.fordblks = info.arena > info.uordblks ? info.arena - info.uordblks : 0;
  return info;
}

void stats_print(void) {
  struct mallinfo2 info = stats_mallinfo2();
  char line[128];
  diag_text t = diag_text_in(line, sizeof line);
  diag_append(&t, "fastmalloc: mapped bytes = ");
  diag_append_u64(&t, info.arena, 10);
  diag_append(&t, ", in use bytes = ");
  diag_append_u64(&t, info.uordblks, 10);
  diag_append(&t, "\n");
  diag_finish(&t);
  diag_print(line);
}

/* The caller's stream may allocate its buffer: that re-enters malloc outside any lock. */
int stats_print_xml(int options, FILE *stream) {
  if (options != 0) return EINVAL;
  char text[160];
  diag_text t = diag_text_in(text, sizeof text);
  diag_append(&t, "<malloc version=\"fastmalloc-1\">\n<system type=\"current\" size=\"");
  diag_append_u64(&t, os_mapped_bytes(), 10);
  diag_append(&t, "\"/>\n</malloc>\n");
  diag_finish(&t);
  return fputs(text, stream) < 0 ? -1 : 0;
}
