/* A program that uses an installed fastmalloc the way its users do: the packaging tests build
 * it with pkg-config and through find_package(fastmalloc), shared and static. Exit 0 when its
 * malloc and libc's own allocations are fastmalloc's and the library loaded is the version of
 * the header (and of FM_PACKAGE_VERSION, the package's version, when defined). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fastmalloc.h>

int main(void) {
  int failures = 0;
  /* Written before fm_owns reads the pointer: gcc 12's -Wmaybe-uninitialized takes a const
   * void * argument for a read of the block's bytes. */
  char *p = malloc(100);
  if (p) memset(p, 1, 100);
  char *s = strdup("libc allocates this");
  if (!p || fm_owns(p) != 1) {
    puts("consumer: malloc(100) is not fastmalloc's");
    failures++;
  }
  if (!s || fm_owns(s) != 1) {
    puts("consumer: strdup's block is not fastmalloc's");
    failures++;
  }
  const char *version = fm_version();
  if (strcmp(version, FASTMALLOC_VERSION_STRING) != 0) {
    printf("consumer: library %s, header %s\n", version, FASTMALLOC_VERSION_STRING);
    failures++;
  }
#ifdef FM_PACKAGE_VERSION
  if (strcmp(version, FM_PACKAGE_VERSION) != 0) {
    printf("consumer: library %s, package %s\n", version, FM_PACKAGE_VERSION);
    failures++;
  }
#endif
  /* Where malloc comes from: the shared library's path, or this executable when linked in. */
  Dl_info info;
  const char *from = dladdr((void *)malloc, &info) && info.dli_fname && *info.dli_fname
                         ? info.dli_fname : "(this executable)";
  printf("consumer: %s, fastmalloc %s, malloc from %s\n", failures ? "FAILED" : "ok", version,
         from);
  free(p);
  free(s);
  return failures != 0;
}
