/* The slow paths of the futex lock in lock.h: waiting, waking, and the fork window's
 * borrowing. A thread sleeps only on a lock that another thread holds inside fastmalloc
 * (held, or borrowed), never on the forking thread itself. */
#include "lock.h"

/* The fork window (lock_fork_window): the forking process, 0 outside the window. */
static _Atomic unsigned fork_parent_pid;
static void (*fork_repair_child)(void);

void lock_fork_window(unsigned parent_pid, void (*repair_child)(void)) {
  fork_repair_child = repair_child;
  atomic_store_explicit(&fork_parent_pid, parent_pid, memory_order_release);
}

/* A lock borrowed when the process forked stays so in the child: the borrower is gone. */
static bool in_unrepaired_child(void) {
  unsigned parent = atomic_load_explicit(&fork_parent_pid, memory_order_acquire);
  return parent && os_getpid() != parent;
}

/* Takes a lock found free (from 0) or held for a fork (from LOCK_FORK, borrowing it);
 * waited: this thread slept on it, so others may still be asleep and its unlock must
 * wake one. */
static bool try_take(lock_t *lock, int seen, bool waited) {
  if (seen != 0 && seen != LOCK_FORK) return false;
  int next = seen | LOCK_HELD | (waited ? LOCK_WAITERS : 0);
  return atomic_compare_exchange_strong_explicit(&lock->state, &seen, next, memory_order_acquire,
                                                 memory_order_relaxed);
}

/* Sleeps until the lock's state is no longer `seen` (held), having marked it waited on;
 * in a fork child whose lock was borrowed at the fork, repairs the heap instead. */
static void wait_while_held(lock_t *lock, int seen) {
  if ((seen & LOCK_FORK) && in_unrepaired_child()) {
    fork_repair_child();
    return;
  }
  int waited = seen | LOCK_WAITERS;
  if (seen == waited || atomic_compare_exchange_strong_explicit(&lock->state, &seen, waited,
                                                                memory_order_relaxed,
                                                                memory_order_relaxed))
    os_futex_wait((int *)&lock->state, waited);
}

void lock_take_contended(lock_t *lock) {
  for (int spin = 0; spin < 100; spin++) {
    if (try_take(lock, atomic_load_explicit(&lock->state, memory_order_relaxed), false)) return;
    __builtin_ia32_pause();
  }
  for (bool waited = false;; waited = true) {
    int seen = atomic_load_explicit(&lock->state, memory_order_relaxed);
    if (try_take(lock, seen, waited)) return;
    if (seen & LOCK_HELD) wait_while_held(lock, seen);
  }
}

void lock_release_contended(lock_t *lock) {
  /* A borrowed lock goes back to the forking thread, any other becomes free. */
  int seen = atomic_load_explicit(&lock->state, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(&lock->state, &seen, seen & LOCK_FORK,
                                                memory_order_release, memory_order_relaxed)) {
  }
  if (seen & LOCK_WAITERS) os_futex_wake((int *)&lock->state, 1);
}

void lock_for_fork(lock_t *lock) {
  lock_take(lock, true);
  /* Threads asleep on it wake to borrow it. */
  if (atomic_exchange_explicit(&lock->state, LOCK_FORK, memory_order_acq_rel) & LOCK_WAITERS)
    os_futex_wake((int *)&lock->state, INT32_MAX);
}

void lock_after_fork_parent(lock_t *lock) {
  for (;;) {
    int seen = atomic_load_explicit(&lock->state, memory_order_acquire);
    if (seen == LOCK_FORK) {
      if (!atomic_compare_exchange_strong_explicit(&lock->state, &seen, 0, memory_order_release,
                                                   memory_order_relaxed))
        continue;
      os_futex_wake((int *)&lock->state, INT32_MAX);   /* borrowers woken to a free lock */
      return;
    }
    if (!(seen & LOCK_HELD)) return;   /* (never: only this thread frees it) */
    wait_while_held(lock, seen);       /* a borrower inside: it ends soon */
  }
}

bool lock_after_fork_child(lock_t *lock) {
  int seen = atomic_exchange_explicit(&lock->state, 0, memory_order_acq_rel);
  return (seen & LOCK_HELD) != 0;
}
