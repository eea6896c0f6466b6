/* Large blocks in their own 64 KiB-aligned mappings. The header sits just before the
 * block; the unit map marks every unit of the mapping FM_CLASS_MAPPED, so free() finds
 * it in one load. Freed mappings wait briefly in a cache for the next large request. */
#include "large.h"

#include <string.h>

#include "chunk.h"
#include "options.h"
#include "sync.h"

typedef struct large_hdr {
  uintptr_t check;   /* block address ^ fm_mark while live, ^ ~fm_mark once freed */
  char *base;        /* start of the mapping */
  size_t map_size;
  size_t unused;
} large_hdr;

#define LARGE_OFFSET 64   /* block start from the mapping start, default alignment */
#define LARGE_CACHE_SLOTS 8
#define LARGE_CACHE_MAX_BYTES ((size_t)64 << 20)

static struct {
  char *base;
  size_t map_size;
  uint64_t freed_ns;
} cache[LARGE_CACHE_SLOTS];
static size_t cache_bytes;
static fm_lock_t cache_lock = FM_LOCK_INIT;

static size_t round_unit(size_t n) { return (n + FM_UNIT_SIZE - 1) & ~(FM_UNIT_SIZE - 1); }

static large_hdr *header_of(const void *p) { return (large_hdr *)p - 1; }

/* The header of live block p, or a fatal report naming the misuse. */
static large_hdr *live_header(const void *p, const char *op) {
  if (((uintptr_t)p & 15) || fm_unit_class((const char *)p - sizeof(large_hdr)) != FM_CLASS_MAPPED)
    os_fatal(op, p);
  large_hdr *h = header_of(p);
  if (h->check != ((uintptr_t)p ^ fm_mark)) {
    if (h->check == ((uintptr_t)p ^ ~fm_mark)) os_fatal("free(): double free detected", p);
    os_fatal(op, p);
  }
  return h;
}

static void unmap_block(char *base, size_t map_size) {
  fm_unit_map_set(base, map_size, 0);   /* before munmap: the range may be reused at once */
  os_unmap(base, map_size);
}

/* Unmaps cached mappings freed longer ago than the purge delay (all when force). */
static size_t cache_expire(bool force) {
  size_t released = 0;
  uint64_t now = os_now_ns();
  for (unsigned i = 0; i < LARGE_CACHE_SLOTS; i++) {
    if (cache[i].base && (force || now - cache[i].freed_ns >= fm_options.purge_delay_ns)) {
      unmap_block(cache[i].base, cache[i].map_size);
      released += cache[i].map_size;
      cache_bytes -= cache[i].map_size;
      cache[i].base = NULL;
    }
  }
  return released;
}

/* Resizes mapping base (unit-map entries included) in place or by moving it to an
 * aligned place; returns its new start, or NULL with the mapping unchanged. Unit-map
 * entries of a range are cleared before the kernel gets the range back, since another
 * thread may map it the moment it is free. */
static char *mapping_resize(char *base, size_t old, size_t size) {
  if (size < old) {
    fm_unit_map_set(base + size, old - size, 0);
    if (os_remap(base, old, size)) return base;   /* shrinking never moves */
    fm_unit_map_set(base + size, old - size, FM_CLASS_MAPPED);
    return NULL;
  }
  if (os_remap(base, old, size)) {
    if (fm_unit_map_set(base + old, size - old, FM_CLASS_MAPPED)) return base;
    os_remap(base, size, old);
    return NULL;
  }
  /* Map the destination first, where a limit can refuse cleanly, then move the pages. */
  char *dest = os_map_aligned(size, FM_UNIT_SIZE);
  if (!dest) return NULL;
  if (!fm_unit_map_set(dest, size, FM_CLASS_MAPPED)) {
    os_unmap(dest, size);
    return NULL;
  }
  fm_unit_map_set(base, old, 0);
  if (!os_move(base, old, dest, size)) {
    /* Only when the kernel is out of mapping slots: dest may be half gone, so it is left
     * as it is (marked ours, never reused) rather than unmapped under another thread. */
    fm_unit_map_set(base, old, FM_CLASS_MAPPED);
    return NULL;
  }
  return dest;
}

/* A cached mapping of at least `need` bytes, its size in *map_size: the smallest one
 * that is big enough (trimmed only if over 4x and 8 MiB too big), else the biggest one
 * grown. Its pages are mostly resident already, so the caller faults in few. */
static char *cache_take(size_t need, size_t *map_size) {
  bool threaded = fm_threaded();
  fm_lock(&cache_lock, threaded);
  cache_expire(false);
  int best = -1;
  for (int i = 0; i < LARGE_CACHE_SLOTS; i++) {
    if (!cache[i].base) continue;
    size_t size = cache[i].map_size;
    if (best < 0) best = i;
    size_t best_size = cache[best].map_size;
    bool fits = size >= need, best_fits = best_size >= need;
    if ((fits && (!best_fits || size < best_size)) || (!fits && !best_fits && size > best_size))
      best = i;
  }
  char *base = NULL;
  size_t size = 0;
  if (best >= 0) {
    base = cache[best].base;
    size = cache[best].map_size;
    cache_bytes -= size;
    cache[best].base = NULL;
  }
  fm_unlock(&cache_lock, threaded);
  if (base && (size < need || (size / 4 > need && size - need > LARGE_CACHE_MAX_BYTES / 8))) {
    char *resized = mapping_resize(base, size, need);
    if (!resized) unmap_block(base, size);
    base = resized;
    size = need;
  }
  *map_size = size;
  return base;
}

/* Keeps a freed mapping for reuse, first unmapping the oldest ones if the cache is full. */
static bool cache_put(char *base, size_t map_size) {
  if (map_size > LARGE_CACHE_MAX_BYTES / 2) return false;
  bool threaded = fm_threaded();
  fm_lock(&cache_lock, threaded);
  cache_expire(false);
  for (;;) {
    int slot = -1, oldest = -1;
    for (int i = 0; i < LARGE_CACHE_SLOTS; i++) {
      if (!cache[i].base) slot = slot < 0 ? i : slot;
      else if (oldest < 0 || cache[i].freed_ns < cache[oldest].freed_ns) oldest = i;
    }
    if (slot >= 0 && cache_bytes + map_size <= LARGE_CACHE_MAX_BYTES) {
      cache[slot].base = base;
      cache[slot].map_size = map_size;
      cache[slot].freed_ns = os_now_ns();
      cache_bytes += map_size;
      break;
    }
    unmap_block(cache[oldest].base, cache[oldest].map_size);
    cache_bytes -= cache[oldest].map_size;
    cache[oldest].base = NULL;
  }
  fm_unlock(&cache_lock, threaded);
  return true;
}

static void *place_block(char *base, size_t map_size, size_t offset) {
  char *p = base + offset;
  large_hdr *h = header_of(p);
  h->base = base;
  h->map_size = map_size;
  h->check = (uintptr_t)p ^ fm_mark;
  return p;
}

void *large_alloc(size_t size, size_t align, bool *fresh) {
  size_t offset = align > LARGE_OFFSET ? align : LARGE_OFFSET;
  if (size > PTRDIFF_MAX - offset - FM_UNIT_SIZE) return NULL;
  if (size == 0) size = 1;   /* the block must lie inside its mapping */
  size_t need = round_unit(offset + size);
  if (offset == LARGE_OFFSET) {
    size_t map_size;
    char *base = cache_take(need, &map_size);
    if (base) {
      *fresh = false;
      return place_block(base, map_size, offset);
    }
  }
  char *base = os_map_aligned(need, align > FM_UNIT_SIZE ? align : FM_UNIT_SIZE);
  if (!base) return NULL;
  if (!fm_unit_map_set(base, need, FM_CLASS_MAPPED)) {
    os_unmap(base, need);
    return NULL;
  }
  *fresh = true;
  return place_block(base, need, offset);
}

void large_free(void *p) {
  large_hdr *h = live_header(p, "free(): invalid pointer");
  h->check = (uintptr_t)p ^ ~fm_mark;
  if ((char *)p == h->base + LARGE_OFFSET && cache_put(h->base, h->map_size)) return;
  unmap_block(h->base, h->map_size);
}

size_t large_usable_size(const void *p) {
  large_hdr *h = live_header(p, "malloc_usable_size(): invalid pointer");
  return (size_t)(h->base + h->map_size - (const char *)p);
}

void *large_realloc(void *p, size_t size) {
  large_hdr *h = live_header(p, "realloc(): invalid pointer");
  char *base = h->base;
  size_t offset = (size_t)((char *)p - base), old = h->map_size;
  if (size > PTRDIFF_MAX - offset - FM_UNIT_SIZE) return NULL;
  size_t need = round_unit(offset + size);
  if (need <= old) {
    if (need < old / 2 && mapping_resize(base, old, need)) h->map_size = need;
    return p;
  }
  /* Grow with slack: a buffer grown in small steps then stays in place most times. */
  size_t grown = round_unit(need + need / 8);
  if (grown < need) grown = need;
  char *moved = mapping_resize(base, old, grown);
  return moved ? place_block(moved, grown, offset) : NULL;
}

size_t large_trim(void) {
  bool threaded = fm_threaded();
  fm_lock(&cache_lock, threaded);
  size_t released = cache_expire(true);
  fm_unlock(&cache_lock, threaded);
  return released;
}

void large_lock_all(void) { fm_lock(&cache_lock, true); }
void large_unlock_all(void) { fm_unlock(&cache_lock, true); }
void large_reset_locks(void) { fm_lock_init(&cache_lock); }
