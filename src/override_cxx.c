/* C++'s operators new and delete, by their Itanium ABI names: new and delete take the fast
 * paths directly, not through libstdc++'s operators, which call malloc and free (a call and
 * a dozen instructions more a pair). Each new throws std::bad_alloc where malloc would
 * return NULL (alloc_cxx_new_failed). The nothrow forms stay libstdc++'s, which call these
 * and catch. In the shared library only: a static link keeps libstdc++'s operators, since
 * an archive's members are not pulled in for weak references, so alloc.c's references to
 * std::get_new_handler and std::__throw_bad_alloc could stay unresolved there. */
#include "alloc.h"

#if FM_LIBC_NAMES
#pragma GCC diagnostic ignored "-Wmissing-attributes"
#pragma GCC diagnostic ignored "-Wattribute-alias"   /* sized and aligned deletes are free */
#define FM_CXX_ALIAS(name, target) \
  __asm__(#name) __attribute__((alias(#target), used, visibility("default")))

static __attribute__((aligned(64))) void *cxx_new(size_t size) { return alloc_cxx_new(size); }
static void *cxx_new_aligned(size_t size, size_t align) {
  void *p = alloc_memalign(align, size);
  return fm_likely(p != NULL) ? p : alloc_cxx_new_failed(size, align);
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
