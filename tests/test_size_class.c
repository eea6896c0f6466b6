/* White-box test of src/size_class.h, built from the allocator's objects: the class sizes
 * are those of docs/design.md ("Memory layout"), the lookup tables agree with the formula
 * for every size 0 .. FM_SMALL_MAX (the size-indexed one up to FM_TABLED_MAX), and each
 * answer is the smallest class that fits (and aligns). */
#include "fm_test.h"

#include "size_class.h"

static void test_class_sizes_match_design(void **state) {
  size_t expect[FMT_MAX_CLASSES];
  unsigned n = fmt_class_sizes(expect);
  assert_int_equal(FM_NUM_CLASSES, n);
  for (unsigned c = 1; c <= FM_NUM_CLASSES; c++)
    if (size_class_size[c] != expect[c - 1])
      fail_msg("class %u has size %u, expected %zu", c, (unsigned)size_class_size[c],
               expect[c - 1]);
  assert_int_equal(size_class_size[FM_NUM_CLASSES], FM_SMALL_MAX);
}

static void test_table_matches_formula(void **state) {
  for (size_t s = 0; s <= FM_SMALL_MAX; s++)
    if (size_class_of(s) != size_class_formula(s))
      fail_msg("size %zu: table says class %u, formula %u", s, size_class_of(s),
               size_class_formula(s));
}

/* malloc's fast path reads the size-indexed table up to FM_TABLED_MAX. */
static void test_size_table_matches_formula(void **state) {
  for (size_t s = 0; s <= FM_TABLED_MAX; s++)
    if (size_class_of_size[s] != size_class_formula(s))
      fail_msg("size %zu: size table says class %u, formula %u", s,
               (unsigned)size_class_of_size[s], size_class_formula(s));
}

static void test_smallest_fitting_class(void **state) {
  for (size_t s = 0; s <= FM_SMALL_MAX; s++) {
    unsigned c = size_class_of(s);
    if (c < 1 || c > FM_NUM_CLASSES) fail_msg("size %zu: class %u out of range", s, c);
    if (size_class_size[c] < s)
      fail_msg("size %zu: class %u holds only %u", s, c, (unsigned)size_class_size[c]);
    if (c > 1 && size_class_size[c - 1] >= s)
      fail_msg("size %zu: class %u is not the smallest", s, c);
  }
}

/* Padded classes (multiples of 1 KiB) have a stride of size + 64, and those up to 8 KiB an
 * unpadded twin after the malloc classes; the other classes' stride is their size. */
static void test_strides(void **state) {
  unsigned twins = 0;
  for (unsigned c = 1; c <= FM_NUM_CLASSES; c++) {
    uint32_t size = size_class_size[c];
    bool padded = size % 1024 == 0;
    assert_int_equal(size_class_stride[c], padded ? size + 64 : size);
    if (!padded || size > 8192) continue;
    twins++;
    assert_int_equal(size_class_size[FM_NUM_CLASSES + twins], size);
    assert_int_equal(size_class_stride[FM_NUM_CLASSES + twins], size);
  }
  assert_int_equal(twins, FM_NUM_TWINS);
}

/* End to end: blocks of the padded 4 KiB class land at the padded stride, so they spread
 * over the L1 sets instead of all sharing the set of a page's first line. */
static void test_padded_blocks_spread(void **state) {
  enum { N = 32 };
  char *p[N];
  bool set_used[64] = {false};
  unsigned sets = 0;
  for (int i = 0; i < N; i++) {
    p[i] = malloc(4096);
    assert_true(p[i] && fm_owns(p[i]));
    unsigned set = (unsigned)((uintptr_t)p[i] >> 6) & 63;
    if (!set_used[set]) set_used[set] = true, sets++;
  }
  for (int i = 1; i < N; i++) {
    uintptr_t a = (uintptr_t)p[i - 1], b = (uintptr_t)p[i];
    uintptr_t gap = a > b ? a - b : b - a;
    if ((a ^ b) >> FM_UNIT_SHIFT == 0 && gap % (4096 + 64) != 0)
      fail_msg("blocks %p and %p of one span are %zu apart", p[i - 1], p[i], (size_t)gap);
  }
  if (sets < 8) fail_msg("%d blocks of 4 KiB use only %u cache sets", N, sets);
  for (int i = 0; i < N; i++) free(p[i]);
}

static void test_aligned_class(void **state) {
  for (size_t a = 16; a <= 32768; a *= 2)
    for (size_t s = 0; s <= FM_SMALL_MAX; s++) {
      unsigned best = 0;
      for (unsigned c = 1; c <= FM_NUM_SPAN_CLASSES; c++) {
        if (size_class_size[c] < s || size_class_stride[c] % a != 0) continue;
        if (!best || size_class_size[c] < size_class_size[best]) best = c;
      }
      unsigned got = size_class_aligned(s, a);
      if (got != best)
        fail_msg("size %zu align %zu: class %u, the smallest aligned fit is %u", s, a, got, best);
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_class_sizes_match_design),
      cmocka_unit_test(test_table_matches_formula),
      cmocka_unit_test(test_size_table_matches_formula),
      cmocka_unit_test(test_smallest_fitting_class),
      cmocka_unit_test(test_strides),
      cmocka_unit_test(test_padded_blocks_spread),
      cmocka_unit_test(test_aligned_class),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
