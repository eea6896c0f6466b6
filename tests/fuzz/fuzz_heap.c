/* libFuzzer target: the input is a program of heap operations on fastmalloc's fm_ API, run
 * against a table of live blocks whose patterns, usable sizes, alignment and zeroing are checked.
 * Built by run-fuzz.sh: clang, ASan, FM_SANITIZE=address (the sanitizer keeps malloc). */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fastmalloc.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define LIVE_MAX (64 * MIB)   /* bytes live at once: more is skipped */
#define ADDRESS_SPACE ((size_t)1 << 47)

enum { SLOTS = 32, BURST_MAX = 64 };

typedef struct {
  unsigned char *p;
  size_t n;
} slot_t;

static slot_t slot[SLOTS];
static size_t live;

/* The input, read a byte at a time; zeros once it is used up. */
typedef struct {
  const uint8_t *p;
  size_t left;
} reader;

static unsigned byte(reader *r) {
  if (!r->left) return 0;
  r->left--;
  return *r->p++;
}

static size_t bytes(reader *r, unsigned count) {
  size_t v = 0;
  for (unsigned i = 0; i < count; i++) v = v << 8 | byte(r);
  return v;
}

static __attribute__((noreturn)) void fail(const char *what, const void *p, size_t n) {
  fprintf(stderr, "fuzz_heap: %s (ptr %p, size %zu, errno %d)\n", what, p, n, errno);
  abort();
}

/* ---- patterns: a hash of the block's address, size and word index ---- */

static uint64_t pattern_key(const void *p, size_t n) {
  uint64_t x = (uintptr_t)p ^ (uint64_t)n << 40 ^ n;
  x ^= x >> 31;
  x *= 0x7FB5D329728EA185ULL;
  return x ^ x >> 27;
}

static void fill(unsigned char *p, size_t n) {
  uint64_t key = pattern_key(p, n);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t w = (key ^ i) * 0x9E3779B97F4A7C15ULL;
    memcpy(p + i, &w, n - i < 8 ? n - i : 8);
  }
}

/* Whether the first len bytes at q hold the pattern of a block at a of n bytes. */
static bool holds(const unsigned char *q, size_t len, const void *a, size_t n) {
  uint64_t key = pattern_key(a, n);
  for (size_t i = 0; i < len; i += 8) {
    uint64_t w = (key ^ i) * 0x9E3779B97F4A7C15ULL;
    if (memcmp(q + i, &w, len - i < 8 ? len - i : 8)) return false;
  }
  return true;
}

/* ---- sizes and alignments ---- */

/* The small classes' sizes (16-byte steps to 128, then four a power of two to 8 KiB). */
static size_t class_size(unsigned i) {
  i %= 8 + 24;
  if (i < 8) return 16 * (i + 1);
  size_t p = (size_t)128 << (i - 8) / 4;
  return p + ((i - 8) % 4 + 1) * (p / 4);
}

/* A size: class boundaries (s - 1, s, s + 1), any small size, page-block and chunk-span
 * lengths and their neighbours, blocks in mappings of their own, and sizes no block can have
 * (which must fail with ENOMEM). */
static size_t size_of(reader *r) {
  unsigned kind = byte(r) % 100, b = byte(r);
  int near = (int)(byte(r) % 3) - 1;
  if (kind < 35) return class_size(b) + (size_t)(ptrdiff_t)near;
  if (kind < 50) return bytes(r, 2) % (8 * KIB + 1);
  if (kind < 72) return 8 * KIB + (b % 15) * 4 * KIB + (size_t)(ptrdiff_t)near;   /* to 64 KiB */
  if (kind < 90) return 64 * KIB + (b % 16) * 64 * KIB + (size_t)(ptrdiff_t)near;  /* to 1 MiB */
  if (kind < 95) return MIB + bytes(r, 3) % (3 * MIB);
  static const size_t impossible[] = {ADDRESS_SPACE, ADDRESS_SPACE + 1, (size_t)PTRDIFF_MAX,
                                      (size_t)PTRDIFF_MAX + 1, SIZE_MAX - 4096, SIZE_MAX - 1,
                                      SIZE_MAX};
  return impossible[b % (sizeof impossible / sizeof impossible[0])];
}

static bool possible(size_t n) { return n < ADDRESS_SPACE; }

/* Alignments: powers of two 1 B - 4 MiB, others (aligned_alloc rounds them up, posix_memalign
 * refuses them), and impossible ones. */
static size_t alignment_of(reader *r) {
  unsigned b = byte(r);
  if (b < 200) return (size_t)1 << b % 23;
  if (b < 230) return (size_t)(b - 190) * 3;   /* 30 .. 117 */
  static const size_t odd[] = {0, ADDRESS_SPACE, (size_t)1 << 62, (size_t)1 << 63,
                               ((size_t)1 << 63) + 1, SIZE_MAX};
  return odd[b % (sizeof odd / sizeof odd[0])];
}

/* ---- checks ---- */

static void check_block(const slot_t *s) {
  if (!holds(s->p, s->n, s->p, s->n)) fail("pattern broken", s->p, s->n);
  if (!fm_owns(s->p)) fail("live block not owned", s->p, s->n);
  if (fm_malloc_usable_size(s->p) < s->n) fail("usable size below the request", s->p, s->n);
}

/* A new block p of n bytes asked for with alignment align (0: malloc's 16). */
static void adopt(slot_t *s, void *p, size_t n, size_t align) {
  if (align < 16) align = 16;
  if ((uintptr_t)p & (align - 1)) fail("misaligned", p, align);
  if (!fm_owns(p)) fail("new block not owned", p, n);
  if (fm_malloc_usable_size(p) < n) fail("usable size below the request", p, n);
  fill(p, n);
  s->p = p;
  s->n = n;
  live += n;
}

static void drop(slot_t *s) {
  check_block(s);
  fm_free(s->p);
  live -= s->n;
  s->p = NULL;
}

/* A failed allocation: NULL with errno ENOMEM, only for a size no block can have. */
static void refused(void *p, size_t n, int want_errno) {
  if (p) fail("impossible request answered", p, n);
  if (errno != want_errno) fail("failure with the wrong errno", p, n);
}

/* ---- operations ---- */

static void op_malloc(reader *r, slot_t *s) {
  size_t n = size_of(r);
  if (possible(n) && live + n > LIVE_MAX) return;
  errno = 0;
  void *p = fm_malloc(n);
  if (!possible(n)) return refused(p, n, ENOMEM);
  if (!p) fail("malloc failed", p, n);
  adopt(s, p, n, 0);
}

static void op_calloc(reader *r, slot_t *s) {
  size_t count = byte(r) % 4 ? 1 + byte(r) % 16 : bytes(r, 8);   /* now and then: any */
  size_t n = size_of(r) / (count ? count : 1), total;
  bool overflows = __builtin_mul_overflow(count, n, &total);
  if (!overflows && possible(total) && live + total > LIVE_MAX) return;
  errno = 0;
  unsigned char *p = fm_calloc(count, n);
  if (overflows || !possible(total)) return refused(p, total, ENOMEM);
  if (!p) fail("calloc failed", p, total);
  static const unsigned char zeros[4096];
  for (size_t i = 0; i < total; i += sizeof zeros)
    if (memcmp(p + i, zeros, total - i < sizeof zeros ? total - i : sizeof zeros))
      fail("calloc block not zeroed", p + i, total);
  adopt(s, p, total, 0);
}

static void op_realloc(reader *r, slot_t *s) {
  size_t n = size_of(r);
  if (!s->p) {
    if (possible(n) && live + n > LIVE_MAX) return;
    errno = 0;
    void *p = fm_realloc(NULL, n);
    if (!possible(n)) return refused(p, n, ENOMEM);
    if (!p) fail("realloc(NULL) failed", p, n);
    return adopt(s, p, n, 0);
  }
  check_block(s);
  if (n == 0) {   /* glibc's rule, which fastmalloc keeps: the block is freed */
    if (fm_realloc(s->p, 0) != NULL) fail("realloc to 0 returned a block", s->p, 0);
    live -= s->n;
    s->p = NULL;
    return;
  }
  if (possible(n) && n > s->n && live + n - s->n > LIVE_MAX) return;
  errno = 0;
  unsigned char *q = fm_realloc(s->p, n);
  if (!possible(n)) {
    refused(q, n, ENOMEM);
    return check_block(s);   /* the old block stays */
  }
  if (!q) fail("realloc failed", s->p, n);
  size_t kept = n < s->n ? n : s->n;
  if (!holds(q, kept, s->p, s->n)) fail("realloc lost the block's contents", q, n);
  live -= s->n;
  adopt(s, q, n, 0);
}

static void op_aligned_alloc(reader *r, slot_t *s) {
  size_t align = alignment_of(r), n = size_of(r);
  if (possible(n) && live + n > LIVE_MAX) return;
  errno = 0;
  void *p = fm_aligned_alloc(align, n);
  if (align > SIZE_MAX / 2 + 1) return refused(p, n, EINVAL);
  size_t rounded = align < 2 ? 1 : (size_t)1 << (64 - __builtin_clzll(align - 1));
  if (!possible(n) || rounded >= ADDRESS_SPACE) return refused(p, n, ENOMEM);
  if (!p) fail("aligned_alloc failed", p, n);
  adopt(s, p, n, rounded);
}

static void op_posix_memalign(reader *r, slot_t *s) {
  size_t align = alignment_of(r), n = size_of(r);
  if (possible(n) && live + n > LIVE_MAX) return;
  void *p = (void *)(uintptr_t)0x5a5a;
  errno = 4242;
  int rc = fm_posix_memalign(&p, align, n);
  if (errno != 4242) fail("posix_memalign changed errno", p, n);
  bool valid = align >= sizeof(void *) && !(align & (align - 1));
  int want = !valid ? EINVAL : !possible(n) || align >= ADDRESS_SPACE ? ENOMEM : 0;
  if (rc != want) fail("posix_memalign returned the wrong value", p, n);
  if (rc) {
    if (p != (void *)(uintptr_t)0x5a5a) fail("failed posix_memalign wrote its result", p, n);
    return;
  }
  adopt(s, p, n, align);
}

/* The slack past the request belongs to the block: written over, the pattern stays. */
static void op_usable(slot_t *s) {
  check_block(s);
  size_t u = fm_malloc_usable_size(s->p);
  memset(s->p + s->n, 0xA5, u - s->n);
  if (!holds(s->p, s->n, s->p, s->n)) fail("writing the slack broke the block", s->p, s->n);
}

/* count blocks of one size, then freed in an order the input picks, which the thread's
 * cache and the spans see as a batch. */
static void op_burst(reader *r) {
  unsigned count = 1 + byte(r) % BURST_MAX, order = byte(r) % 3;
  size_t n = size_of(r);
  if (!possible(n) || n > 64 * KIB) return;
  unsigned char *b[BURST_MAX];
  for (unsigned i = 0; i < count; i++) {
    if (!(b[i] = fm_malloc(n))) fail("burst malloc failed", NULL, n);
    fill(b[i], n);
  }
  unsigned half = (count + 1) / 2;
  for (unsigned k = 0; k < count; k++) {   /* in order, reversed, or evens then odds */
    unsigned i = order == 0 ? k : order == 1 ? count - 1 - k : k < half ? 2 * k : 2 * (k - half) + 1;
    if (!holds(b[i], n, b[i], n)) fail("burst block broken", b[i], n);
    fm_free(b[i]);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader in = {data, size};
  while (in.left) {
    unsigned op = byte(&in) % 12;
    slot_t *s = &slot[byte(&in) % SLOTS];
    switch (op) {
    case 0: if (!s->p) op_malloc(&in, s); break;
    case 1: if (!s->p) op_calloc(&in, s); break;
    case 2: case 3: op_realloc(&in, s); break;
    case 4: if (!s->p) op_aligned_alloc(&in, s); break;
    case 5: if (!s->p) op_posix_memalign(&in, s); break;
    case 6: case 7: if (s->p) drop(s); break;
    case 8: if (s->p) op_usable(s); break;
    case 9: fm_trim(); break;
    case 10:
      for (unsigned i = 0; i < SLOTS; i++)
        if (slot[i].p) check_block(&slot[i]);
      break;
    default: op_burst(&in); break;
    }
  }
  for (unsigned i = 0; i < SLOTS; i++)
    if (slot[i].p) drop(&slot[i]);
  if (fm_malloc_usable_size(NULL) != 0) fail("usable size of NULL", NULL, 0);
  fm_free(NULL);
  return 0;
}
