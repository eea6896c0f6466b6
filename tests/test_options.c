/* White-box test of src/options.c, built from the allocator's objects: each FASTMALLOC_*
 * variable takes digits with an optional K/M/G suffix, saturates what overflows (each knob
 * caps its own value), and leaves the default for anything else. options_init() runs
 * again here after setenv; the allocator of this process keeps working meanwhile. */
#include "fm_test.h"

#include "options.h"

static const options_t defaults = {.purge_delay_ns = 100ull * 1000 * 1000,
                                      .tcache_max_bytes = (size_t)4 << 20, .huge_pages = true};

/* The options after setting `name` to `value` (the others unset). */
static options_t options_with(const char *name, const char *value) {
  unsetenv("FASTMALLOC_PURGE_DELAY_MS");
  unsetenv("FASTMALLOC_TCACHE_MAX");
  unsetenv("FASTMALLOC_ARENAS");
  unsetenv("FASTMALLOC_HUGE_PAGES");
  if (value) setenv(name, value, 1);
  options = defaults;
  options_init();
  options_t got = options;
  unsetenv(name);
  options = defaults;
  return got;
}

static void test_purge_delay(void **state) {
  const uint64_t ms = 1000 * 1000, max = ((uint64_t)1 << 40) * ms;
  const struct { const char *text; uint64_t ns; } cases[] = {
      {"0", 0},          {"250", 250 * ms},   {"2K", 2048 * ms},  {"1M", ((uint64_t)1 << 20) * ms},
      {"99999999999999999999", max},          {"17179869184G", max},
      {"", defaults.purge_delay_ns},          {"K", defaults.purge_delay_ns},
      {"-1", defaults.purge_delay_ns},        {"12x", defaults.purge_delay_ns},
      {"1KB", defaults.purge_delay_ns},       {" 5", defaults.purge_delay_ns}};
  for (unsigned i = 0; i < sizeof cases / sizeof *cases; i++) {
    uint64_t got = options_with("FASTMALLOC_PURGE_DELAY_MS", cases[i].text).purge_delay_ns;
    if (got != cases[i].ns)
      fail_msg("FASTMALLOC_PURGE_DELAY_MS=\"%s\": %llu ns, expected %llu", cases[i].text,
               (unsigned long long)got, (unsigned long long)cases[i].ns);
  }
}

static void test_tcache_max(void **state) {
  const struct { const char *text; size_t bytes; } cases[] = {
      {"0", 0},           {"64k", 65536},   {"2M", (size_t)2 << 20},   {"1g", (size_t)1 << 30},
      {"99999999999999999999", SIZE_MAX},   {"g", defaults.tcache_max_bytes},
      {"4MB", defaults.tcache_max_bytes},   {"", defaults.tcache_max_bytes}};
  for (unsigned i = 0; i < sizeof cases / sizeof *cases; i++) {
    size_t got = options_with("FASTMALLOC_TCACHE_MAX", cases[i].text).tcache_max_bytes;
    if (got != cases[i].bytes)
      fail_msg("FASTMALLOC_TCACHE_MAX=\"%s\": %zu, expected %zu", cases[i].text, got,
               cases[i].bytes);
  }
}

static void test_arenas(void **state) {
  const struct { const char *text; unsigned arenas; } cases[] = {
      {"1", 1}, {"64", 64}, {"65", 64}, {"99999999999999999999", 64},
      {"0", 0}, {"K", 0},   {"two", 0}, {NULL, 0}};   /* 0: one arena per CPU */
  for (unsigned i = 0; i < sizeof cases / sizeof *cases; i++) {
    unsigned got = options_with("FASTMALLOC_ARENAS", cases[i].text).arenas;
    if (got != cases[i].arenas)
      fail_msg("FASTMALLOC_ARENAS=\"%s\": %u, expected %u",
               cases[i].text ? cases[i].text : "(unset)", got, cases[i].arenas);
  }
}

static void test_huge_pages(void **state) {
  const struct { const char *text; bool on; } cases[] = {
      {"0", false}, {"1", true}, {"yes", true}, {"00", true}, {"", true}, {NULL, true}};
  for (unsigned i = 0; i < sizeof cases / sizeof *cases; i++) {
    bool got = options_with("FASTMALLOC_HUGE_PAGES", cases[i].text).huge_pages;
    if (got != cases[i].on)
      fail_msg("FASTMALLOC_HUGE_PAGES=\"%s\": %d, expected %d",
               cases[i].text ? cases[i].text : "(unset)", got, cases[i].on);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_purge_delay),
      cmocka_unit_test(test_tcache_max),
      cmocka_unit_test(test_arenas),
      cmocka_unit_test(test_huge_pages),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
