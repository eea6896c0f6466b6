/* White-box test of the chunks an arena maps ahead (src/arena.c maps several at a time):
 * malloc_trim leaves them, so a trimming program does not map them again at once, while a
 * purge tick that unmaps an empty chunk unmaps them too, since a heap that shrinks needs
 * none. Built from the allocator's objects, so it reads the arenas directly. */
#include "fm_test.h"

#include "arena.h"
#include "options.h"

/* Bytes mapped ahead by every arena. Single-threaded here: no lock needed. */
static size_t reserve_bytes(void) {
  size_t bytes = 0;
  for (unsigned i = 0; i < arena_count; i++)
    bytes += (size_t)(arenas[i].reserve_end - arenas[i].reserve);
  return bytes;
}

enum { HEAP_BLOCKS = 48 * 1024, BLOCK = 1000 };   /* 48 MB: twelve chunks and more */
static void *heap[HEAP_BLOCKS];

/* Allocates the heap, and more until a chunk batch has chunks left over; returns the blocks. */
static size_t build_heap_with_reserve(void) {
  size_t n = 0;
  while (n < HEAP_BLOCKS && (n < HEAP_BLOCKS / 2 || reserve_bytes() == 0)) {
    assert_non_null(heap[n] = malloc(BLOCK));
    memset(heap[n++], 0x5a, BLOCK);
  }
  assert_true(reserve_bytes() > 0);
  return n;
}

static void free_heap(size_t n) {
  for (size_t i = 0; i < n; i++) free(heap[i]);
}

static void test_trim_keeps_chunks_mapped_ahead(void **state) {
  size_t n = build_heap_with_reserve();
  size_t before = reserve_bytes();
  free_heap(n);
  malloc_trim(0);
  assert_int_equal(reserve_bytes(), before);
}

/* With a purge delay of 1 ms, a 100 KiB block (a chunk span's, so each free reaches the
 * arena and can tick) every 2 ms; a bound on progress, not a timing: 500 rounds. */
static void test_tick_after_shrink_unmaps_chunks_mapped_ahead(void **state) {
  uint64_t delay = options.purge_delay_ns;
  options.purge_delay_ns = 1000 * 1000;
  size_t n = build_heap_with_reserve();
  free_heap(n);
  int rounds = 0;
  while (reserve_bytes() > 0 && rounds < 500) {
    usleep(2000);
    free(fmt_launder(malloc(100 * FMT_KIB)));
    rounds++;
  }
  options.purge_delay_ns = delay;
  print_message("after %d rounds, %zu bytes mapped ahead\n", rounds, reserve_bytes());
  assert_int_equal(reserve_bytes(), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_trim_keeps_chunks_mapped_ahead),
      cmocka_unit_test(test_tick_after_shrink_unmaps_chunks_mapped_ahead),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
