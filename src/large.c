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
/* The cache of freed mappings: 8 slots and 64 MiB for up to two arenas, 4 slots and
 * 32 MiB more per arena beyond (most threads at once that each free and take a mapping),
 * so 16 threads churning big buffers reuse their pages instead of faulting in new ones. */
#define LARGE_CACHE_SLOTS_MAX 64
#define LARGE_CACHE_UNIT_BYTES ((size_t)32 << 20)
#define LARGE_TAKE_SLACK ((size_t)8 << 20)   /* a cached mapping this much too big is cut */

typedef struct mapping {
  char *base;
  size_t map_size;
} mapping;

static struct {
  mapping m;
  uint64_t freed_ns;
} cache[LARGE_CACHE_SLOTS_MAX];
static unsigned cache_slots = 8;
static size_t cache_max_bytes = 2 * LARGE_CACHE_UNIT_BYTES;
static size_t cache_bytes;
static fm_lock_t cache_lock = FM_LOCK_INIT;

void large_init(unsigned arenas) {
  unsigned share = arenas < 2 ? 2 : arenas;
  cache_slots = 4 * share < LARGE_CACHE_SLOTS_MAX ? 4 * share : LARGE_CACHE_SLOTS_MAX;
  cache_max_bytes = share * LARGE_CACHE_UNIT_BYTES;
}

/* Mappings taken out of the cache under its lock and unmapped once it is released:
 * munmap waits for the kernel's mapping lock and shoots down TLBs, too long to hold
 * a lock every thread's large malloc and free takes. */
typedef struct evicted {
  mapping m[LARGE_CACHE_SLOTS_MAX];
  unsigned n;
} evicted;

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

static size_t unmap_evicted(const evicted *out) {
  size_t released = 0;
  for (unsigned i = 0; i < out->n; i++) {
    unmap_block(out->m[i].base, out->m[i].map_size);
    released += out->m[i].map_size;
  }
  return released;
}

/* Under the lock: moves cache slot i to *out. */
static void cache_evict(unsigned i, evicted *out) {
  out->m[out->n++] = cache[i].m;
  cache_bytes -= cache[i].m.map_size;
  cache[i].m.base = NULL;
}

/* Under the lock: evicts the mappings freed longer ago than the purge delay (all when
 * force). */
static void cache_expire(bool force, evicted *out) {
  uint64_t now = os_now_ns();
  for (unsigned i = 0; i < cache_slots; i++)
    if (cache[i].m.base && (force || now - cache[i].freed_ns >= fm_options.purge_delay_ns))
      cache_evict(i, out);
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
  evicted old = {.n = 0};
  bool threaded = fm_threaded();
  fm_lock(&cache_lock, threaded);
  cache_expire(false, &old);
  int best = -1;
  for (int i = 0; i < (int)cache_slots; i++) {
    if (!cache[i].m.base) continue;
    size_t size = cache[i].m.map_size;
    if (best < 0) best = i;
    size_t best_size = cache[best].m.map_size;
    bool fits = size >= need, best_fits = best_size >= need;
    if ((fits && (!best_fits || size < best_size)) || (!fits && !best_fits && size > best_size))
      best = i;
  }
  char *base = NULL;
  size_t size = 0;
  if (best >= 0) {
    base = cache[best].m.base;
    size = cache[best].m.map_size;
    cache_bytes -= size;
    cache[best].m.base = NULL;
  }
  fm_unlock(&cache_lock, threaded);
  unmap_evicted(&old);
  if (base && (size < need || (size / 4 > need && size - need > LARGE_TAKE_SLACK))) {
    char *resized = mapping_resize(base, size, need);
    if (!resized) unmap_block(base, size);
    base = resized;
    size = need;
  }
  *map_size = size;
  return base;
}

/* Keeps a freed mapping for reuse, first evicting the oldest ones if the cache is full. */
static bool cache_put(char *base, size_t map_size) {
  if (map_size > cache_max_bytes / 2) return false;
  evicted old = {.n = 0};
  bool threaded = fm_threaded();
  fm_lock(&cache_lock, threaded);
  cache_expire(false, &old);
  for (;;) {
    int slot = -1, oldest = -1;
    for (int i = 0; i < (int)cache_slots; i++) {
      if (!cache[i].m.base) slot = slot < 0 ? i : slot;
      else if (oldest < 0 || cache[i].freed_ns < cache[oldest].freed_ns) oldest = i;
    }
    if (slot >= 0 && cache_bytes + map_size <= cache_max_bytes) {
      cache[slot].m = (mapping){base, map_size};
      cache[slot].freed_ns = os_now_ns();
      cache_bytes += map_size;
      break;
    }
    cache_evict((unsigned)oldest, &old);
  }
  fm_unlock(&cache_lock, threaded);
  unmap_evicted(&old);
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
  evicted old = {.n = 0};
  bool threaded = fm_threaded();
  fm_lock(&cache_lock, threaded);
  cache_expire(true, &old);
  fm_unlock(&cache_lock, threaded);
  return unmap_evicted(&old);
}

void large_lock_all(void) { fm_lock(&cache_lock, true); }
void large_unlock_all(void) { fm_unlock(&cache_lock, true); }
void large_reset_locks(void) { fm_lock_init(&cache_lock); }
