/* The size-class tables: block size per class, and class per 16-byte granule of a
 * request and per request size. The class tables are derived from size_class_formula at
 * start-up. */
#include "size_class.h"

uint8_t size_class_of_granule[(FM_SMALL_MAX >> 4) + 1];
uint8_t size_class_of_size[FM_TABLED_MAX + 1];

/* Class c >= 9 is 2^b + (k + 1) * 2^(b - 2) with b = 7 + (c - 9) / 4, k = (c - 9) % 4. */
#define FM_GEOMETRIC(c) \
  ((1u << (7 + ((c) - 9) / 4)) + (((c) - 9) % 4 + 1) * (1u << (5 + ((c) - 9) / 4)))
#define FM_ROW2(c) FM_GEOMETRIC(c), FM_GEOMETRIC(c + 1)
#define FM_ROW4(c) FM_ROW2(c), FM_ROW2(c + 2)

#define FM_TWIN_SIZES 1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192

const uint32_t size_class_size[FM_BINS] = {
    0,   16,  32,  48,  64,  80,  96,  112, 128,
    FM_ROW4(9),  FM_ROW4(13), FM_ROW4(17), FM_ROW4(21), FM_ROW4(25), FM_ROW4(29),
    FM_ROW2(33),  FM_TWIN_SIZES,
    0, 0, 0, 0, /* the markers */
};

/* Padded: a multiple of 1 KiB (see size_class.h). */
#define FM_PADDED(s) ((s) % 1024 == 0 ? (s) + 64 : (s))
#define FM_SROW2(c) FM_PADDED(FM_GEOMETRIC(c)), FM_PADDED(FM_GEOMETRIC(c + 1))
#define FM_SROW4(c) FM_SROW2(c), FM_SROW2(c + 2)

const uint32_t size_class_stride[FM_BINS] = {
    0,   16,  32,  48,  64,  80,  96,  112, 128,
    FM_SROW4(9),  FM_SROW4(13), FM_SROW4(17), FM_SROW4(21), FM_SROW4(25), FM_SROW4(29),
    FM_SROW2(33), FM_TWIN_SIZES,
    0, 0, 0, 0,
};
_Static_assert(FM_GEOMETRIC(FM_NUM_CLASSES) == FM_SMALL_MAX, "last class is FM_SMALL_MAX");

void size_class_init(void) {
  for (size_t g = 0; g <= FM_SMALL_MAX >> 4; g++) {
    unsigned cls = size_class_formula(g << 4);
    fm_assert(cls >= 1 && cls <= FM_NUM_CLASSES && size_class_size[cls] >= (g << 4));
    fm_assert(cls == 1 || size_class_size[cls - 1] < (g << 4));
    size_class_of_granule[g] = (uint8_t)cls;
  }
  for (size_t size = 0; size <= FM_TABLED_MAX; size++)
    size_class_of_size[size] = (uint8_t)size_class_of(size);
}

static unsigned twin_of(unsigned cls) {
  for (unsigned twin = FM_NUM_CLASSES + 1; twin <= FM_NUM_SPAN_CLASSES; twin++)
    if (size_class_size[twin] == size_class_size[cls]) return twin;
  return 0;
}

unsigned size_class_aligned(size_t size, size_t align) {
  if (size > FM_SMALL_MAX || align > FM_SMALL_MAX) return 0;
  /* A span's first block is aligned to the largest power of two that divides the stride
   * (its colour keeps that, see chunk.c), so a class whose stride is a multiple of align
   * has every block aligned. */
  for (unsigned cls = size_class_formula(size < align ? align : size);
       cls <= FM_NUM_CLASSES; cls++) {
    if (size_class_stride[cls] % align == 0) return cls;
    if (size_class_size[cls] % align == 0) return twin_of(cls);
  }
  return 0;
}
