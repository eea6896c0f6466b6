/* C++'s operators new and delete, by their Itanium ABI names: new and delete take the fast
 * paths directly, not through libstdc++'s operators, which call malloc and free (a call and
 * a dozen instructions more a pair). Each new throws std::bad_alloc where malloc would
 * return NULL. The nothrow forms stay libstdc++'s, which call these and catch. In the
 * shared library only: in a static link, an archive's members are not pulled in for weak
 * references, so the references below could stay unresolved; libstdc++'s operators, which
 * call malloc and free, serve there. */
#include "alloc.h"

#if FM_LIBC_NAMES
#pragma GCC diagnostic ignored "-Wmissing-attributes"
#pragma GCC diagnostic ignored "-Wattribute-alias"   /* sized and aligned deletes are free */
#define FM_CXX_ALIAS(name, target) \
  __asm__(#name) __attribute__((alias(#target), used, visibility("default")))

/* libstdc++'s std::get_new_handler and std::__throw_bad_alloc, weak: the library needs no
 * C++ runtime, and a program that calls operator new has one. (An exception thrown here
 * or by a handler unwinds through these frames by their unwind tables.) */
typedef void (*cxx_new_handler)(void);
extern cxx_new_handler _ZSt15get_new_handlerv(void) __attribute__((weak));
extern void _ZSt17__throw_bad_allocv(void) __attribute__((weak, noreturn));

/* The block could not be had (align: 0 for none): as the standard asks, calls the
 * program's new-handler and tries again while there is one, then throws std::bad_alloc. */
static fm_noinline void *new_failed(size_t size, size_t align) {
  for (;;) {
    cxx_new_handler handler = _ZSt15get_new_handlerv ? _ZSt15get_new_handlerv() : NULL;
    if (!handler) break;
    handler();   /* frees memory, throws, or ends the program */
    void *p = align ? alloc_memalign(align, size) : alloc_malloc(size);
    if (p) return p;
  }
  if (_ZSt17__throw_bad_allocv) _ZSt17__throw_bad_allocv();
  diag_fatal(DIAG_CXX_NEW_FAILED, NULL);
}

/* p, or, when it is NULL, what new_failed gets. */
static fm_always_inline void *never_null(void *p, size_t size, size_t align) {
  return fm_likely(p != NULL) ? p : new_failed(size, align);
}

/* operator new past its fast path: a miss of the bins (a tcache_miss_fn) or a size past
 * them. */
static fm_noinline void *new_slow(size_t size, unsigned cls) {
  return never_null(size > FM_TABLED_MAX ? alloc_untabled(size) : tcache_malloc_miss(size, cls),
                    size, 0);
}

/* malloc's fast path, with a slow path that never returns NULL. */
static __attribute__((aligned(64))) void *cxx_new(size_t size) {
  if (fm_unlikely(size > FM_TABLED_MAX)) return new_slow(size, 0);
  return tcache_malloc_tabled(size, new_slow);
}
static void *cxx_new_aligned(size_t size, size_t align) {
  return never_null(alloc_memalign(align, size), size, align);
}
static void cxx_delete(void *p) { tcache_free(p); }

void *cxx_new_one(size_t) FM_CXX_ALIAS(_Znwm, cxx_new);
void *cxx_new_array(size_t) FM_CXX_ALIAS(_Znam, cxx_new);
void *cxx_new_one_aligned(size_t, size_t) FM_CXX_ALIAS(_ZnwmSt11align_val_t, cxx_new_aligned);
void *cxx_new_array_aligned(size_t, size_t) FM_CXX_ALIAS(_ZnamSt11align_val_t, cxx_new_aligned);
void cxx_delete_one(void *) FM_CXX_ALIAS(_ZdlPv, cxx_delete);
void cxx_delete_array(void *) FM_CXX_ALIAS(_ZdaPv, cxx_delete);
void cxx_delete_one_sized(void *, size_t) FM_CXX_ALIAS(_ZdlPvm, cxx_delete);
void cxx_delete_array_sized(void *, size_t) FM_CXX_ALIAS(_ZdaPvm, cxx_delete);
void cxx_delete_one_aligned(void *, size_t) FM_CXX_ALIAS(_ZdlPvSt11align_val_t, cxx_delete);
void cxx_delete_array_aligned(void *, size_t) FM_CXX_ALIAS(_ZdaPvSt11align_val_t, cxx_delete);
void cxx_delete_one_sized_aligned(void *, size_t, size_t)
    FM_CXX_ALIAS(_ZdlPvmSt11align_val_t, cxx_delete);
void cxx_delete_array_sized_aligned(void *, size_t, size_t)
    FM_CXX_ALIAS(_ZdaPvmSt11align_val_t, cxx_delete);
#endif
