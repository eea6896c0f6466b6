/* Loads libfastmalloc.so (argv[1]) with dlopen into a process that started without it, as
 * a plugin or a Python extension linked with -lfastmalloc would: its initial-exec TLS
 * must fit in glibc's spare static TLS. Then allocates through the fm_ names, in this
 * thread and another; last, unloads it while a thread that used it still runs, which then
 * exits (its cache's destructor must still be there). Exit 0 on success. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static void *(*fm_malloc_fn)(size_t);
static void (*fm_free_fn)(void *);
static int (*fm_owns_fn)(const void *);

static void *use(void *arg) {
  for (size_t n = 1; n <= ((size_t)1 << 20); n *= 3) {   /* tabled, span and mapped sizes */
    char *p = fm_malloc_fn(n);
    if (!p || !fm_owns_fn(p)) return "fm_malloc";
    memset(p, 0x5a, n);
    fm_free_fn(p);
  }
  return NULL;
}

static pthread_barrier_t used, unloaded;

static void *use_then_outlive(void *arg) {
  void *failed = use(arg);
  pthread_barrier_wait(&used);
  pthread_barrier_wait(&unloaded);
  return failed;   /* the thread's exit runs fastmalloc's thread-key destructor */
}

int main(int argc, char **argv) {
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    printf("FAIL: %s\n", dlerror());
    return 1;
  }
  fm_malloc_fn = (void *(*)(size_t))dlsym(lib, "fm_malloc");
  fm_free_fn = (void (*)(void *))dlsym(lib, "fm_free");
  fm_owns_fn = (int (*)(const void *))dlsym(lib, "fm_owns");
  if (!fm_malloc_fn || !fm_free_fn || !fm_owns_fn) {
    printf("FAIL: fm_ names missing\n");
    return 1;
  }
  pthread_t t;
  void *thread_failed = "pthread_create";
  const char *failed = use(NULL);
  if (!failed && pthread_create(&t, NULL, use, NULL) == 0) pthread_join(t, &thread_failed);
  if (failed || thread_failed) {
    printf("FAIL: %s\n", failed ? failed : (const char *)thread_failed);
    return 1;
  }
  if (pthread_barrier_init(&used, NULL, 2) || pthread_barrier_init(&unloaded, NULL, 2) ||
      pthread_create(&t, NULL, use_then_outlive, NULL)) {
    printf("FAIL: thread set-up\n");
    return 1;
  }
  pthread_barrier_wait(&used);
  dlclose(lib);
  pthread_barrier_wait(&unloaded);
  pthread_join(t, &thread_failed);
  if (thread_failed) {
    printf("FAIL: %s\n", (const char *)thread_failed);
    return 1;
  }
  puts("dlopen'ed, used, and dlclose'd under a thread that used it");
  return 0;
}
