/* Large blocks in their own 64 KiB-aligned mappings. The header sits just before the
 * block; the unit map marks every unit of the mapping FM_CLASS_MAPPED, so free() finds
 * it in one load. Freed mappings wait briefly in a cache for the next large request. */
#include "large.h"

#include <string.h>

#include "arena.h"
#include "options.h"
#include "sync.h"

typedef struct large_hdr {
  uintptr_t check;   /* block address ^ fm_mark while live, ^ ~fm_mark once freed */
  char *base;        /* start of the mapping */
  size_t map_size;
  size_t unused;
} large_hdr;

#define LARGE_OFFSET 64   /* block start from the mapping start, default alignment */

/* Freed mappings wait in a cache per arena: a thread frees into its arena's and takes from
 * it first, so it reuses its own pages, still in its CPU's caches, and threads do not
 * share one lock. Each holds 8 mappings and 64 MiB; all together hold at most 64 MiB, or
 * 32 MiB per arena when there are more than two. */
#define LARGE_CACHE_SLOTS 8
#define LARGE_CACHE_BYTES ((size_t)64 << 20)
#define LARGE_CACHE_ARENA_SHARE ((size_t)32 << 20)
#define LARGE_TAKE_SLACK ((size_t)8 << 20)   /* a cached mapping this much too big is cut */

typedef struct mapping {
  char *base;
  size_t map_size;
} mapping;

typedef struct large_cache {
  fm_lock_t lock;
  size_t bytes;   /* written under the lock, read without it as a hint */
  struct {
    mapping m;
    uint64_t freed_ns;
  } slot[LARGE_CACHE_SLOTS];
} __attribute__((aligned(64))) large_cache;

static large_cache caches[FM_MAX_ARENAS];
static size_t all_bytes;                        /* through fm_count_add */
static unsigned visit_next;                     /* the cache whose expiry a call also runs */

/* What all caches together may hold. */
static size_t all_max_bytes(void) {
  return fm_arena_count <= 2 ? LARGE_CACHE_BYTES : fm_arena_count * LARGE_CACHE_ARENA_SHARE;
}

/* Mappings taken out of caches under their locks, to unmap once those are released:
 * munmap waits for the kernel's mapping lock and shoots down TLBs, too long to hold a
 * lock other threads' large mallocs and frees take. A call empties at most its own cache
 * and one other. */
typedef struct evicted {
  mapping m[2 * LARGE_CACHE_SLOTS];
  unsigned n;
} evicted;

static size_t round_unit(size_t n) { return (n + FM_UNIT_SIZE - 1) & ~(FM_UNIT_SIZE - 1); }

static large_hdr *header_of(const void *p) { return (large_hdr *)p - 1; }

/* The header of live block p, or a fatal report: op, or freed_op for a block freed already
 * (free names a double free, the other calls their own misuse). */
static large_hdr *live_header(const void *p, const char *op, const char *freed_op) {
  if (((uintptr_t)p & 15) ||
      unit_map_class_checked((const char *)p - sizeof(large_hdr)) != FM_CLASS_MAPPED)
    os_fatal(op, p);
  large_hdr *h = header_of(p);
  if (h->check != ((uintptr_t)p ^ fm_mark))
    os_fatal(h->check == ((uintptr_t)p ^ ~fm_mark) ? freed_op : op, p);
  return h;
}

static void unmap_block(char *base, size_t map_size) {
  unit_map_set(base, map_size, 0);   /* before munmap: the range may be reused at once */
  os_unmap(base, map_size);
}

/* Returns the bytes unmapped. */
static size_t unmap_evicted(const evicted *out) {
  size_t released = 0;
  for (unsigned i = 0; i < out->n; i++) {
    unmap_block(out->m[i].base, out->m[i].map_size);
    released += out->m[i].map_size;
  }
  return released;
}

/* Under c's lock: removes slot i from c. */
static mapping cache_remove(large_cache *c, unsigned i) {
  mapping m = c->slot[i].m;
  __atomic_store_n(&c->bytes, c->bytes - m.map_size, __ATOMIC_RELAXED);
  fm_count_add(&all_bytes, -m.map_size);
  c->slot[i].m.base = NULL;
  return m;
}

/* Under c's lock: evicts the mappings freed longer ago than the purge delay (all when
 * force). */
static void cache_expire(large_cache *c, bool force, evicted *out) {
  if (!c->bytes) return;
  uint64_t now = os_now_ns();
  for (unsigned i = 0; i < LARGE_CACHE_SLOTS; i++)
    if (c->slot[i].m.base && (force || now - c->slot[i].freed_ns >= fm_options.purge_delay_ns))
      out->m[out->n++] = cache_remove(c, i);
}

/* Expires one other cache in turn, unless its lock is busy: caches of arenas nobody uses
 * any more still give their mappings back. */
static void cache_visit_other(evicted *out, bool threaded) {
  large_cache *c = &caches[__atomic_fetch_add(&visit_next, 1, __ATOMIC_RELAXED) % fm_arena_count];
  if (!__atomic_load_n(&c->bytes, __ATOMIC_RELAXED) || !fm_trylock(&c->lock, threaded)) return;
  cache_expire(c, false, out);
  fm_unlock(&c->lock, threaded);
}

/* Under c's lock: removes and returns its smallest mapping of at least `need` bytes, or
 * with need 0 its biggest one; {NULL} when it has none. */
static mapping cache_remove_fit(large_cache *c, size_t need) {
  int best = -1;
  for (int i = 0; i < LARGE_CACHE_SLOTS; i++) {
    size_t size = c->slot[i].m.map_size;
    if (!c->slot[i].m.base || size < need) continue;
    size_t best_size = best < 0 ? 0 : c->slot[best].m.map_size;
    if (best < 0 || (need ? size < best_size : size > best_size)) best = i;
  }
  return best < 0 ? (mapping){NULL, 0} : cache_remove(c, (unsigned)best);
}

/* Grows mapping base when the address space cannot hold old and new mapping at once
 * (ulimit -v): the kernel moves and grows it wherever it likes, which needs room for the
 * growth only, and the contents then slide to the first unit boundary inside it (a copy
 * of old bytes). Returns the new start, or NULL with the mapping unchanged. The unit-map
 * leaves the new place may need are mapped first: once the old range is given up, another
 * thread may map it, so the block can never move back. */
static char *mapping_move_tight(char *base, size_t old, size_t size) {
  if (!unit_map_hold_spares((unsigned)((size + FM_UNIT_SIZE) >> UNIT_MAP_LEAF_SHIFT) + 2))
    return NULL;
  unit_map_set(base, old, 0);
  char *raw = os_remap_move(base, old, size + FM_UNIT_SIZE, NULL);
  if (!raw) {
    unit_map_set(base, old, FM_CLASS_MAPPED);
    return NULL;
  }
  char *start = (char *)round_unit((uintptr_t)raw);
  if (!unit_map_set(start, size, FM_CLASS_MAPPED))
    os_fatal("realloc(): cannot register a moved block", start);
  if (start > raw) memmove(start, raw, old);
  size_t head = (size_t)(start - raw);
  if (head) os_unmap(raw, head);
  if (head < FM_UNIT_SIZE) os_unmap(start + size, FM_UNIT_SIZE - head);
  return start;
}

/* Resizes mapping base (unit-map entries included) in place or by moving it to an
 * aligned place; returns its new start, or NULL with the mapping unchanged. Unit-map
 * entries of a range are cleared before the kernel gets the range back, since another
 * thread may map it the moment it is free. */
static char *mapping_resize(char *base, size_t old, size_t size) {
  if (size < old) {
    unit_map_set(base + size, old - size, 0);
    if (os_remap(base, old, size)) return base;   /* shrinking never moves */
    unit_map_set(base + size, old - size, FM_CLASS_MAPPED);
    return NULL;
  }
  if (os_remap(base, old, size)) {
    if (unit_map_set(base + old, size - old, FM_CLASS_MAPPED)) return base;
    os_remap(base, size, old);
    return NULL;
  }
  /* Map the destination first, where a limit can refuse cleanly, then move the pages. */
  char *dest = os_map_aligned(size, FM_UNIT_SIZE);
  if (!dest) return mapping_move_tight(base, old, size);
  if (!unit_map_set(dest, size, FM_CLASS_MAPPED)) {
    os_unmap(dest, size);
    return NULL;
  }
  unit_map_set(base, old, 0);
  if (!os_move(base, old, dest, size)) {
    /* Only when the kernel is out of mapping slots: dest may be half gone, so it is left
     * as it is (marked ours, never reused) rather than unmapped under another thread. */
    unit_map_set(base, old, FM_CLASS_MAPPED);
    return NULL;
  }
  return dest;
}

/* A cached mapping of at least `need` bytes for a thread of arena `own`: the smallest that
 * fits in its own cache, else in another's (trimmed only if over 4x and 8 MiB too big),
 * else its own biggest one grown; {NULL} when none is cached. Its pages are mostly
 * resident already, so the caller faults in few. */
static mapping cache_take(unsigned own, size_t need) {
  evicted old = {.n = 0};
  bool threaded = fm_threaded();
  large_cache *mine = &caches[own];
  fm_lock(&mine->lock, threaded);
  cache_expire(mine, false, &old);
  mapping got = cache_remove_fit(mine, need);
  fm_unlock(&mine->lock, threaded);
  for (unsigned k = 1; k < fm_arena_count && !got.base; k++) {
    large_cache *c = &caches[(own + k) % fm_arena_count];
    if (!__atomic_load_n(&c->bytes, __ATOMIC_RELAXED) || !fm_trylock(&c->lock, threaded)) continue;
    got = cache_remove_fit(c, need);
    fm_unlock(&c->lock, threaded);
  }
  if (!got.base) {
    fm_lock(&mine->lock, threaded);
    got = cache_remove_fit(mine, 0);
    fm_unlock(&mine->lock, threaded);
  }
  cache_visit_other(&old, threaded);
  unmap_evicted(&old);
  if (got.base && (got.map_size < need || (got.map_size / 4 > need && got.map_size - need > LARGE_TAKE_SLACK))) {
    char *resized = mapping_resize(got.base, got.map_size, need);
    if (!resized) unmap_block(got.base, got.map_size);
    got = (mapping){resized, need};
  }
  return got;
}

/* Keeps a freed mapping in arena own's cache, first evicting its oldest ones if it is
 * full; false when it cannot be kept (too big, or the other caches hold the whole
 * allowance). */
static bool cache_put(unsigned own, char *base, size_t map_size) {
  if (map_size > LARGE_CACHE_BYTES / 2) return false;
  evicted old = {.n = 0};
  bool threaded = fm_threaded();
  large_cache *c = &caches[own];
  bool kept = false;
  fm_lock(&c->lock, threaded);
  cache_expire(c, false, &old);
  for (;;) {
    int slot = -1, oldest = -1;
    for (int i = 0; i < LARGE_CACHE_SLOTS; i++) {
      if (!c->slot[i].m.base) slot = slot < 0 ? i : slot;
      else if (oldest < 0 || c->slot[i].freed_ns < c->slot[oldest].freed_ns) oldest = i;
    }
    if (slot >= 0 && c->bytes + map_size <= LARGE_CACHE_BYTES &&
        __atomic_load_n(&all_bytes, __ATOMIC_RELAXED) + map_size <= all_max_bytes()) {
      c->slot[slot].m = (mapping){base, map_size};
      c->slot[slot].freed_ns = os_now_ns();
      __atomic_store_n(&c->bytes, c->bytes + map_size, __ATOMIC_RELAXED);
      fm_count_add(&all_bytes, map_size);
      kept = true;
      break;
    }
    if (oldest < 0) break;
    old.m[old.n++] = cache_remove(c, (unsigned)oldest);
  }
  fm_unlock(&c->lock, threaded);
  cache_visit_other(&old, threaded);
  unmap_evicted(&old);
  return kept;
}

/* The live blocks and their mappings' bytes, for mallinfo (modular counts: through
 * fm_count_add, a decrease is the addition of its two's complement). */
static size_t live_blocks, live_bytes;

static void live_count(size_t blocks, size_t bytes) {
  fm_count_add(&live_blocks, blocks);
  fm_count_add(&live_bytes, bytes);
}

void large_live(size_t *blocks, size_t *bytes) {
  *blocks = __atomic_load_n(&live_blocks, __ATOMIC_RELAXED);
  *bytes = __atomic_load_n(&live_bytes, __ATOMIC_RELAXED);
}

static void *place_block(char *base, size_t map_size, size_t offset) {
  char *p = base + offset;
  large_hdr *h = header_of(p);
  h->base = base;
  h->map_size = map_size;
  h->check = (uintptr_t)p ^ fm_mark;
  return p;
}

void *large_alloc(size_t size, size_t align, const fm_arena *arena, bool *fresh) {
  size_t offset = align > LARGE_OFFSET ? align : LARGE_OFFSET;
  if (size > PTRDIFF_MAX - offset - FM_UNIT_SIZE) return NULL;
  if (size == 0) size = 1;   /* the block must lie inside its mapping */
  size_t need = round_unit(offset + size);
  mapping got = {NULL, 0};
  if (offset == LARGE_OFFSET) got = cache_take((unsigned)(arena - fm_arenas), need);
  *fresh = !got.base;
  if (!got.base) {
    got = (mapping){os_map_aligned(need, align > FM_UNIT_SIZE ? align : FM_UNIT_SIZE), need};
    if (!got.base) return NULL;
    if (!unit_map_set(got.base, need, FM_CLASS_MAPPED)) {
      os_unmap(got.base, need);
      return NULL;
    }
  }
  live_count(1, got.map_size);
  return place_block(got.base, got.map_size, offset);
}

void large_free(void *p, const fm_arena *arena) {
  large_hdr *h = live_header(p, "free(): invalid pointer", "free(): double free detected");
  h->check = (uintptr_t)p ^ ~fm_mark;
  live_count((size_t)-1, -h->map_size);
  if ((char *)p == h->base + LARGE_OFFSET &&
      cache_put((unsigned)(arena - fm_arenas), h->base, h->map_size))
    return;
  unmap_block(h->base, h->map_size);
}

size_t large_usable_size(const void *p, const char *op) {
  large_hdr *h = live_header(p, op, op);
  return (size_t)(h->base + h->map_size - (const char *)p);
}

void *large_realloc(void *p, size_t size) {
  large_hdr *h = live_header(p, "realloc(): invalid pointer", "realloc(): invalid pointer");
  char *base = h->base;
  size_t offset = (size_t)((char *)p - base), old = h->map_size;
  if (size > PTRDIFF_MAX - offset - FM_UNIT_SIZE) return NULL;
  size_t need = round_unit(offset + size);
  if (need <= old) {
    /* (compared without the alignment's offset, which a 1 GiB alignment makes huge) */
    if (need - offset < (old - offset) / 2 && mapping_resize(base, old, need)) {
      h->map_size = need;
      live_count(0, need - old);
    }
    return p;
  }
  /* Grow with slack, so a buffer grown in small steps stays in place most times; without
   * it when address space is short (ulimit -v). */
  size_t grown = round_unit(need + need / 8);
  if (grown < need) grown = need;
  char *moved = mapping_resize(base, old, grown);
  if (!moved && grown > need) {
    grown = need;
    moved = mapping_resize(base, old, grown);
  }
  if (!moved) return NULL;
  live_count(0, grown - old);
  return place_block(moved, grown, offset);
}

size_t large_expire(bool all) {
  bool threaded = fm_threaded();
  size_t released = 0;
  for (unsigned i = 0; i < fm_arena_count; i++) {
    large_cache *c = &caches[i];
    evicted old = {.n = 0};
    if (all) fm_lock(&c->lock, threaded);
    else if (!__atomic_load_n(&c->bytes, __ATOMIC_RELAXED) || !fm_trylock(&c->lock, threaded))
      continue;
    cache_expire(c, all, &old);
    fm_unlock(&c->lock, threaded);
    released += unmap_evicted(&old);
  }
  return released;
}

void large_lock_all_for_fork(void) {
  for (unsigned i = 0; i < fm_arena_count; i++) fm_lock_for_fork(&caches[i].lock);
}

void large_unlock_all_after_fork(void) {
  for (unsigned i = fm_arena_count; i-- > 0;) fm_lock_after_fork_parent(&caches[i].lock);
}

void large_after_fork_child(void) {
  for (unsigned i = 0; i < fm_arena_count; i++) {
    large_cache *c = &caches[i];
    if (!fm_lock_after_fork_child(&c->lock)) continue;
    fm_count_add(&all_bytes, -c->bytes);
    memset(c->slot, 0, sizeof c->slot);
    c->bytes = 0;
  }
}
