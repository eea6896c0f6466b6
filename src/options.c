/* Parsing of the FASTMALLOC_* environment variables listed in options.h. */
#include "options.h"

#include "os.h"

options_t options = {
    .purge_delay_ns = 100ull * 1000 * 1000,
    .tcache_max_bytes = (size_t)4 << 20,
};

/* Longer delays mean "never" and count as this (about 35 years): the clock arithmetic on
 * them cannot overflow. */
#define PURGE_DELAY_MAX_MS ((uint64_t)1 << 40)

/* "123", "64K", "2M", "1G": returns false on anything else (a bare suffix included).
 * Values beyond 64 bits saturate: each knob caps its own value anyway. */
static bool parse_size(const char *text, uint64_t *out) {
  if (!text) return false;
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

void options_init(void) {
  uint64_t value;
  if (parse_size(os_getenv("FASTMALLOC_PURGE_DELAY_MS"), &value))
    options.purge_delay_ns = (value < PURGE_DELAY_MAX_MS ? value : PURGE_DELAY_MAX_MS) * 1000000;
  if (parse_size(os_getenv("FASTMALLOC_TCACHE_MAX"), &value)) options.tcache_max_bytes = value;
  if (parse_size(os_getenv("FASTMALLOC_ARENAS"), &value) && value >= 1)
    options.arenas = value < UINT32_MAX ? (unsigned)value : UINT32_MAX;   /* arenas cap it */
}
