/* Loads libfastmalloc.so (argv[1]) with dlopen into a process that started without it, as
 * a plugin or a Python extension linked with -lfastmalloc would: its initial-exec TLS
 * must fit in glibc's spare static TLS. Then allocates through the fm_ names, in this
 * thread and another. Exit 0 on success. */
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
  puts("dlopen'ed and used");
  return 0;
}
