/* Size classes: 16-byte steps to 128 bytes, then 4 classes per power of two up to 8 KiB,
 * and 10 and 12 KiB (blocks of up to three pages, which whole pages would round up most).
 * Class 0 and the markers are never cached: the unit map stores them for "not ours",
 * "large block in a chunk span", "blocks of whole pages" (12-64 KiB, see arena.h), "large
 * block in its own mapping" and "a thread cache's bins", and their tcache bins are always
 * full, so free() reaches its slow path without a test. */
#ifndef FM_SIZE_CLASS_H
#define FM_SIZE_CLASS_H

#include "config.h"

#define FM_SMALL_MAX 12288u                   /* largest size served by a size class */
#define FM_NUM_CLASSES 34                     /* classes malloc picks by size: 1 .. 34 */
/* Blocks whose size is a multiple of 1 KiB would all start at the same few offsets of a
 * page, so they would compete for the same few sets of the L1 cache: 25 blocks of 4 KiB
 * in a loop miss on every access. Those classes (1..12 KiB) are laid out with a stride of
 * size + 64, which spreads blocks over every set; the unpadded twins of those up to 8 KiB
 * (classes 35..42, never picked by size) serve the aligned requests that need the exact
 * stride (larger ones get whole pages). */
#define FM_NUM_TWINS 8
#define FM_NUM_SPAN_CLASSES (FM_NUM_CLASSES + FM_NUM_TWINS)   /* every class with spans */
#define FM_CLASS_SPAN_BLOCK (FM_NUM_SPAN_CLASSES + 1)  /* unit-map marker: one block per span */
#define FM_CLASS_PAGES (FM_NUM_SPAN_CLASSES + 2)       /* unit-map marker: a page span */
#define FM_CLASS_MAPPED (FM_NUM_SPAN_CLASSES + 3)      /* unit-map marker: its own mapping */
#define FM_CLASS_BINS (FM_NUM_SPAN_CLASSES + 4)        /* unit-map marker: a bins' array */
#define FM_BINS (FM_NUM_SPAN_CLASSES + 5)              /* tcache bins, markers included */

/* Class of each 16-byte granule of size; filled by size_class_init() before the
 * first block is handed out (until then it reads 0, whose bin is always empty). */
extern fm_hidden uint8_t size_class_of_granule[(FM_SMALL_MAX >> 4) + 1];
/* The same by the size itself, up to FM_TABLED_MAX, for malloc's fast path (tcache.h):
 * one load off the table's address, where a granule's index takes an add and a shift. */
extern fm_hidden uint8_t size_class_of_size[FM_TABLED_MAX + 1];
extern fm_hidden const uint32_t size_class_size[FM_BINS];    /* bytes usable in a block */
extern fm_hidden const uint32_t size_class_stride[FM_BINS];  /* distance between blocks */

/* Class for size <= FM_SMALL_MAX by table: one load. */
static fm_always_inline unsigned size_class_of(size_t size) {
  return size_class_of_granule[(size + 15) >> 4];
}

/* The same answer computed from the definition; the table is checked against it. */
static inline unsigned size_class_formula(size_t size) {
  if (size <= 128) return size <= 16 ? 1 : (unsigned)((size + 15) >> 4);
  size_t m = size - 1;
  unsigned b = 63u - (unsigned)__builtin_clzll(m);      /* 2^b <= m < 2^(b+1), b >= 7 */
  unsigned k = (unsigned)((m - ((size_t)1 << b)) >> (b - 2));
  return 9 + (b - 7) * 4 + k;
}

/* Smallest class whose blocks are all aligned to `align` (a power of two <= 8 KiB)
 * and hold `size` bytes, or 0 when no class does: a padded class's twin when only the
 * twin's stride keeps the alignment. */
unsigned size_class_aligned(size_t size, size_t align);

void size_class_init(void);

#endif
