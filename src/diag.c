/* The fatal reports and assertion failures of diag.h, and their formatting. */
#include "diag.h"

#include <string.h>

#include "os.h"

uintptr_t diag_key;

static const char *const report_text[] = {
#define DIAG_TEXT(name, text) text,
    DIAG_REPORTS(DIAG_TEXT)
#undef DIAG_TEXT
};

void diag_print(const char *text) { os_write_stderr(text, strlen(text)); }

void diag_append(diag_text *t, const char *s) {
  while (*s && t->at < t->end) *t->at++ = *s++;
}

void diag_append_u64(diag_text *t, uint64_t value, unsigned base) {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = "0123456789abcdef"[value % base];
    value /= base;
  } while (value);
  while (n && t->at < t->end) *t->at++ = digits[--n];
}

void diag_finish(diag_text *t) { *t->at = 0; }

void diag_fatal(diag_report what, const void *p) {
  char line[160];
  diag_text t = diag_text_in(line, sizeof line);
  diag_append(&t, "fastmalloc: ");
  diag_append(&t, report_text[what]);
  if (p) {
    diag_append(&t, " 0x");
    diag_append_u64(&t, (uintptr_t)p, 16);
  }
  diag_append(&t, "\n");
  diag_finish(&t);
  diag_print(line);
  os_abort();
}

void diag_assert_failed(const char *what, const char *file, int line) {
  char text[512];
  diag_text t = diag_text_in(text, sizeof text);
  diag_append(&t, "fastmalloc: assertion failed: ");
  diag_append(&t, what);
  diag_append(&t, " at ");
  diag_append(&t, file);
  diag_append(&t, ":");
  diag_append_u64(&t, (uint64_t)line, 10);
  diag_append(&t, "\n");
  diag_finish(&t);
  diag_print(text);
  os_abort();
}
