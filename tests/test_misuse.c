/* Misuse on purpose, each case in a forked child: free() of pointers fastmalloc never
 * handed out, and of pointers into its spans that are no block, must print one line
 * starting "fastmalloc: " on stderr and abort (double frees: test_double_free.c). A control
 * child checks the harness itself. realloc and malloc_usable_size of a pointer that starts
 * no block abort the same way. */
#include "fm_test.h"

#include <pthread.h>
#include <sys/mman.h>

/* The child must abort with one line "fastmalloc: <report> 0x...", whose report is
 * `report` when that is not NULL. */
static void expect_report(void (*fn)(void *), void *arg, const char *what, const char *report) {
  char err[2048];
  int status = fmt_run_child(fn, arg, 30, err, sizeof err);
  assert_true(status != -1);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT)
    fail_msg("%s: child %s %d, not SIGABRT; stderr: \"%s\"", what,
             WIFSIGNALED(status) ? "killed by signal" : "exited with",
             WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), err);
  if (strncmp(err, "fastmalloc: ", 12) != 0) fail_msg("%s: stderr \"%s\"", what, err);
  const char *nl = strchr(err, '\n');
  if (!nl || nl[1]) fail_msg("%s: not exactly one line: \"%s\"", what, err);
  if (report && (strncmp(err + 12, report, strlen(report)) != 0 || err[12 + strlen(report)] != ' '))
    fail_msg("%s: stderr \"%s\", not the report \"%s\"", what, err, report);
}

static void expect_abort(void (*fn)(void *), void *arg, const char *what) {
  expect_report(fn, arg, what, NULL);
}

static void valid_use(void *arg) {
  void *p = malloc(64);
  free(fmt_launder(p));
  free(NULL);
}

/* The checks a thread cache's blocks get when they go back to their span: malloc_trim
 * gives the caller's cached blocks back at once. */
static void free_interior(void *arg) {
  char *p = malloc(64);
  free(fmt_launder(p + 16));
  malloc_trim(0);
}

/* A pointer into a block of whole pages (8-64 KiB), freed: its page starts no block. arg:
 * the offset, a page's or not. */
static void free_page_interior(void *arg) {
  char *p = malloc(40000);
  free(fmt_launder(p + (uintptr_t)arg));
}

/* A write into a freed page block of the main thread's arena that a thread of another
 * arena (FASTMALLOC_ARENAS=2: the thread takes the second) handed over, over its link to
 * the next such block: the main thread's next page-block malloc frees them. */
static void *free_two(void *blocks) {
  free(((void **)blocks)[1]);
  free(((void **)blocks)[0]);
  return NULL;
}

static void write_into_handed_over_page_block(void *arg) {
  void *blocks[2] = {malloc(40000), malloc(40000)};
  pthread_t thread;
  if (pthread_create(&thread, NULL, free_two, blocks) != 0 || pthread_join(thread, NULL) != 0)
    _exit(90);
  memset(fmt_launder(blocks[0]), 0x5a, 16);
  free(fmt_launder(malloc(40000)));
}

/* The same for small blocks, over their marks: a thread of the other arena frees two of
 * the main thread's and ends (its cache gives them back, handed over to the main thread's
 * arena; a trim would free them at once); the main thread's refill takes them. */
static void write_into_handed_over_block(void *arg) {
  void *blocks[2] = {malloc(64), malloc(64)};
  pthread_t thread;
  if (pthread_create(&thread, NULL, free_two, blocks) != 0 ||
      pthread_join(thread, NULL) != 0)
    _exit(90);
  memset(fmt_launder(blocks[0]), 0x5a, 16);
  for (int i = 0; i < 100000; i++) fmt_launder(malloc(64));
}

/* A write into the block between its two frees, over its mark. */
static void double_free_after_write(void *arg) {
  char *p = malloc(64);
  free(p);
  memset(fmt_launder(p), 0x5a, 16);
  free(fmt_launder(p));
  malloc_trim(0);
}

/* The unused tail of a span of 48-byte blocks (65536 = 1365 * 48 + 16) is in the span
 * but is no block. */
static void free_span_tail(void *arg) {
  char *p = malloc(48);
  char *tail = (char *)(((uintptr_t)p & ~(uintptr_t)0xffff) + 1365 * 48);
  free(fmt_launder(tail));
  malloc_trim(0);
}

/* A misaligned pointer into a block as a new thread's first call: its cache is not set up
 * yet, so free takes the slow path, which reports it there and then. (The cache would take
 * it, to be caught only when given back: the line after free() shows that it returned.) */
static void *free_misaligned_first(void *block) {
  free(fmt_launder((char *)block + 8));
  static const char returned[] = "free() returned\n";
  if (write(2, returned, sizeof returned - 1) < 0) abort();
  return NULL;
}

static void free_misaligned_slow_path(void *arg) {
  pthread_t thread;
  void *block = malloc(64);
  if (!block || pthread_create(&thread, NULL, free_misaligned_first, block) != 0) abort();
  pthread_join(thread, NULL);
}

/* A pointer inside a block (small, a span of its own, or mapped) is no block to resize
 * or measure. */
static void realloc_interior(void *arg) {
  char *p = malloc((uintptr_t)arg);
  free(realloc(fmt_launder(p + 16), 40));
}

/* A mapped block freed, then resized: the report names realloc, not a double free. */
static void realloc_freed_mapped(void *arg) {
  char *p = malloc(2 * FMT_MIB);
  free(p);
  free(realloc(fmt_launder(p), 3 * FMT_MIB));
}

/* A freed block is no block to resize or measure either: realloc would keep it while a
 * cache holds it, and the next malloc would hand it out again. */
static void realloc_freed(void *arg) {
  char *p = malloc((uintptr_t)arg);
  free(p);
  free(realloc(fmt_launder(p), (uintptr_t)arg + 16));
}

static void usable_size_freed(void *arg) {
  char *p = malloc((uintptr_t)arg);
  free(p);
  malloc_usable_size(fmt_launder(p));
}

/* An interior pointer waits in thread B's cache while main frees every block of its span
 * and trims, which gives the span back (and unmaps its chunk, when nothing else uses it):
 * B's flush at exit reports the pointer instead of reading metadata that is gone. */
enum { STALE_BLOCKS = 100 };
static void *stale_blocks[STALE_BLOCKS];
static pthread_barrier_t stale_freed, stale_trimmed;

static void *stale_thread(void *arg) {
  for (int i = 0; i < STALE_BLOCKS; i++) stale_blocks[i] = fmt_launder(malloc(64));
  malloc_trim(0);
  free(fmt_launder((char *)stale_blocks[0] + 16));
  pthread_barrier_wait(&stale_freed);
  pthread_barrier_wait(&stale_trimmed);
  return arg;
}

static void cached_pointer_outlives_span(void *arg) {
  pthread_t t;
  pthread_barrier_init(&stale_freed, NULL, 2);
  pthread_barrier_init(&stale_trimmed, NULL, 2);
  if (pthread_create(&t, NULL, stale_thread, NULL) != 0) _exit(90);
  pthread_barrier_wait(&stale_freed);
  for (int i = 0; i < STALE_BLOCKS; i++) free(stale_blocks[i]);
  malloc_trim(0);
  pthread_barrier_wait(&stale_trimmed);
  pthread_join(t, NULL);
}

static void usable_size_interior(void *arg) {
  char *p = malloc((uintptr_t)arg);
  malloc_usable_size(fmt_launder(p + 16));
}

static void free_stack(void *arg) {
  char buf[256];
  memset(buf, 0, sizeof buf);
  free(fmt_launder(buf + 16));
}

static char global_buf[4096];
static void free_global(void *arg) { free(fmt_launder(global_buf + 64)); }

static void free_mmap(void *arg) {
  char *m = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) _exit(90);
  free(m + (uintptr_t)arg);
}

/* A region aligned like a chunk and filled with plausible bytes: only the registry of the
 * allocator's own chunks can tell it is foreign. */
static void free_fake_chunk(void *arg) {
  size_t chunk = 4 * FMT_MIB;
  char *m = mmap(NULL, 3 * chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) _exit(90);
  char *fake = (char *)(((uintptr_t)m + chunk - 1) & ~(chunk - 1));
  memset(fake, 0x01, chunk);
  free(fake + 256 * FMT_KIB);
}

/* A pointer of the kernel's half of the address space: (void *)-1 is MAP_FAILED. */
static void free_kernel_address(void *arg) { free(fmt_launder(arg)); }
static void realloc_kernel_address(void *arg) { free(realloc(fmt_launder(arg), 100)); }

static void test_uses_fastmalloc(void **state) { fmt_assert_uses_fastmalloc(); }

static void test_control_child_exits_cleanly(void **state) {
  char err[1024];
  int status = fmt_run_child(valid_use, NULL, 30, err, sizeof err);
  fmt_assert_child_ok(status, err);
  assert_string_equal(err, "");
}

static void test_bad_blocks_given_back(void **state) {
  expect_abort(free_interior, NULL, "free of a pointer inside a block");
  expect_report(free_page_interior, (void *)(uintptr_t)4096,
                "free of a page inside a block of pages", "free(): invalid pointer");
  expect_report(free_page_interior, (void *)(uintptr_t)48, "free of a pointer inside a block of pages",
                "free(): invalid pointer");
  expect_abort(double_free_after_write, NULL, "double free after a write");
  expect_report(write_into_handed_over_page_block, NULL,
                "write into a page block handed to its arena", "double free or corruption of a free block");
  if (FM_FREE_MARK)   /* (without the mark, nothing in a handed-over small block is read) */
    expect_report(write_into_handed_over_block, NULL, "write into a block handed to its arena",
                  "double free or corruption of a free block");
  expect_abort(free_span_tail, NULL, "free of a span's unused tail");
  expect_report(free_misaligned_slow_path, NULL, "misaligned free on the slow path",
                "free(): invalid pointer");
  expect_report(cached_pointer_outlives_span, NULL, "cached pointer whose span went back",
                "free(): invalid pointer");
}

static void test_interior_pointers_measured(void **state) {
  expect_report(realloc_freed_mapped, NULL, "realloc of a freed mapped block",
                "realloc(): invalid pointer");
  /* Blocks a thread cache may hold (small ones, and blocks of pages: 20000, 40000) by the
   * mark, so not in a build without it; large ones always. */
  const size_t freed_sizes[] = {100, 5000, 20000, 40000, 500000};
  for (unsigned i = FM_FREE_MARK ? 0 : 4; i < sizeof freed_sizes / sizeof freed_sizes[0]; i++) {
    expect_report(realloc_freed, (void *)(uintptr_t)freed_sizes[i], "realloc of a freed block",
                  "realloc(): invalid pointer");
    expect_report(usable_size_freed, (void *)(uintptr_t)freed_sizes[i],
                  "malloc_usable_size of a freed block", "malloc_usable_size(): invalid pointer");
  }
  const size_t sizes[] = {64, 4000, 20000, 40000, 2 * FMT_MIB};
  for (unsigned i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    expect_report(realloc_interior, (void *)(uintptr_t)sizes[i], "realloc of an interior pointer",
                  "realloc(): invalid pointer");
    expect_report(usable_size_interior, (void *)(uintptr_t)sizes[i],
                  "malloc_usable_size of an interior pointer",
                  "malloc_usable_size(): invalid pointer");
  }
}

static void test_free_foreign(void **state) {
  expect_abort(free_stack, NULL, "free of a stack address");
  expect_abort(free_global, NULL, "free of a global");
  expect_abort(free_mmap, (void *)0, "free of an mmap'd page");
  expect_abort(free_mmap, (void *)4096, "free inside an mmap'd region");
  expect_abort(free_fake_chunk, NULL, "free inside a fake chunk");
  expect_report(free_kernel_address, MAP_FAILED, "free of MAP_FAILED", "free(): invalid pointer");
  expect_report(free_kernel_address, (void *)(uintptr_t)0xffff888000001000u,
                "free of a kernel address", "free(): invalid pointer");
  expect_report(free_kernel_address, (void *)(uintptr_t)0xffff800000000000u,
                "free of the lowest kernel address", "free(): invalid pointer");
  expect_report(realloc_kernel_address, MAP_FAILED, "realloc of MAP_FAILED",
                "realloc(): invalid pointer");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_uses_fastmalloc),
      cmocka_unit_test(test_control_child_exits_cleanly),
      cmocka_unit_test(test_bad_blocks_given_back),
      cmocka_unit_test(test_interior_pointers_measured),
      cmocka_unit_test(test_free_foreign),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
