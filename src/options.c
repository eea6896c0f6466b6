/* Parsing of the FASTMALLOC_* settings listed in options.h. */
#include "options.h"

#include "diag.h"
#include "fastmalloc.h"
#include "os.h"

#define PURGE_DELAY_DEFAULT_MS 100
#define TCACHE_MAX_DEFAULT ((size_t)4 << 20)

options_t options = {
    .purge_delay_ns = PURGE_DELAY_DEFAULT_MS * 1000000ull,
    .tcache_max_bytes = TCACHE_MAX_DEFAULT,
    .huge_pages = true,
};

/* Longer delays mean "never" and count as this (about 35 years): the clock arithmetic on
 * them cannot overflow. */
#define PURGE_DELAY_MAX_MS ((uint64_t)1 << 40)

/* "123", "64K", "2M", "1G": returns false on anything else (a bare suffix included).
 * Values beyond 64 bits saturate: each setting caps its own value anyway. */
static bool parse_size(const char *text, uint64_t *out) {
  const char *digits = text;
  uint64_t value = 0;
  for (; *text >= '0' && *text <= '9'; text++)
    value = value > (UINT64_MAX - 9) / 10 ? UINT64_MAX : value * 10 + (uint64_t)(*text - '0');
  if (text == digits) return false;
  unsigned shift = 0;
  switch (*text) {
    case 0: break;
    case 'k': case 'K': shift = 10; text++; break;
    case 'm': case 'M': shift = 20; text++; break;
    case 'g': case 'G': shift = 30; text++; break;
    default: return false;
  }
  if (*text) return false;
  *out = value > (UINT64_MAX >> shift) ? UINT64_MAX : value << shift;
  return true;
}

/* "fastmalloc: NAME=VALUE ignored (expected WHAT); the default, KEPT, stays in force". */
static void warn(const char *name, const char *value, const char *expected, const char *kept) {
  char line[256];
  diag_text t = diag_text_in(line, sizeof line);
  diag_append(&t, "fastmalloc: ");
  diag_append(&t, name);
  diag_append(&t, "=");
  diag_append(&t, value);
  diag_append(&t, " ignored (expected ");
  diag_append(&t, expected);
  diag_append(&t, "); the default, ");
  diag_append(&t, kept);
  diag_append(&t, ", stays in force\n");
  diag_finish(&t);
  diag_print(line);
}

/* A setting's value: *value set and true when present and well formed (at least `least`). */
static bool read_size(const char *name, uint64_t least, const char *expected, const char *kept,
                      uint64_t *value) {
  const char *text = os_getenv(name);
  if (!text) return false;
  if (parse_size(text, value) && *value >= least) return true;
  warn(name, text, expected, kept);
  return false;
}

static bool read_switch(const char *name, bool *on) {
  const char *text = os_getenv(name);
  if (!text) return false;
  if ((text[0] == '0' || text[0] == '1') && !text[1]) {
    *on = text[0] == '1';
    return true;
  }
  warn(name, text, "0 or 1", *on ? "1" : "0");
  return false;
}

void options_init(void) {
  uint64_t value;
  if (read_size("FASTMALLOC_PURGE_DELAY_MS", 0, "milliseconds", "100", &value))
    options.purge_delay_ns = (value < PURGE_DELAY_MAX_MS ? value : PURGE_DELAY_MAX_MS) * 1000000;
  if (read_size("FASTMALLOC_TCACHE_MAX", 0, "bytes, with K, M or G", "4M", &value))
    options.tcache_max_bytes = value;
  if (read_size("FASTMALLOC_ARENAS", 1, "a count from 1", "one per CPU", &value))
    options.arenas = value < FM_ARENAS_MAX ? (unsigned)value : FM_ARENAS_MAX;
  read_switch("FASTMALLOC_STATS", &options.stats);
  read_switch("FASTMALLOC_VERBOSE", &options.verbose);
  read_switch("FASTMALLOC_PURGE_THREAD", &options.purge_thread);
  read_switch("FASTMALLOC_HUGE_PAGES", &options.huge_pages);
}

void options_print(unsigned arena_count) {
  char line[320];
  diag_text t = diag_text_in(line, sizeof line);
  diag_append(&t, "fastmalloc " FASTMALLOC_VERSION_STRING ": purge delay ");
  diag_append_u64(&t, options.purge_delay_ns / 1000000, 10);
  diag_append(&t, " ms, thread cache ");
  diag_append_u64(&t, options.tcache_max_bytes, 10);
  diag_append(&t, " bytes, arenas ");
  diag_append_u64(&t, arena_count, 10);
  diag_append(&t, FM_FREE_MARK ? ", double-free check on" : ", double-free check off");
  diag_append(&t, FM_SINGLE_THREAD_FLAG ? ", single-threaded switch on" : ", single-threaded switch off");
  diag_append(&t, options.purge_thread ? ", purge thread" : "");
  diag_append(&t, options.huge_pages ? ", huge pages for big blocks" : ", no huge pages");
  diag_append(&t, options.stats ? ", statistics at exit\n" : "\n");
  diag_finish(&t);
  diag_print(line);
}
