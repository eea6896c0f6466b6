/* The registry of thread.h: the bins' arrays, in use and pooled, and the live threads
 * dealt each arena. */
#include "thread.h"

#include <string.h>

#include "unit_map.h"

static lock_t registry_lock = LOCK_INIT;
static fm_bins_array *arrays_in_use, *arrays_pooled;
static unsigned pool_count;
static size_t array_bytes;

#define LIST_UNLINK(list, node)                            \
  do {                                                     \
    if ((node)->prev) (node)->prev->next = (node)->next;   \
    else *(list) = (node)->next;                           \
    if ((node)->next) (node)->next->prev = (node)->prev;   \
  } while (0)
#define LIST_PUSH(list, node)               \
  do {                                      \
    (node)->prev = NULL;                    \
    (node)->next = *(list);                 \
    if (*(list)) (*(list))->prev = (node);  \
    *(list) = (node);                       \
  } while (0)

void thread_init(size_t bytes) { array_bytes = bytes; }

static fm_bins_array *array_map(void) {
  fm_bins_array *array = os_map_aligned(array_bytes, FM_UNIT_SIZE);
  if (array && !unit_map_set(array, array_bytes, FM_CLASS_BINS)) {
    os_unmap(array, array_bytes);
    return NULL;
  }
  return array;
}

static void array_unmap(fm_bins_array *array) {
  unit_map_set(array, array_bytes, 0);
  os_unmap(array, array_bytes);
}

/* (other threads read the count without the registry's lock) */
static void arena_threads_set(fm_arena *arena, uint32_t threads) {
  __atomic_store_n(&arena->threads, threads, __ATOMIC_RELAXED);
}

bool thread_join(fm_bins_array **out, fm_arena **arena) {
  bool threaded = lock_threaded();
  lock_take(&registry_lock, threaded);
  fm_bins_array *array = arrays_pooled;
  if (array) {
    LIST_UNLINK(&arrays_pooled, array);
    pool_count--;
  }
  lock_release(&registry_lock, threaded);
  if (!array && !(array = array_map())) return false;
  lock_take(&registry_lock, threaded);
  LIST_PUSH(&arrays_in_use, array);
  unsigned least = 0;
  for (unsigned i = 1; i < arena_count; i++)
    if (arenas[i].threads < arenas[least].threads) least = i;
  arena_threads_set(&arenas[least], arenas[least].threads + 1);
  lock_release(&registry_lock, threaded);
  *out = array;
  *arena = &arenas[least];
  return true;
}

void thread_leave(fm_bins_array *array, fm_arena *arena) {
  bool threaded = lock_threaded();
  lock_take(&registry_lock, threaded);
  arena_threads_set(arena, arena->threads - 1);
  LIST_UNLINK(&arrays_in_use, array);
  bool kept = pool_count < FM_BINS_POOL_MAX;
  if (kept) {
    LIST_PUSH(&arrays_pooled, array);
    pool_count++;
  }
  lock_release(&registry_lock, threaded);
  if (!kept) array_unmap(array);
}

/* The arrays stay mapped while listed; their slots change under us, each read once. */
bool thread_other_caches_hold_page_block(const fm_bins_array *mine, const void *p,
                                         unsigned pages) {
  bool threaded = lock_threaded(), found = false;
  lock_take(&registry_lock, threaded);
  for (fm_bins_array *array = arrays_in_use; array && !found; array = array->next)
    for (unsigned k = 0; k < FM_PAGE_BLOCKS_A_LENGTH && !found && array != mine; k++)
      found = __atomic_load_n(&array->page_blocks[pages][k], __ATOMIC_ACQUIRE) == p;
  lock_release(&registry_lock, threaded);
  return found;
}

size_t thread_pool_unmap(void) {
  bool threaded = lock_threaded();
  lock_take(&registry_lock, threaded);
  fm_bins_array *array = arrays_pooled;
  arrays_pooled = NULL;
  pool_count = 0;
  lock_release(&registry_lock, threaded);
  size_t released = 0;
  while (array) {
    fm_bins_array *next = array->next;
    array_unmap(array);
    released += array_bytes;
    array = next;
  }
  return released;
}

void thread_lock_for_fork(void) { lock_for_fork(&registry_lock); }

void thread_unlock_after_fork(void) { lock_after_fork_parent(&registry_lock); }

void thread_after_fork_child(fm_bins_array *own, const fm_arena *own_arena) {
  for (unsigned i = 0; i < arena_count; i++)
    arena_threads_set(&arenas[i], own_arena == &arenas[i]);
  if (!lock_after_fork_child(&registry_lock)) return;
  /* A borrower was cut off mid-update: the lists may be torn. Only this thread's array is
   * known to be sound; the rest stay mapped, unused. */
  arrays_in_use = arrays_pooled = NULL;
  pool_count = 0;
  if (own) LIST_PUSH(&arrays_in_use, own);
}
