/* What fastmalloc says when something is wrong: the one-line fatal report of a misuse it
 * detected (each message defined here, once), the Debug build's assertion failures, and
 * the bounded text formatting they need. It writes with write(2) and never allocates. */
#ifndef FM_DIAG_H
#define FM_DIAG_H

#include "config.h"

/* The misuses fastmalloc reports: "fastmalloc: <message> 0x<pointer>", then abort(). */
#define DIAG_REPORTS(X)                                                            \
  X(DIAG_INVALID_FREE, "free(): invalid pointer")                                  \
  X(DIAG_DOUBLE_FREE, "free(): double free detected")                              \
  X(DIAG_FREE_BLOCK_CORRUPTED, "double free or corruption of a free block")        \
  X(DIAG_INVALID_REALLOC, "realloc(): invalid pointer")                            \
  X(DIAG_INVALID_USABLE_SIZE, "malloc_usable_size(): invalid pointer")             \
  X(DIAG_MOVED_BLOCK_LOST, "realloc(): cannot register a moved block")            \
  X(DIAG_CXX_NEW_FAILED, "operator new: out of memory, and no C++ runtime to throw")

typedef enum {
#define DIAG_ENUM(name, text) name,
  DIAG_REPORTS(DIAG_ENUM)
#undef DIAG_ENUM
} diag_report;

__attribute__((noreturn, cold)) void diag_fatal(diag_report what, const void *p);

/* The per-process random key behind the checks of freed small blocks (tcache.h) and of
 * mapped blocks' headers (mapped.c): a program's data matches it by chance only. Set once
 * at set-up, never 0, kept by a fork child. */
extern fm_hidden uintptr_t diag_key;

/* Writes a NUL-terminated text to stderr, whole. */
void diag_print(const char *text);

/* Text built into a fixed buffer, never past its end (what does not fit is cut). */
typedef struct diag_text {
  char *at, *end;   /* end: the last byte, kept for the NUL */
} diag_text;

static inline diag_text diag_text_in(char *buf, size_t size) { return (diag_text){buf, buf + size - 1}; }
void diag_append(diag_text *t, const char *s);
void diag_append_u64(diag_text *t, uint64_t value, unsigned base);
void diag_finish(diag_text *t);   /* terminates the text */

#endif
