/* The API contract of docs/design.md ("API semantics"), row by row, at every size-class
 * boundary and for alignments 16 .. 1 MiB: malloc, free, calloc, realloc, reallocarray,
 * the aligned allocators, malloc_usable_size, the __libc_ aliases and the fm_ extras. */
#include "fm_test.h"

#include <pthread.h>
#include <sys/mman.h>

#define PTRDIFF_MAX_PLUS_1 ((size_t)PTRDIFF_MAX + 1)
#define PAGE ((size_t)4096)

/* The __libc_ names are exported by glibc and fastmalloc but declared by no header. */
void *__libc_malloc(size_t);
void __libc_free(void *);
void *__libc_calloc(size_t, size_t);
void *__libc_realloc(void *, size_t);
void *__libc_memalign(size_t, size_t);
void *__libc_valloc(size_t);
void *__libc_pvalloc(size_t);
int __posix_memalign(void **, size_t, size_t);
void cfree(void *);

static size_t sizes[3 * FMT_MAX_CLASSES + 8];
static unsigned nsizes;

static int setup_sizes(void **state) {
  nsizes = fmt_boundary_sizes(sizes);
  return 0;
}

/* Sizes no allocator can serve: NULL with ENOMEM is the only answer. */
static const size_t impossible[] = {
    SIZE_MAX,           SIZE_MAX - 1,       SIZE_MAX - 15, SIZE_MAX - 4095,
    SIZE_MAX - FMT_MIB, PTRDIFF_MAX_PLUS_1, PTRDIFF_MAX,   (size_t)1 << 62,
    (size_t)1 << 47};
#define NIMPOSSIBLE (sizeof impossible / sizeof impossible[0])

static size_t next_pow2(size_t a) {
  size_t p = 1;
  while (p < a) p <<= 1;
  return p;
}

/* Checks one block that must hold n bytes aligned to align: owned, aligned, usable size
 * >= n and writable in full; fills it with the pattern of seed. */
static void check_block(void *p, size_t n, size_t align, uint64_t seed) {
  if (!p) fail_msg("NULL for %zu bytes aligned to %zu", n, align);
  if (!fm_owns(p)) fail_msg("%p for %zu bytes aligned to %zu: not owned", p, n, align);
  if (!fmt_aligned(p, align)) fail_msg("%p for %zu bytes not aligned to %zu", p, n, align);
  size_t usable = malloc_usable_size(p);
  if (usable < n) fail_msg("usable %zu < requested %zu", usable, n);
  fmt_fill(fmt_launder(p), usable, seed);   /* the slack too: see fmt_fill_usable */
}

static void test_uses_fastmalloc(void **state) { fmt_assert_uses_fastmalloc(); }

/* Every name glibc's malloc.o defines (and the fm_ extras) resolves into libfastmalloc. */
static void test_exported_names(void **state) {
  static const char *const names[] = {
      "malloc", "free", "calloc", "realloc", "reallocarray", "memalign", "posix_memalign",
      "aligned_alloc", "valloc", "pvalloc", "malloc_usable_size", "cfree", "__libc_malloc",
      "__libc_free", "__libc_calloc", "__libc_realloc", "__libc_memalign", "__libc_valloc",
      "__libc_pvalloc", "__posix_memalign", "mallopt", "mallinfo", "mallinfo2", "malloc_trim",
      "malloc_stats", "malloc_info", "fm_version", "fm_malloc", "fm_free", "fm_calloc",
      "fm_realloc", "fm_aligned_alloc", "fm_posix_memalign", "fm_malloc_usable_size",
      "fm_owns", "fm_mapped_bytes", "fm_trim", "free_sized", "free_aligned_sized"};
  for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++) {
    void *sym = dlsym(RTLD_DEFAULT, names[i]);
    Dl_info info;
    if (!sym || !dladdr(sym, &info) || !info.dli_fname ||
        !strstr(info.dli_fname, "libfastmalloc"))
      fail_msg("%s does not resolve into libfastmalloc (%s)", names[i],
               sym && dladdr(sym, &info) ? info.dli_fname : "unresolved");
  }
}

/* C23's free_sized and free_aligned_sized (glibc 2.43 has them; 2.36's headers do not
 * declare them): each frees its block, as free does. */
static void test_free_sized(void **state) {
  void (*free_sized)(void *, size_t) = (void (*)(void *, size_t))dlsym(RTLD_DEFAULT, "free_sized");
  void (*free_aligned_sized)(void *, size_t, size_t) =
      (void (*)(void *, size_t, size_t))dlsym(RTLD_DEFAULT, "free_aligned_sized");
  assert_non_null(free_sized);
  assert_non_null(free_aligned_sized);
  const size_t sizes[] = {1, 24, 1000, 5000, 40000, 300000, 3 * FMT_MIB};
  for (int round = 0; round < 50; round++)
    for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) {
      void *p = malloc(sizes[i]), *q = aligned_alloc(256, sizes[i]);
      assert_non_null(p);
      assert_non_null(q);
      memset(p, 1, sizes[i]);
      memset(q, 2, sizes[i]);
      free_sized(p, sizes[i]);
      free_aligned_sized(q, 256, sizes[i]);
    }
  free_sized(NULL, 0);
  malloc_trim(0);
}

static void test_malloc_zero_unique(void **state) {
  enum { N = 200 };
  void *p[N];
  for (int i = 0; i < N; i++) {
    p[i] = malloc(0);
    assert_non_null(p[i]);
    assert_true(fm_owns(p[i]));
    assert_true(fmt_aligned(p[i], 16));
    for (int j = 0; j < i; j++) assert_ptr_not_equal(p[i], p[j]);
  }
  for (int i = 0; i < N; i++) free(p[i]);
}

static void test_malloc_impossible(void **state) {
  for (unsigned i = 0; i < NIMPOSSIBLE; i++) {
    errno = 0;
    void *p = malloc(impossible[i]);
    if (p) fail_msg("malloc(%zu) returned %p", impossible[i], p);
    if (errno != ENOMEM) fail_msg("malloc(%zu): errno %d, not ENOMEM", impossible[i], errno);
  }
  void *p = malloc(100);
  assert_non_null(p);
  free(p);
}

/* A thread whose first call is free, which sets its cache up inside: errno as it was. */
static void *free_first_in_thread(void *block) {
  errno = 4242;
  free(block);
  return (void *)(intptr_t)errno;
}

/* free(NULL) is a no-op; free never changes errno: cache hit, cache flush, page blocks
 * (cached, and to their arena), large, aligned, the first call of a thread. */
static void test_free_keeps_errno(void **state) {
  enum { N = 20000 };
  void **blocks = calloc(N, sizeof *blocks);
  assert_non_null(blocks);
  errno = 4242;
  free(NULL);
  assert_int_equal(errno, 4242);
  for (int i = 0; i < N; i++) assert_non_null(blocks[i] = malloc(16 + (size_t)(i % 64) * 16));
  for (int i = 0; i < N; i++) {
    errno = 4242;
    free(blocks[i]);
    if (errno != 4242) fail_msg("free of block %d changed errno to %d", i, errno);
  }
  for (int i = 0; i < 64; i++) assert_non_null(blocks[i] = malloc(16 * FMT_KIB + 1 + (size_t)i * 700));
  for (int i = 0; i < 64; i++) {
    errno = 4242;
    free(blocks[i]);
    if (errno != 4242) fail_msg("free of page block %d changed errno to %d", i, errno);
  }
  pthread_t thread;
  void *result;
  void *block = malloc(100);
  assert_non_null(block);
  assert_int_equal(pthread_create(&thread, NULL, free_first_in_thread, block), 0);
  assert_int_equal(pthread_join(thread, &result), 0);
  assert_int_equal((intptr_t)result, 4242);
  const size_t big[] = {64 * FMT_KIB, FMT_MIB, 16 * FMT_MIB};
  for (unsigned i = 0; i < 3; i++) {
    void *p = malloc(big[i]);
    assert_non_null(p);
    errno = 4242;
    free(p);
    assert_int_equal(errno, 4242);
  }
  void *a = aligned_alloc(FMT_MIB, 100);
  assert_non_null(a);
  errno = 4242;
  free(a);
  assert_int_equal(errno, 4242);
  free(blocks);
}

/* A call that succeeds leaves errno alone, even when a first attempt inside failed: large
 * blocks that cannot grow in place and move, a cached mapping resized for a new block. */
static void test_success_keeps_errno(void **state) {
  errno = 4242;
  char *p = malloc(5 * FMT_MIB);
  assert_non_null(p);
  char *guard = malloc(5 * FMT_MIB);   /* likely right after p: p cannot grow in place */
  assert_non_null(guard);
  p[0] = 1;
  p = realloc(p, 50 * FMT_MIB);
  assert_non_null(p);
  assert_int_equal(p[0], 1);
  assert_int_equal(errno, 4242);
  free(p);
  char *small = malloc(2 * FMT_MIB);
  free(small);
  char *bigger = malloc(6 * FMT_MIB);   /* from the cached 2 MiB mapping, resized */
  assert_non_null(bigger);
  assert_int_equal(errno, 4242);
  free(bigger);
  free(guard);
}

/* realloc shrinking a block with a huge alignment gives its pages back: the alignment's
 * offset into the mapping does not count as part of the block. */
static void test_realloc_shrinks_aligned(void **state) {
  size_t align = (size_t)256 << 20, size = 64 * FMT_MIB;
  char *p = memalign(align, size);
  assert_non_null(p);
  assert_int_equal((uintptr_t)p % align, 0);
  memset(p, 7, size);
  char *q = realloc(p, 40000);
  assert_ptr_equal(q, p);
  assert_int_equal(q[39999], 7);
  if (malloc_usable_size(q) >= FMT_MIB)
    fail_msg("usable size %zu after shrinking to 40000: the mapping kept its pages",
             malloc_usable_size(q));
  free(q);
}

/* Every boundary size at once: owned, 16-aligned, usable >= n and writable, no overlap
 * (each pattern survives the others), usable size constant while the block lives. */
static void test_malloc_boundaries(void **state) {
  void *p[3 * FMT_MAX_CLASSES + 8];
  size_t usable[3 * FMT_MAX_CLASSES + 8];
  for (unsigned i = 0; i < nsizes; i++) {
    p[i] = malloc(sizes[i]);
    check_block(p[i], sizes[i], 16, i);
    usable[i] = malloc_usable_size(p[i]);
  }
  for (unsigned i = 0; i < nsizes; i++) {
    if (!fmt_check(p[i], usable[i], i)) fail_msg("block of %zu bytes overwritten", sizes[i]);
    assert_int_equal(malloc_usable_size(p[i]), usable[i]);
  }
  for (unsigned i = 0; i < nsizes; i++) free(p[i]);
}

static void test_usable_size(void **state) {
  assert_int_equal(malloc_usable_size(NULL), 0);
  void *p = malloc(100);
  size_t u = malloc_usable_size(p);
  assert_true(u >= 100);
  void *churn[64];
  for (int i = 0; i < 64; i++) churn[i] = malloc(100);
  for (int i = 0; i < 64; i += 2) free(churn[i]);
  assert_int_equal(malloc_usable_size(p), u);
  assert_ptr_equal(realloc(p, u), p);
  assert_int_equal(malloc_usable_size(p), u);
  for (int i = 1; i < 64; i += 2) free(churn[i]);
  free(p);
}

static void test_calloc_zeroed(void **state) {
  for (unsigned i = 0; i < nsizes; i++) {
    size_t n = sizes[i];
    unsigned char *a = calloc(1, n), *b = calloc(n, 1), *c = calloc(n / 3 + 1, 3);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_true(fm_owns(a) && fm_owns(b) && fm_owns(c));
    if (!fmt_is_zero(a, n) || !fmt_is_zero(b, n) || !fmt_is_zero(c, (n / 3 + 1) * 3))
      fail_msg("calloc of %zu bytes not zeroed", n);
    free(a);
    free(b);
    free(c);
  }
}

/* Blocks dirtied over their whole usable size and freed come back zeroed from calloc:
 * from the thread cache, from spans and from cached large mappings. */
static void test_calloc_dirty_reuse(void **state) {
  enum { N = 300 };
  void *p[N];
  for (unsigned i = 0; i < nsizes; i++) {
    size_t n = sizes[i];
    unsigned count = n > 64 * FMT_KIB ? 4 : N;
    for (unsigned j = 0; j < count; j++) {
      assert_non_null(p[j] = malloc(n));
      fmt_fill_usable(p[j], 0, 0xA5);
    }
    for (unsigned j = 0; j < count; j++) free(p[j]);
    for (unsigned j = 0; j < count; j++) {
      assert_non_null(p[j] = calloc(1, n));
      if (!fmt_is_zero(p[j], n)) fail_msg("calloc(1, %zu) after dirty free not zeroed", n);
      memset(p[j], 0x5A, n);
    }
    for (unsigned j = 0; j < count; j++) free(p[j]);
  }
  /* A cached large mapping reused for a smaller request. */
  const size_t big[] = {3 * FMT_MIB, 2 * FMT_MIB + 12345, 200 * FMT_KIB, 40 * FMT_KIB};
  for (unsigned i = 0; i < 4; i++) {
    void *d = malloc(4 * FMT_MIB);
    assert_non_null(d);
    fmt_fill_usable(d, 0, 0xC3);
    free(d);
    unsigned char *z = calloc(big[i], 1);
    assert_non_null(z);
    if (!fmt_is_zero(z, big[i])) fail_msg("calloc(%zu) after a dirty 4 MiB free", big[i]);
    free(z);
  }
}

static void test_calloc_overflow(void **state) {
  const size_t pairs[][2] = {{SIZE_MAX / 2 + 1, 2},
                             {2, SIZE_MAX / 2 + 1},
                             {(size_t)1 << 32, (size_t)1 << 32},
                             {SIZE_MAX, SIZE_MAX},
                             {SIZE_MAX, 2},
                             {(size_t)PTRDIFF_MAX / 2 + 1, 2},
                             {1, SIZE_MAX - 15},
                             {SIZE_MAX - 15, 1}};
  for (unsigned i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    errno = 0;
    void *p = calloc(pairs[i][0], pairs[i][1]);
    if (p || errno != ENOMEM)
      fail_msg("calloc(%zu, %zu) = %p errno %d", pairs[i][0], pairs[i][1], p, errno);
  }
}

static void test_calloc_zero_size(void **state) {
  void *a = calloc(0, 0), *b = calloc(0, 16), *c = calloc(16, 0);
  assert_non_null(a);
  assert_non_null(b);
  assert_non_null(c);
  assert_ptr_not_equal(a, b);
  assert_ptr_not_equal(b, c);
  assert_ptr_not_equal(a, c);
  free(a);
  free(b);
  free(c);
}

static void test_realloc_null(void **state) {
  for (unsigned i = 0; i < nsizes; i++) {
    void *p = realloc(NULL, sizes[i]);
    check_block(p, sizes[i], 16, i);
    free(p);
  }
}

/* realloc(p, 0) frees p and returns NULL: done 20000 times (small) and 300 times (1 MiB),
 * the mapped memory does not grow by what a leak would cost. */
static void test_realloc_zero_frees(void **state) {
  void *warm = realloc(malloc(FMT_MIB), 0);
  assert_null(warm);
  size_t before = fm_mapped_bytes();
  for (int i = 0; i < 20000; i++) {
    void *p = malloc(1000);
    assert_non_null(p);
    assert_null(realloc(p, 0));
  }
  for (int i = 0; i < 300; i++) {
    void *p = malloc(FMT_MIB);
    assert_non_null(p);
    memset(p, 1, 4096);
    assert_null(realloc(p, 0));
  }
  size_t after = fm_mapped_bytes();
  if (after > before + 8 * FMT_MIB)
    fail_msg("mapped grew from %zu to %zu: realloc(p, 0) leaks", before, after);
}

/* Same pointer while n fits the block and wastes at most half of it. */
static void test_realloc_in_place(void **state) {
  /* Also below half, when no smaller class would serve the new size. */
  void *smallest = malloc(16);
  assert_non_null(smallest);
  if (realloc(smallest, 1) != smallest) fail_msg("realloc(malloc(16), 1) moved the block");
  free(smallest);
  size_t cls[FMT_MAX_CLASSES];
  unsigned nc = fmt_class_sizes(cls);
  for (unsigned i = 0; i < nc; i++) {
    size_t s = cls[i];
    void *p = malloc(s);
    assert_non_null(p);
    size_t u = malloc_usable_size(p);
    fmt_fill(p, s, s);
    const size_t keep[] = {s, s - 1, u, s / 2 + 1, s / 2};
    for (unsigned k = 0; k < 5; k++) {
      void *q = realloc(p, keep[k]);
      if (q != p) fail_msg("realloc(malloc(%zu), %zu) moved the block", s, keep[k]);
    }
    assert_true(fmt_check(p, s / 2, s));
    free(p);
  }
  const size_t large[] = {64 * FMT_KIB + 1, 300 * FMT_KIB, 5 * FMT_MIB};
  for (unsigned i = 0; i < 3; i++) {
    void *p = malloc(large[i]);
    assert_non_null(p);
    size_t u = malloc_usable_size(p);
    fmt_fill(fmt_launder(p), u, i);   /* the slack too: see fmt_fill_usable */
    const size_t keep[] = {u, u - 1, large[i], u / 2 + 4096};
    for (unsigned k = 0; k < 4; k++)
      if (realloc(p, keep[k]) != p) fail_msg("realloc(malloc(%zu), %zu) moved", large[i], keep[k]);
    assert_true(fmt_check(p, u / 2 + 4096, i));
    free(p);
  }
}

/* Grow and shrink through small classes and large blocks: contents preserved, the new
 * block owned, its usable size covering the request and writable. */
static void test_realloc_moves_preserve(void **state) {
  for (unsigned i = 0; i < nsizes; i++) {
    size_t n = sizes[i];
    unsigned char *p = malloc(n);
    assert_non_null(p);
    fmt_fill(p, n, n);
    const size_t steps[] = {2 * n + 1, 3 * n + 100, FMT_MIB + 3, n / 3, 100, 1};
    size_t have = n;
    for (unsigned k = 0; k < 6; k++) {
      size_t m = steps[k];
      unsigned char *q = realloc(p, m);
      assert_non_null(q);
      size_t keep = have < m ? have : m;
      if (!fmt_check(q, keep, n)) fail_msg("realloc %zu -> %zu lost contents", have, m);
      check_block(q, m, 16, n); /* refills the whole usable size with the same pattern */
      have = malloc_usable_size(q);
      p = q;
    }
    free(p);
  }
  /* Large blocks grown and shrunk (mremap), still owned and freeable after each move. */
  const size_t chain[] = {FMT_MIB, 8 * FMT_MIB, 64 * FMT_MIB + 5, 5 * FMT_MIB, 40 * FMT_KIB,
                          32 * FMT_MIB};
  unsigned char *p = malloc(chain[0]);
  assert_non_null(p);
  fmt_fill(p, chain[0], 77);
  size_t have = chain[0];
  for (unsigned k = 1; k < 6; k++) {
    unsigned char *q = realloc(p, chain[k]);
    assert_non_null(q);
    size_t keep = have < chain[k] ? have : chain[k];
    if (!fmt_check(q, keep, 77)) fail_msg("large realloc %zu -> %zu lost contents", have, chain[k]);
    check_block(q, chain[k], 16, 77);
    have = malloc_usable_size(q);
    p = q;
  }
  free(p);
  /* Aligned blocks keep their contents through realloc too. */
  void *a = aligned_alloc(4096, 100);
  assert_non_null(a);
  fmt_fill(a, 100, 5);
  void *b = realloc(a, 100000);
  assert_non_null(b);
  assert_true(fmt_check(b, 100, 5));
  free(b);
}

/* A failed realloc returns NULL with ENOMEM and leaves the block as it was. */
static void test_realloc_failure(void **state) {
  void *blocks[] = {malloc(100), malloc(32768), malloc(3 * FMT_MIB), aligned_alloc(65536, 5000)};
  for (unsigned b = 0; b < 4; b++) {
    void *p = blocks[b];
    assert_non_null(p);
    size_t u = malloc_usable_size(p);
    fmt_fill(p, u, b);
    for (unsigned i = 0; i < NIMPOSSIBLE; i++) {
      errno = 0;
      void *q = realloc(fmt_launder(p), impossible[i]);
      if (q || errno != ENOMEM)
        fail_msg("realloc(%zu bytes, %zu) = %p errno %d", u, impossible[i], q, errno);
      assert_int_equal(malloc_usable_size(p), u);
      if (!fmt_check(p, u, b)) fail_msg("failed realloc changed the block");
    }
    free(p);
  }
}

static void test_reallocarray(void **state) {
  unsigned char *p = reallocarray(NULL, 10, 10);
  check_block(p, 100, 16, 1);
  fmt_fill(p, 100, 1);
  const size_t pairs[][2] = {{SIZE_MAX / 2 + 1, 2}, {(size_t)1 << 32, (size_t)1 << 32},
                             {3, SIZE_MAX / 3 + 1}, {SIZE_MAX, SIZE_MAX}};
  for (unsigned i = 0; i < 4; i++) {
    errno = 0;
    void *q = reallocarray(fmt_launder(p), pairs[i][0], pairs[i][1]);
    if (q || errno != ENOMEM)
      fail_msg("reallocarray(p, %zu, %zu) = %p errno %d", pairs[i][0], pairs[i][1], q, errno);
    assert_true(fmt_check(p, 100, 1));
  }
  p = reallocarray(p, 1000, 100);
  assert_non_null(p);
  assert_true(fmt_check(p, 100, 1));
  free(p);
}

/* posix_memalign: EINVAL unless a power of two multiple of sizeof(void *); ENOMEM for
 * impossible sizes; errno never touched. */
static void test_posix_memalign_errors(void **state) {
  const size_t bad[] = {0, 1, 2, 4, 3, 12, 24, 40, 48, 96, 4095, FMT_MIB + 8, SIZE_MAX};
  for (unsigned i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    void *p = NULL;
    errno = 1234;
    int r = posix_memalign(&p, bad[i], 64);
    if (r != EINVAL) fail_msg("posix_memalign(a=%zu) returned %d, not EINVAL", bad[i], r);
    assert_int_equal(errno, 1234);
  }
  const size_t nomem[][2] = {{64, SIZE_MAX},        {4096, SIZE_MAX - 100},
                             {FMT_MIB, PTRDIFF_MAX}, {(size_t)1 << 63, 1},
                             {16, PTRDIFF_MAX_PLUS_1}, {32, (size_t)1 << 47}};
  for (unsigned i = 0; i < sizeof nomem / sizeof nomem[0]; i++) {
    void *p = NULL;
    errno = 1234;
    int r = posix_memalign(&p, nomem[i][0], nomem[i][1]);
    if (r != ENOMEM)
      fail_msg("posix_memalign(a=%zu, n=%zu) returned %d", nomem[i][0], nomem[i][1], r);
    assert_int_equal(errno, 1234);
  }
  void *p = NULL;
  errno = 1234;
  assert_int_equal(posix_memalign(&p, 8, 10), 0);
  assert_int_equal(errno, 1234);
  check_block(p, 10, 8, 0);
  free(p);
}

enum aligned_fn { POSIX_MEMALIGN, ALIGNED_ALLOC, MEMALIGN, NFNS };

static void *alloc_aligned(enum aligned_fn fn, size_t a, size_t n) {
  void *p = NULL;
  switch (fn) {
    case POSIX_MEMALIGN: assert_int_equal(posix_memalign(&p, a, n), 0); return p;
    case ALIGNED_ALLOC: return aligned_alloc(a, n);
    default: return memalign(a, n);
  }
}

/* Alignments 16 .. 1 MiB by every boundary size (and 0, a-1, a, a+1) through the three
 * aligned allocators, all live at once per alignment so overlaps show. */
static void test_aligned_matrix(void **state) {
  enum { MAXN = (3 * FMT_MAX_CLASSES + 12) * NFNS };
  static void *p[MAXN];
  static size_t len[MAXN];
  for (size_t a = 16; a <= FMT_MIB; a *= 2) {
    unsigned n = 0;
    for (unsigned s = 0; s < nsizes + 4; s++) {
      size_t size = s < nsizes ? sizes[s] : (size_t[]){0, a - 1, a, a + 1}[s - nsizes];
      for (int fn = 0; fn < NFNS; fn++, n++) {
        p[n] = alloc_aligned(fn, a, size);
        check_block(p[n], size, a, n);
        len[n] = malloc_usable_size(p[n]);
      }
    }
    for (unsigned i = 0; i < n; i++) {
      if (!fmt_check(p[i], len[i], i)) fail_msg("aligned block %u (align %zu) overwritten", i, a);
      free(p[i]);
    }
  }
  /* Beyond the contract's range: chunk-sized and larger alignments still hold. */
  for (size_t a = 2 * FMT_MIB; a <= 16 * FMT_MIB; a *= 2)
    for (int fn = 0; fn < NFNS; fn++) {
      void *q = alloc_aligned(fn, a, 1000);
      check_block(q, 1000, a, 9);
      free(q);
    }
}

/* glibc 2.36 aligned_alloc and memalign: any alignment, non-powers of two rounded up to
 * the next power, sizes need not be multiples; alignments above SIZE_MAX/2+1 are EINVAL. */
static void test_aligned_alloc_glibc_rules(void **state) {
  const size_t ok[][2] = {{24, 100}, {48, 10}, {1000, 1}, {3, 5}, {0, 10}, {1, 0}, {64, 100},
                          {96, 1000}, {5000, 3}, {65535, 70000}, {(size_t)3 << 19, 10}};
  for (int fn = ALIGNED_ALLOC; fn <= MEMALIGN; fn++) {
    for (unsigned i = 0; i < sizeof ok / sizeof ok[0]; i++) {
      size_t a = ok[i][0], n = ok[i][1];
      void *p = fn == ALIGNED_ALLOC ? aligned_alloc(a, n) : memalign(a, n);
      check_block(p, n, a < 16 ? 16 : next_pow2(a), i);
      free(p);
    }
    const size_t einval[] = {SIZE_MAX, SIZE_MAX / 2 + 2, (SIZE_MAX / 4) * 3};
    for (unsigned i = 0; i < 3; i++) {
      errno = 0;
      void *p = fn == ALIGNED_ALLOC ? aligned_alloc(einval[i], 1) : memalign(einval[i], 1);
      if (p || errno != EINVAL) fail_msg("align %zu: %p errno %d", einval[i], p, errno);
    }
    const size_t nomem[][2] = {{(size_t)1 << 63, 1}, {64, SIZE_MAX}, {4096, SIZE_MAX - 4000},
                               {FMT_MIB, PTRDIFF_MAX_PLUS_1}, {16, (size_t)1 << 47}};
    for (unsigned i = 0; i < 5; i++) {
      errno = 0;
      size_t a = nomem[i][0], n = nomem[i][1];
      void *p = fn == ALIGNED_ALLOC ? aligned_alloc(a, n) : memalign(a, n);
      if (p || errno != ENOMEM) fail_msg("align %zu size %zu: %p errno %d", a, n, p, errno);
    }
  }
}

/* valloc: page aligned; pvalloc: page aligned with the size rounded up to a page. */
static void test_valloc_pvalloc(void **state) {
  const size_t extra[] = {0, 1, 100, PAGE - 1, PAGE, PAGE + 1, 3 * PAGE + 5};
  for (unsigned i = 0; i < nsizes + 7; i++) {
    size_t n = i < nsizes ? sizes[i] : extra[i - nsizes];
    void *v = valloc(n);
    check_block(v, n, PAGE, i);
    void *pv = pvalloc(n);
    check_block(pv, n ? (n + PAGE - 1) & ~(PAGE - 1) : 0, PAGE, i);
    free(v);
    free(pv);
  }
  void *z = pvalloc(0);
  assert_non_null(z);
  free(z);
  const size_t nomem[] = {SIZE_MAX, SIZE_MAX - 100, SIZE_MAX - PAGE, PTRDIFF_MAX_PLUS_1};
  for (unsigned i = 0; i < 4; i++) {
    errno = 0;
    void *p = valloc(nomem[i]);
    if (p || errno != ENOMEM) fail_msg("valloc(%zu) = %p errno %d", nomem[i], p, errno);
    errno = 0;
    p = pvalloc(nomem[i]);
    if (p || errno != ENOMEM) fail_msg("pvalloc(%zu) = %p errno %d", nomem[i], p, errno);
  }
}

/* Aligned requests up to a page come from size classes: the bytes of the blocks out
 * (mallinfo2's uordblks, from the spans' counts, so chunks mapped ahead do not count) grow
 * by their size plus well under a page each. */
static void test_aligned_small_no_page_waste(void **state) {
  enum { N = 8192 };
  void **p = calloc(N, sizeof *p);
  assert_non_null(p);
  for (size_t a = 32; a <= PAGE; a *= 2) {
    size_t before = mallinfo2().uordblks;
    for (int i = 0; i < N; i++) {
      p[i] = i % 2 ? aligned_alloc(a, a) : memalign(a, a / 2 + 1);
      assert_non_null(p[i]);
      assert_true(fmt_aligned(p[i], a));
    }
    size_t grown = mallinfo2().uordblks - before;
    if (grown > N * (a + PAGE / 2))
      fail_msg("%d aligned_alloc(%zu, %zu) took %zu bytes of blocks", N, a, a, grown);
    for (int i = 0; i < N; i++) free(p[i]);
  }
  free(p);
}

static void test_libc_aliases(void **state) {
  void *a = __libc_malloc(40);
  check_block(a, 40, 16, 1);
  unsigned char *c = __libc_calloc(10, 10);
  assert_non_null(c);
  assert_true(fm_owns(c) && fmt_is_zero(c, 100));
  fmt_fill(a, 40, 1);
  a = __libc_realloc(a, 4000);
  assert_non_null(a);
  assert_true(fmt_check(a, 40, 1) && fm_owns(a));
  void *m = __libc_memalign(4096, 10);
  check_block(m, 10, 4096, 2);
  void *v = __libc_valloc(10);
  check_block(v, 10, PAGE, 3);
  void *pv = __libc_pvalloc(10);
  check_block(pv, PAGE, PAGE, 4);
  void *pm = NULL;
  assert_int_equal(__posix_memalign(&pm, 24, 10), EINVAL);
  assert_int_equal(__posix_memalign(&pm, 256, 10), 0);
  check_block(pm, 10, 256, 5);
  __libc_free(a);
  free(c);
  __libc_free(m);
  cfree(v);
  free(pv);
  __libc_free(pm);
  __libc_free(NULL);
  cfree(NULL);
  void *mixed = malloc(64);
  __libc_free(mixed);
}

static void test_fm_extras(void **state) {
  assert_string_equal(fm_version(), FASTMALLOC_VERSION_STRING);
  void *p = fm_malloc(100);
  check_block(p, 100, 16, 1);
  assert_true(fm_malloc_usable_size(p) >= 100);
  p = fm_realloc(p, 5000);
  assert_non_null(p);
  assert_true(fmt_check(p, 100, 1));
  free(p);
  unsigned char *c = fm_calloc(100, 3);
  assert_true(c && fm_owns(c) && fmt_is_zero(c, 300));
  fm_free(c);
  void *a = fm_aligned_alloc(512, 100);
  check_block(a, 100, 512, 2);
  fm_free(a);
  void *pm = NULL;
  assert_int_equal(fm_posix_memalign(&pm, 12, 10), EINVAL);
  assert_int_equal(fm_posix_memalign(&pm, 128, 10), 0);
  check_block(pm, 10, 128, 3);
  free(pm);
  fm_free(NULL);
  fm_free(malloc(10));
  assert_true(fm_mapped_bytes() > 0);
}

/* fm_owns answers 0 for memory fastmalloc never handed out, and never crashes on it. */
static void test_fm_owns_foreign(void **state) {
  static char global[64];
  char stack[64];
  assert_false(fm_owns(NULL));
  assert_false(fm_owns(global));
  assert_false(fm_owns(fmt_launder(stack)));
  assert_false(fm_owns((void *)&test_fm_owns_foreign));
  char *map = mmap(NULL, 8 * FMT_MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(map != MAP_FAILED);
  char *aligned4m = (char *)(((uintptr_t)map + 4 * FMT_MIB - 1) & ~(4 * FMT_MIB - 1));
  memset(aligned4m, 0x01, 64 * FMT_KIB);
  assert_false(fm_owns(map));
  assert_false(fm_owns(aligned4m + 64));
  assert_false(fm_owns(aligned4m + 128 * FMT_KIB));
  munmap(map, 8 * FMT_MIB);
  assert_false(fm_owns((void *)(uintptr_t)0xffff800000000000ULL));
  assert_false(fm_owns((void *)UINTPTR_MAX));
}


/* A block shrunk to less than half moves to a smaller one, contents kept: realloc does not
 * pin a big block for a small request. */
static void test_realloc_shrink_moves(void **state) {
  const size_t from[] = {1024, 32768, 300 * FMT_KIB, 5 * FMT_MIB};
  for (unsigned i = 0; i < sizeof from / sizeof from[0]; i++) {
    char *p = malloc(from[i]);
    assert_non_null(p);
    fmt_fill(p, 100, i);
    char *q = realloc(p, 100);
    assert_non_null(q);
    if (malloc_usable_size(q) >= from[i] / 2)
      fail_msg("realloc(malloc(%zu), 100) kept %zu usable bytes", from[i], malloc_usable_size(q));
    assert_true(fmt_check(q, 100, i));
    free(q);
  }
}

/* A large block in a chunk span resizes in place: shrunk past half, it gives back its last
 * units; grown (below the size that takes a mapping of its own), it takes the free units
 * after it. No copy either way, contents kept. */
static void test_realloc_span_in_place(void **state) {
  char *p = malloc(900 * FMT_KIB);   /* a span of 15 units */
  assert_non_null(p);
  fmt_fill(p, 40 * FMT_KIB, 9);
  if (realloc(p, 40 * FMT_KIB) != p) fail_msg("realloc(malloc(900 KiB), 40 KiB) moved the block");
  assert_int_equal(malloc_usable_size(p), 64 * FMT_KIB);   /* one unit: a span, not a mapping */
  /* The 14 units it gave back follow it, free, in a single-threaded test. */
  if (realloc(p, 200 * FMT_KIB) != p) fail_msg("realloc of a one-unit block to 200 KiB moved it");
  assert_int_equal(malloc_usable_size(p), 256 * FMT_KIB);
  assert_true(fmt_check(p, 40 * FMT_KIB, 9));
  check_block(p, 200 * FMT_KIB, 16, 9);
  free(p);
}

/* Blocks above the size classes up to 64 KiB are runs of whole pages: page aligned (and
 * at any alignment up to 64 KiB on request), usable to their last page. realloc shrinks
 * one in place, giving its last pages back, and grows it in place into free pages that
 * follow it, contents kept. */
static void test_page_blocks(void **state) {
  const size_t sizes[] = {16 * FMT_KIB + 1, 20 * FMT_KIB, 40000, 64 * FMT_KIB};
  for (unsigned i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    malloc_trim(0);   /* (a cached block a page longer would serve the request) */
    void *p = malloc(sizes[i]);
    check_block(p, sizes[i], 4096, i);
    assert_int_equal(malloc_usable_size(p), (sizes[i] + 4095) / 4096 * 4096);
    free(p);
  }
  for (size_t align = 16 * FMT_KIB; align <= 64 * FMT_KIB; align *= 2) {
    void *small = aligned_alloc(align, 100), *large = aligned_alloc(align, 40000);
    check_block(small, 100, align, align);
    check_block(large, 40000, align, align + 1);
    assert_true(fmt_check(small, malloc_usable_size(small), align));
    free(small);
    free(large);
  }
  char *p = malloc(60 * FMT_KIB);
  assert_non_null(p);
  fmt_fill(p, 60 * FMT_KIB, 7);
  if (realloc(p, 20 * FMT_KIB) != p) fail_msg("realloc(malloc(60 KiB), 20 KiB) moved the block");
  assert_int_equal(malloc_usable_size(p), 20 * FMT_KIB);
  /* The pages it gave back follow it, free, in a single-threaded test. */
  if (realloc(p, 56 * FMT_KIB) != p) fail_msg("realloc of a 20 KiB block to 56 KiB moved it");
  assert_int_equal(malloc_usable_size(p), 56 * FMT_KIB);
  assert_true(fmt_check(p, 20 * FMT_KIB, 7));
  check_block(p, 56 * FMT_KIB, 4096, 8);
  free(p);
}

/* Pages of [p, p + n) resident now. */
static size_t resident_pages(const void *p, size_t n) {
  static unsigned char vec[(64 * FMT_MIB) / 4096];
  uintptr_t start = (uintptr_t)p & ~(uintptr_t)4095;
  size_t pages = ((uintptr_t)p + n - start + 4095) / 4096, count = 0;
  assert_true(pages <= sizeof vec);
  assert_int_equal(mincore((void *)start, pages * 4096, vec), 0);
  for (size_t i = 0; i < pages; i++) count += vec[i] & 1;
  return count;
}

/* A small block taken from a big freed mapping leaves the rest cached; once it is freed
 * too, the parts join again and the next big block takes the whole mapping, pages and
 * all, where the first one was. */
static bool split_mapping_rejoins(void) {
  malloc_trim(0);
  size_t n = 20 * FMT_MIB;
  char *big = malloc(n);
  assert_non_null(big);
  memset(big, 3, n);
  free(fmt_launder(big));
  char *small = malloc(4 * FMT_MIB);
  assert_non_null(small);
  bool same_start = small == big;
  free(fmt_launder(small));
  char *again = malloc(n);
  assert_non_null(again);
  bool rejoined = again == big && resident_pages(again, n) >= (19 * FMT_MIB) / 4096;
  free(again);
  return same_start && rejoined;
}

static void test_split_mapping_rejoins(void **state) {
  bool ok = false;
  for (int attempt = 0; attempt < 5 && !ok; attempt++)   /* (tries: see below) */
    ok = split_mapping_rejoins();
  if (!ok) fail_msg("a big block did not get back the mapping a small one split");
}

/* Frees blocks of 6, 10 and 4 MiB, their pages written, then takes a block of 18 MiB
 * (calloc when cleared); returns it, and in *resident its pages resident before use. */
static char *big_block_after_freeing_others(bool cleared, size_t n, size_t *resident) {
  static const size_t sizes[3] = {6 * FMT_MIB, 10 * FMT_MIB, 4 * FMT_MIB};
  malloc_trim(0);   /* (no cached mapping big enough for what follows) */
  char *freed[3];
  for (int i = 0; i < 3; i++) {
    assert_non_null(freed[i] = malloc(sizes[i]));
    memset(freed[i], 0x5a, sizes[i]);
  }
  for (int i = 0; i < 3; i++) free(fmt_launder(freed[i]));
  char *p = cleared ? calloc(1, n) : malloc(n);
  assert_non_null(p);
  assert_true(malloc_usable_size(p) >= n);
  /* Over the whole block: the freed mappings' unused tails (each rounded up to 2 MiB) may
   * lie inside it, and the last pages they had resident past byte n. */
  *resident = resident_pages(p, malloc_usable_size(p));
  return p;
}

/* A big block bigger than every freed one takes their pages (a mapping put together from
 * theirs): it starts resident, reads and writes like any block, calloc clears it, and
 * realloc grows and shrinks it keeping its contents. */
static void test_big_block_from_freed_blocks_of_other_sizes(void **state) {
  size_t n = 18 * FMT_MIB, resident = 0;
  /* Freed mappings wait for the purge delay only: a machine so busy that this thread
   * stalls past it between the frees and the malloc gets more tries. */
  for (int attempt = 0; attempt < 5 && resident < (16 * FMT_MIB) / 4096; attempt++)
    free(big_block_after_freeing_others(false, n, &resident));
  if (resident < (16 * FMT_MIB) / 4096)
    fail_msg("%zu of %zu pages of the new block resident: the freed pages were not reused",
             resident, n / 4096);
  for (int cleared = 0; cleared < 2; cleared++) {
    char *p = big_block_after_freeing_others(cleared, n, &resident);
    if (cleared && !fmt_is_zero(p, n)) fail_msg("calloc of a reused mapping is not zero");
    fmt_fill(p, n, 11);
    char *q = realloc(p, 40 * FMT_MIB);
    assert_non_null(q);
    if (!fmt_check(q, n, 11)) fail_msg("growing a block made of freed ones lost contents");
    memset(q + n, 1, 40 * FMT_MIB - n);
    char *r = realloc(q, 3 * FMT_MIB);
    assert_non_null(r);
    if (!fmt_check(r, 3 * FMT_MIB, 11)) fail_msg("shrinking it lost contents");
    free(r);
  }
}

/* The minimal mallinfo/mallopt/malloc_info/malloc_trim answers: the mapped bytes, "accepted",
 * and a trim that releases the pages of a block just freed. */
static void test_malloc_info_family(void **state) {
  char *p = malloc(FMT_MIB);
  assert_non_null(p);
  memset(p, 1, FMT_MIB);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  size_t mapped = fm_mapped_bytes();   /* the stream's own buffer comes after this */
  assert_true(mapped >= FMT_MIB);
  assert_int_equal(mallinfo2().arena, mapped);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  assert_int_equal((size_t)mallinfo().arena, mapped);   /* (mapped is far below INT_MAX here) */
#pragma GCC diagnostic pop
  assert_int_equal(malloc_info(0, f), 0);
  assert_int_equal(malloc_info(1, f), EINVAL);
  fclose(f);
  char expect[64];
  snprintf(expect, sizeof expect, "size=\"%zu\"", mapped);
  if (!strstr(buf, "<malloc ") || !strstr(buf, expect))
    fail_msg("malloc_info wrote \"%s\", expected %s in it", buf, expect);
  free(buf);
  assert_int_equal(mallopt(M_TRIM_THRESHOLD, 128 * 1024), 1);
  free(fmt_launder(p));
  assert_int_equal(malloc_trim(0), 1);
}

/* mallinfo2 counts the blocks out: small ones (blocks in the thread cache count as out
 * until it gives them back: malloc_trim does, for the caller's), a chunk span's large one,
 * and large ones in mappings of their own, which realloc resizes. */
static void test_mallinfo_counts_blocks(void **state) {
  enum { SMALL = 1000 };
  static void *small[SMALL];
  malloc_trim(0);
  struct mallinfo2 before = mallinfo2();
  for (int i = 0; i < SMALL; i++) assert_non_null(small[i] = malloc(100));
  char *span_large = malloc(200 * FMT_KIB), *mapped = malloc(8 * FMT_MIB);
  assert_non_null(span_large);
  assert_non_null(mapped);
  struct mallinfo2 during = mallinfo2();
  size_t out = SMALL * 100 + 200 * FMT_KIB + 8 * FMT_MIB;
  size_t added = during.uordblks - before.uordblks;
  /* (mappings come in multiples of 2 MiB: the 8 MiB block and its header take 10) */
  if (added < out || added > out + 3 * FMT_MIB)
    fail_msg("mallinfo2().uordblks rose by %zu for %zu bytes of blocks", added, out);
  assert_int_equal(during.hblks, before.hblks + 1);
  if (during.hblkhd < before.hblkhd + 8 * FMT_MIB || during.hblkhd > before.hblkhd + 10 * FMT_MIB)
    fail_msg("mallinfo2().hblkhd %zu with an 8 MiB block, %zu before", during.hblkhd, before.hblkhd);
  assert_int_equal(during.uordblks + during.fordblks, during.arena);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  assert_int_equal((size_t)mallinfo().uordblks, during.uordblks);   /* far below INT_MAX */
#pragma GCC diagnostic pop
  char *grown = realloc(fmt_launder(mapped), 16 * FMT_MIB);
  assert_non_null(grown);
  struct mallinfo2 regrown = mallinfo2();
  assert_int_equal(regrown.hblks, during.hblks);
  if (regrown.hblkhd < before.hblkhd + 16 * FMT_MIB)
    fail_msg("mallinfo2().hblkhd %zu with a 16 MiB block, %zu before", regrown.hblkhd, before.hblkhd);
  for (int i = 0; i < SMALL; i++) free(small[i]);
  free(span_large);
  free(grown);
  malloc_trim(0);
  struct mallinfo2 after = mallinfo2();
  assert_int_equal(after.hblks, before.hblks);
  assert_int_equal(after.hblkhd, before.hblkhd);
  if (after.uordblks > before.uordblks)
    fail_msg("mallinfo2().uordblks %zu after the blocks were freed and trimmed, %zu before",
             after.uordblks, before.uordblks);
}

/* The thread cache's bins grow in turn (each growth moves the bins above it, blocks and
 * all): every block handed out afterwards is distinct, unshared and keeps its contents. */
static void test_cache_bins_grow_in_turn(void **state) {
  enum { ROUNDS = 7, MOST = 8 << (ROUNDS - 1) };
  size_t sizes[FMT_MAX_CLASSES];
  unsigned classes = fmt_class_sizes(sizes);
  void **blocks = calloc((size_t)classes * MOST, sizeof *blocks);
  assert_non_null(blocks);
  for (unsigned round = 0, count = 8; round < ROUNDS; round++, count *= 2) {
    /* Every class in turn: refills grow its bin, then frees fill it and grow it more. */
    for (unsigned c = 0; c < classes; c++) {
      void **mine = blocks + (size_t)c * MOST;
      for (unsigned i = 0; i < count; i++) {
        mine[i] = malloc(sizes[c]);
        assert_non_null(mine[i]);
        fmt_fill(mine[i], sizes[c], (uint64_t)c * MOST + i);
      }
      if (round == ROUNDS - 1) continue;   /* the last round keeps everything live */
      for (unsigned i = 0; i < count; i++) {
        assert_true(fmt_check(mine[i], sizes[c], (uint64_t)c * MOST + i));
        free(mine[i]);
      }
    }
  }
  /* All live at once: no two blocks overlap, and every one still holds its pattern. */
  size_t live = (size_t)classes * MOST;
  uintptr_t *sorted = malloc(live * 2 * sizeof *sorted);
  assert_non_null(sorted);
  for (unsigned c = 0; c < classes; c++)
    for (unsigned i = 0; i < MOST; i++) {
      void *p = blocks[(size_t)c * MOST + i];
      assert_true(fmt_check(p, sizes[c], (uint64_t)c * MOST + i));
      sorted[2 * ((size_t)c * MOST + i)] = (uintptr_t)p;
      sorted[2 * ((size_t)c * MOST + i) + 1] = (uintptr_t)p + sizes[c];
    }
  qsort(sorted, live, 2 * sizeof *sorted, fmt_compare_addresses);
  for (size_t k = 1; k < live; k++) assert_true(sorted[2 * k - 1] <= sorted[2 * k]);
  for (size_t k = 0; k < live; k++) free((void *)sorted[2 * k]);
  free(sorted);
  free(blocks);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_uses_fastmalloc),
      cmocka_unit_test(test_cache_bins_grow_in_turn),
      cmocka_unit_test(test_exported_names),
      cmocka_unit_test(test_free_sized),
      cmocka_unit_test(test_malloc_zero_unique),
      cmocka_unit_test(test_malloc_impossible),
      cmocka_unit_test(test_free_keeps_errno),
      cmocka_unit_test(test_success_keeps_errno),
      cmocka_unit_test(test_realloc_shrinks_aligned),
      cmocka_unit_test(test_big_block_from_freed_blocks_of_other_sizes),
      cmocka_unit_test(test_split_mapping_rejoins),
      cmocka_unit_test(test_malloc_boundaries),
      cmocka_unit_test(test_usable_size),
      cmocka_unit_test(test_calloc_zeroed),
      cmocka_unit_test(test_calloc_dirty_reuse),
      cmocka_unit_test(test_calloc_overflow),
      cmocka_unit_test(test_calloc_zero_size),
      cmocka_unit_test(test_realloc_null),
      cmocka_unit_test(test_realloc_zero_frees),
      cmocka_unit_test(test_realloc_in_place),
      cmocka_unit_test(test_realloc_shrink_moves),
      cmocka_unit_test(test_realloc_span_in_place),
      cmocka_unit_test(test_page_blocks),
      cmocka_unit_test(test_realloc_moves_preserve),
      cmocka_unit_test(test_realloc_failure),
      cmocka_unit_test(test_reallocarray),
      cmocka_unit_test(test_posix_memalign_errors),
      cmocka_unit_test(test_aligned_matrix),
      cmocka_unit_test(test_aligned_alloc_glibc_rules),
      cmocka_unit_test(test_valloc_pvalloc),
      cmocka_unit_test(test_aligned_small_no_page_waste),
      cmocka_unit_test(test_libc_aliases),
      cmocka_unit_test(test_fm_extras),
      cmocka_unit_test(test_fm_owns_foreign),
      cmocka_unit_test(test_malloc_info_family),
      cmocka_unit_test(test_mallinfo_counts_blocks),
  };
  return cmocka_run_group_tests(tests, setup_sizes, NULL);
}
