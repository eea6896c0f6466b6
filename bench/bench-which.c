/* bench-which: prints the path of the shared object that provides malloc in this process,
 * so that bench/compare can check that an LD_PRELOAD is really in effect. With -v it also
 * prints fastmalloc's version when fastmalloc is the one loaded (fm_version). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    Dl_info info;
    void *sym = dlsym(RTLD_DEFAULT, "malloc");
    if (!sym || !dladdr(sym, &info) || !info.dli_fname) {
        fprintf(stderr, "bench-which: cannot locate malloc\n");
        return 1;
    }
    printf("%s\n", info.dli_fname);
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        const char *(*version)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "fm_version");
        if (version)
            printf("fastmalloc %s\n", version());
    }
    return 0;
}
