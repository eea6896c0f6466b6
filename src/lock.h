/* Locks and the single-threaded switch. The only header that reads glibc's
 * __libc_single_threaded: while it is true, lock_take/lock_release do nothing. A slow-path
 * operation reads the flag once (lock_threaded()) and passes that value to its release. */
#ifndef FM_LOCK_H
#define FM_LOCK_H

#include <stdatomic.h>
#include <sys/single_threaded.h>

#include "os.h"

/* True once the process has (or had) a second thread; glibc never sets it back. */
static fm_always_inline bool lock_threaded(void) {
#if FM_SINGLE_THREAD_FLAG
  return !__libc_single_threaded;
#else
  return true;
#endif
}

/* Adds delta (modular: "negative" works) to a counter that any thread may update: a
 * locked add only once the process has a second thread. */
static inline void lock_add(size_t *counter, size_t delta) {
  if (lock_threaded()) __atomic_fetch_add(counter, delta, __ATOMIC_RELAXED);
  else __atomic_store_n(counter, __atomic_load_n(counter, __ATOMIC_RELAXED) + delta, __ATOMIC_RELAXED);
}

/* A futex lock in one int, so a fork child can reset it. Its states: free (0), held
 * (LOCK_HELD, plus LOCK_WAITERS when a thread may sleep on it), and, from fastmalloc's fork
 * prepare handler to its parent or child handler, LOCK_FORK: the forking thread has taken
 * it, so the heap it guards is consistent at the fork, but any thread may borrow it
 * (LOCK_FORK | LOCK_HELD) instead of waiting. glibc's fork takes more locks after the
 * prepare handlers (its stdio list lock, the NSS database lock, other libraries' handlers'
 * locks), and a thread holding one of those may be allocating: it must never wait for
 * the forking thread. A child finds a lock still borrowed only if the borrower was cut
 * off mid-operation: the heap behind it is then rebuilt (lock.c, fork_child_repair). */
enum { LOCK_HELD = 1, LOCK_WAITERS = 2, LOCK_FORK = 4 };

typedef struct lock {
  _Atomic int state;
} lock_t;

#define LOCK_INIT {0}

void lock_take_contended(lock_t *lock);
void lock_release_contended(lock_t *lock);

static inline void lock_init(lock_t *lock) {
  atomic_store_explicit(&lock->state, 0, memory_order_relaxed);
}

static fm_always_inline void lock_take(lock_t *lock, bool threaded) {
  if (!threaded) return;
  int expected = 0;
  if (fm_likely(atomic_compare_exchange_strong_explicit(&lock->state, &expected, LOCK_HELD,
                                                        memory_order_acquire,
                                                        memory_order_relaxed)))
    return;
  lock_take_contended(lock);
}

/* Takes the lock only if it is free: a lock held for a fork counts as busy. */
static inline bool lock_try(lock_t *lock, bool threaded) {
  int expected = 0;
  return !threaded || atomic_compare_exchange_strong_explicit(&lock->state, &expected, LOCK_HELD,
                                                              memory_order_acquire,
                                                              memory_order_relaxed);
}

static fm_always_inline void lock_release(lock_t *lock, bool threaded) {
  if (!threaded) return;
  int expected = LOCK_HELD;
  if (fm_likely(atomic_compare_exchange_strong_explicit(&lock->state, &expected, 0,
                                                        memory_order_release,
                                                        memory_order_relaxed)))
    return;
  lock_release_contended(lock);
}

/* The fork window (called by the fork handlers only, for every allocator lock):
 * lock_for_fork takes the lock and leaves it in LOCK_FORK; lock_after_fork_parent
 * waits for any borrower and frees it; lock_after_fork_child frees it and says whether
 * a borrower was cut off inside it (what it guards may be half updated). */
void lock_for_fork(lock_t *lock);
void lock_after_fork_parent(lock_t *lock);
bool lock_after_fork_child(lock_t *lock);

/* The fork window opens (parent_pid: the forking process) and closes (0). While it is
 * open, a thread that would wait for a borrowed lock checks whether it is in the child,
 * before fastmalloc's child handler ran (another library's child handler, or glibc's own
 * clean-up, allocating): then it calls repair_child first, which must leave every lock
 * free. */
void lock_fork_window(unsigned parent_pid, void (*repair_child)(void));

#endif
