/* Locks and the single-threaded switch. The only header that reads glibc's
 * __libc_single_threaded: while it is true, fm_lock/fm_unlock do nothing. A slow-path
 * operation reads the flag once (fm_threaded()) and passes that value to its unlock. */
#ifndef FM_SYNC_H
#define FM_SYNC_H

#include <stdatomic.h>
#include <sys/single_threaded.h>

#include "os.h"

/* True once the process has (or had) a second thread; glibc never sets it back. */
static fm_always_inline bool fm_threaded(void) {
#if FM_SINGLE_THREAD_FLAG
  return !__libc_single_threaded;
#else
  return true;
#endif
}

/* Adds delta (modular: "negative" works) to a statistics counter that any thread may
 * update: a locked add only once the process has a second thread. */
static inline void fm_count_add(size_t *counter, size_t delta) {
  if (fm_threaded()) __atomic_fetch_add(counter, delta, __ATOMIC_RELAXED);
  else __atomic_store_n(counter, __atomic_load_n(counter, __ATOMIC_RELAXED) + delta, __ATOMIC_RELAXED);
}

/* A three-state futex lock: 0 free, 1 held, 2 held with waiters. Being one int, a
 * fork child can reset it with fm_lock_init. */
typedef struct fm_lock {
  _Atomic int state;
} fm_lock_t;

#define FM_LOCK_INIT {0}

/* Non-zero in the thread that forks, from fastmalloc's prepare handler to its parent or
 * child handler, while it holds every lock (the depth of forks nested in that window).
 * glibc runs prepare handlers in reverse order of registration and the others in order,
 * so the fork handlers of a library registered before fastmalloc run inside that window:
 * their mallocs pass through the locks (every other thread waits on them) instead of
 * waiting on their own thread. */
extern fm_hidden __thread unsigned char fm_fork_holder __attribute__((tls_model("initial-exec")));

void fm_lock_contended(fm_lock_t *lock);   /* passes through in the fork holder */

static inline void fm_lock_init(fm_lock_t *lock) {
  atomic_store_explicit(&lock->state, 0, memory_order_relaxed);
}

static fm_always_inline void fm_lock(fm_lock_t *lock, bool threaded) {
  if (!threaded) return;
  int expected = 0;
  if (fm_likely(atomic_compare_exchange_strong_explicit(&lock->state, &expected, 1,
                                                        memory_order_acquire,
                                                        memory_order_relaxed)))
    return;
  fm_lock_contended(lock);
}

static inline bool fm_trylock(fm_lock_t *lock, bool threaded) {
  int expected = 0;
  return !threaded || atomic_compare_exchange_strong_explicit(&lock->state, &expected, 1,
                                                              memory_order_acquire,
                                                              memory_order_relaxed);
}

static fm_always_inline void fm_unlock(fm_lock_t *lock, bool threaded) {
  if (!threaded || fm_unlikely(fm_fork_holder)) return;
  if (fm_unlikely(atomic_exchange_explicit(&lock->state, 0, memory_order_release) == 2))
    os_futex_wake_one((int *)&lock->state);
}

#endif
