/* Process set-up, the fork handlers, and the calls that give held memory back. */
#include "init.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

#include "mapped.h"
#include "options.h"
#include "tcache.h"

static lock_t init_lock = LOCK_INIT;
static _Atomic int init_done;
static bool init_tried;   /* set-up runs once: a failure is final */
static _Atomic int atfork_registered;

static void fork_prepare(void);
static void fork_parent(void);
static void fork_child(void);

/* A purge tick ran: cached mappings freed longer ago than the purge delay go too. */
static void after_tick(void) { mapped_cache_unmap(false); }

bool init_process(void) {
  if (fm_likely(atomic_load_explicit(&init_done, memory_order_acquire))) return true;
  lock_take(&init_lock, true);
  if (!init_tried) {
    init_tried = true;
    options_init();
    size_class_init();
    if (!diag_key) diag_key = (uintptr_t)os_random64() | 1;   /* (kept by a fork child) */
    arena_init_all(after_tick);
    if (tcache_init()) atomic_store_explicit(&init_done, 1, memory_order_release);
  }
  bool ok = atomic_load_explicit(&init_done, memory_order_relaxed);
  lock_release(&init_lock, true);
  /* Last, outside the lock: glibc may malloc while registering, which now just works. */
  if (ok && !atomic_exchange(&atfork_registered, 1)) {
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    if (options.verbose) options_print(arena_count);
  }
  return ok;
}

/* FASTMALLOC_PURGE_THREAD=1: a thread that runs every arena's purge tick each half purge
 * delay, so that what a program frees goes back within the delay even when the program
 * makes no more calls. A span empty at two ticks is purged: half a delay to a delay after
 * it emptied. The blocks in the program's thread caches stay there (their threads' slow
 * paths sweep them). */
static void *purge_thread_run(void *unused) {
  uint64_t pause = options.purge_delay_ns / 2 > 1000000 ? options.purge_delay_ns / 2 : 1000000;
  for (;;) {
    os_sleep_ns(pause);
    arena_tick_all();
  }
  return unused;
}

/* Started from the constructor, where the program holds no lock of ours; with every signal
 * blocked, so that the program's handlers run in its own threads only, and a small stack.
 * Once it exists, glibc counts the process as threaded for good: the locks and atomics of
 * the slow paths are on. A fork child runs without it. */
static void purge_thread_start(void) {
  pthread_attr_t attr;
  sigset_t all, old;
  pthread_t thread;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, (size_t)64 << 10);
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int failed = pthread_create(&thread, &attr, purge_thread_run, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
  if (failed)
    diag_print("fastmalloc: FASTMALLOC_PURGE_THREAD=1: no thread could be started; memory "
               "goes back at the program's own calls\n");
  else
    pthread_setname_np(thread, "fm-purge");
}

__attribute__((constructor(101))) static void init_constructor(void) {
  if (init_process() && options.purge_thread) purge_thread_start();
}

/* Gives back what the heap holds empty: flushes the calling thread's cache, unmaps empty
 * chunks, cached mappings and finished threads' bins' arrays and, when purge (malloc_trim),
 * purges every free page still resident too. The retry after a refused mapping wants
 * address space, not RSS: it skips that slower part, and unmaps the chunks mapped ahead
 * instead. Returns the bytes released. */
static size_t release_held(bool purge) {
  if (!init_process()) return 0;
  size_t released = mapped_cache_unmap(true) + thread_pool_unmap();
  tcache_flush_mine(purge);   /* (its array's purged pages: bookkeeping, not counted) */
  bool threaded = lock_threaded();
  for (unsigned i = 0; i < arena_count; i++) {
    lock_take(&arenas[i].lock, threaded);
    released += arena_purge(&arenas[i], purge ? FM_PURGE_ALL : FM_UNMAP_EMPTY);
    lock_release(&arenas[i].lock, threaded);
  }
  return released;
}

size_t init_trim(void) { return release_held(true); }

bool init_release_for_retry(void) { return release_held(false) > 0; }

/* fork. The prepare handler takes every allocator lock in a fixed order, in the state that
 * lets other threads borrow them (lock.h): the child then sees a consistent heap, while no
 * thread ever waits for the forking one, which goes on to take glibc's stdio and NSS locks
 * (a thread holding one of those may be allocating). A single-threaded parent holds no lock
 * mid-operation, so nothing needs taking. */
static bool fork_locked;
/* One fork window at a time: glibc runs two threads' fork handlers at once. */
static lock_t fork_lock = LOCK_INIT;
/* In the forking thread: forks nested in the window (a library's prepare handler that
 * forks) count here, and only the outermost's handlers open and close the window. */
static __thread unsigned char fork_depth __attribute__((tls_model("initial-exec")));

static void fork_child_repair(void);

static void fork_prepare(void) {
  if (fork_depth) {
    fork_depth++;
    return;
  }
  if (!lock_threaded()) return;
  lock_take(&fork_lock, true);
  fork_locked = true;
  fork_depth = 1;
  lock_fork_window(os_getpid(), fork_child_repair);
  lock_for_fork(&init_lock);
  thread_lock_for_fork();
  mapped_lock_all_for_fork();
  arena_lock_all_for_fork();
}

/* True in the parent or child handler that ends the outermost fork's window. */
static bool fork_window_ends(void) {
  if (fork_depth > 1) {
    fork_depth--;
    return false;
  }
  fork_depth = 0;
  return fork_locked;
}

static void fork_parent(void) {
  if (!fork_window_ends()) return;
  fork_locked = false;
  arena_unlock_all_after_fork();
  mapped_unlock_all_after_fork();
  thread_unlock_after_fork();
  lock_after_fork_parent(&init_lock);
  lock_fork_window(0, NULL);
  lock_release(&fork_lock, true);
}

/* Frees every lock in the child; what a borrower left half updated starts again empty.
 * Runs from the child handler, or earlier, from the first wait for a borrowed lock (a
 * library's child handler registered before fastmalloc's, allocating). The other threads'
 * caches are gone with their threads. */
static void fork_child_repair(void) {
  if (!fork_locked) return;
  fork_locked = false;
  lock_init(&fork_lock);
  lock_fork_window(0, NULL);
  if (lock_after_fork_child(&init_lock) && !atomic_load(&init_done)) init_tried = false;
  tcache_after_fork_child();
  mapped_after_fork_child();
  arena_after_fork_child();
}

static void fork_child(void) {
  if (fork_window_ends()) fork_child_repair();
}
