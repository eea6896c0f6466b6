/* Mapped blocks in mappings of their own (2 MiB-aligned, FM_MAPPED_ALIGN). The header
 * sits just before the block; the unit map marks every unit of the mapping
 * FM_CLASS_MAPPED, so free() finds it in one load. Freed mappings wait briefly in a cache
 * for the next mapped blocks, which take them whole, split, joined or put together. */
#include "mapped.h"

#include <string.h>

#include "options.h"

typedef struct mapped_header {
  uintptr_t check;   /* block address ^ diag_key while live, ^ ~diag_key once freed */
  char *base;        /* start of the mapping */
  size_t map_size;
  size_t unused;
} mapped_header;

#define MAPPED_BLOCK_OFFSET 64   /* block start from the mapping start, default alignment */

/* A mapping that compose put together from freed ones is several kernel mappings, and
 * mremap moves or grows one kernel mapping at a time. Where its second and later pieces
 * start (in units, 0 after the last) is kept in the mapping's first bytes, before the
 * header, which no block reaches; a mapping of one piece has none. */
#define PIECES_MAX 16
#define PIECED_MAX_BYTES ((size_t)UINT16_MAX << FM_UNIT_SHIFT)   /* the starts' reach */
typedef struct piece_starts {
  uint16_t unit[PIECES_MAX - 1];
} piece_starts;
_Static_assert(sizeof(piece_starts) + sizeof(mapped_header) <= MAPPED_BLOCK_OFFSET,
               "the piece starts and the header fit before the block");

static piece_starts *starts_of(char *base) { return (piece_starts *)base; }

static unsigned piece_count(const piece_starts *s) {
  unsigned n = 1;
  while (n < PIECES_MAX && s->unit[n - 1]) n++;
  return n;
}

/* Where piece i of a mapping of map_size bytes with starts s begins and ends, in bytes. */
static size_t piece_begin(const piece_starts *s, unsigned i) {
  return i ? (size_t)s->unit[i - 1] << FM_UNIT_SHIFT : 0;
}
static size_t piece_end(const piece_starts *s, unsigned i, size_t map_size) {
  return i + 1 < PIECES_MAX && s->unit[i] ? (size_t)s->unit[i] << FM_UNIT_SHIFT : map_size;
}

/* Forgets the pieces of the mapping at base that begin at or past size (cut off). */
static void pieces_cut(char *base, size_t size) {
  piece_starts *s = starts_of(base);
  for (unsigned i = 0; i < PIECES_MAX - 1; i++)
    if (((size_t)s->unit[i] << FM_UNIT_SHIFT) >= size) s->unit[i] = 0;
}

/* Freed mappings wait in a cache per arena (sizes: config.h): a thread frees into its
 * arena's and takes from it first, so it reuses its own pages, still in its CPU's caches,
 * and threads do not share one lock. */

typedef struct mapping {
  char *base;
  size_t map_size;
} mapping;

typedef struct mapping_cache {
  lock_t lock;
  size_t bytes;   /* written under the lock, read without it as a hint */
  struct {
    mapping m;
    uint64_t freed_ns;
  } slot[FM_MAPPED_CACHE_SLOTS];
} __attribute__((aligned(64))) mapping_cache;

static mapping_cache caches[FM_ARENAS_MAX];
static size_t caches_bytes;   /* in every cache together, through lock_add */
static unsigned visit_next;                     /* the cache whose expiry a call also runs */

/* The live blocks and their mappings' bytes (modular counts through lock_add: a decrease
 * is the addition of its two's complement), their highest, and how many blocks took a new
 * mapping or a cached one. */
static mapped_statistics figures;

/* What a cache may hold, and all together: a fixed allowance, or half the live blocks'
 * mappings if more. A program whose big blocks change size then reuses their pages
 * (compose) rather than have fresh ones faulted in; what it does not reuse goes after the
 * purge delay, and the cap bounds the pages kept meanwhile. */
static size_t with_live_share(size_t fixed) {
  size_t share = __atomic_load_n(&figures.live_bytes, __ATOMIC_RELAXED) / 2;
  return share > fixed ? share : fixed;
}
static size_t cache_max_bytes(void) { return with_live_share(FM_MAPPED_CACHE_BYTES); }
static size_t all_max_bytes(void) {
  return with_live_share(arena_count <= 2 ? FM_MAPPED_CACHE_BYTES
                                          : arena_count * FM_MAPPED_CACHE_ARENA_SHARE);
}

/* Mappings taken out of caches under their locks, to unmap once those are released:
 * munmap waits for the kernel's mapping lock and shoots down TLBs, too long to hold a
 * lock other threads' mapped mallocs and frees take. A call empties at most its own cache
 * and one other. */
typedef struct evicted {
  mapping m[2 * FM_MAPPED_CACHE_SLOTS];
  unsigned n;
} evicted;

static size_t round_unit(size_t n) { return (n + FM_UNIT_SIZE - 1) & ~(FM_UNIT_SIZE - 1); }
static size_t round_mapping(size_t n) {
  return (n + FM_MAPPED_ALIGN - 1) & ~(FM_MAPPED_ALIGN - 1);
}

/* A fresh mapping of size bytes (a multiple of FM_MAPPED_ALIGN) for a block; dense: the
 * program will write most of it, so once FM_HUGE_PAGES_FROM is mapped (before it) it asks
 * for transparent huge pages (config.h), unless FASTMALLOC_HUGE_PAGES=0. */
static char *map_fresh(size_t size, bool dense) {
  bool huge = dense && options.huge_pages && os_mapped_bytes() >= FM_HUGE_PAGES_FROM;
  char *p = os_map_aligned(size, FM_MAPPED_ALIGN);
  if (p && huge) os_advise_huge_pages(p, size, true);
  return p;
}

static mapped_header *header_of(const void *p) { return (mapped_header *)p - 1; }

/* The header of live block p, or a fatal report: op, or freed_op for a block freed already
 * (free names a double free, the other calls their own misuse). */
static mapped_header *live_header(const void *p, diag_report op, diag_report freed_op) {
  if (((uintptr_t)p & 15) ||
      unit_map_class_checked((const char *)p - sizeof(mapped_header)) != FM_CLASS_MAPPED)
    diag_fatal(op, p);
  mapped_header *h = header_of(p);
  if (h->check != ((uintptr_t)p ^ diag_key))
    diag_fatal(h->check == ((uintptr_t)p ^ ~diag_key) ? freed_op : op, p);
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
static mapping cache_remove(mapping_cache *c, unsigned i) {
  mapping m = c->slot[i].m;
  __atomic_store_n(&c->bytes, c->bytes - m.map_size, __ATOMIC_RELAXED);
  lock_add(&caches_bytes, -m.map_size);
  c->slot[i].m.base = NULL;
  return m;
}

/* Under c's lock: m joined with the cached mappings next to it on either side (the parts
 * of a mapping split for a block come together again once it is freed, and the next
 * block takes them whole), as far as PIECES_MAX and the starts' reach allow; *freed_ns:
 * the latest of their times. */
static mapping cache_join_neighbours(mapping_cache *c, mapping m, uint64_t *freed_ns) {
  for (int i = 0; i < FM_MAPPED_CACHE_SLOTS; i++) {
    mapping e = c->slot[i].m;
    if (!e.base || (e.base + e.map_size != m.base && m.base + m.map_size != e.base)) continue;
    mapping low = e.base < m.base ? e : m, high = e.base < m.base ? m : e;
    piece_starts *low_starts = starts_of(low.base);
    const piece_starts *high_starts = starts_of(high.base);
    unsigned low_n = piece_count(low_starts), high_n = piece_count(high_starts);
    if (low_n + high_n > PIECES_MAX || low.map_size + high.map_size > PIECED_MAX_BYTES) continue;
    uint16_t shift = (uint16_t)(low.map_size >> FM_UNIT_SHIFT);
    low_starts->unit[low_n - 1] = shift;
    for (unsigned k = 1; k < high_n; k++)
      low_starts->unit[low_n - 1 + k] = (uint16_t)(high_starts->unit[k - 1] + shift);
    if (c->slot[i].freed_ns > *freed_ns) *freed_ns = c->slot[i].freed_ns;
    cache_remove(c, (unsigned)i);
    m = (mapping){low.base, low.map_size + high.map_size};
    i = -1;   /* (the joined mapping may have a neighbour on its other side) */
  }
  return m;
}

/* Under c's lock: keeps mapping m, freed at freed_ns, joined with its cached neighbours,
 * if both allowances have room and c a slot. */
static bool cache_insert(mapping_cache *c, mapping m, uint64_t freed_ns) {
  if (c->bytes + m.map_size > cache_max_bytes() ||
      __atomic_load_n(&caches_bytes, __ATOMIC_RELAXED) + m.map_size > all_max_bytes())
    return false;
  m = cache_join_neighbours(c, m, &freed_ns);
  int slot = -1;
  for (int i = 0; i < FM_MAPPED_CACHE_SLOTS && slot < 0; i++)
    if (!c->slot[i].m.base) slot = i;
  if (slot < 0) return false;   /* (only when nothing joined: a join frees a slot) */
  c->slot[slot].m = m;
  c->slot[slot].freed_ns = freed_ns;
  __atomic_store_n(&c->bytes, c->bytes + m.map_size, __ATOMIC_RELAXED);
  lock_add(&caches_bytes, m.map_size);
  return true;
}

/* Under c's lock: evicts the mappings freed longer ago than the purge delay (all when
 * force). */
static void cache_evict_old(mapping_cache *c, bool force, evicted *out) {
  if (!c->bytes) return;
  uint64_t now = os_now_ns();
  for (unsigned i = 0; i < FM_MAPPED_CACHE_SLOTS; i++)
    if (c->slot[i].m.base && (force || now - c->slot[i].freed_ns >= options.purge_delay_ns))
      out->m[out->n++] = cache_remove(c, i);
}

/* Expires one other cache in turn, unless its lock is busy: caches of arenas nobody uses
 * any more still give their mappings back. */
static void cache_visit_other(evicted *out, bool threaded) {
  mapping_cache *c = &caches[__atomic_fetch_add(&visit_next, 1, __ATOMIC_RELAXED) % arena_count];
  if (!__atomic_load_n(&c->bytes, __ATOMIC_RELAXED) || !lock_try(&c->lock, threaded)) return;
  cache_evict_old(c, false, out);
  lock_release(&c->lock, threaded);
}

/* Under c's lock: removes and returns its smallest mapping of at least `need` bytes, or
 * with need 0 its biggest one, of one piece if whole_only; {NULL} when it has none. */
static mapping cache_remove_fit(mapping_cache *c, size_t need, bool whole_only) {
  int best = -1;
  for (int i = 0; i < FM_MAPPED_CACHE_SLOTS; i++) {
    size_t size = c->slot[i].m.map_size;
    if (!c->slot[i].m.base || size < need) continue;
    if (whole_only && piece_count(starts_of(c->slot[i].m.base)) > 1) continue;
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
    diag_fatal(DIAG_MOVED_BLOCK_LOST, start);
  if (start > raw) memmove(start, raw, old);
  size_t head = (size_t)(start - raw);
  if (head) os_unmap(raw, head);
  if (head < FM_UNIT_SIZE) os_unmap(start + size, FM_UNIT_SIZE - head);
  return start;
}

/* Resizes mapping base of several pieces: shrinks it, or grows its last piece in place
 * (moving the pieces one by one could fail half-way, with a block in two places); returns
 * base, or NULL with the mapping unchanged. */
static char *pieces_resize(char *base, size_t old, size_t size) {
  piece_starts *starts = starts_of(base);
  if (size < old) {
    unit_map_set(base + size, old - size, 0);
    os_unmap(base + size, old - size);   /* (munmap, unlike mremap, spans kernel mappings) */
    pieces_cut(base, size);
    return base;
  }
  size_t last = piece_begin(starts, piece_count(starts) - 1);
  if (!os_remap(base + last, old - last, size - last)) return NULL;
  if (unit_map_set(base + old, size - old, FM_CLASS_MAPPED)) return base;
  os_remap(base + last, size - last, old - last);
  return NULL;
}

/* Resizes mapping base (unit-map entries included) in place or by moving it to an
 * aligned place; returns its new start, or NULL with the mapping unchanged. Unit-map
 * entries of a range are cleared before the kernel gets the range back, since another
 * thread may map it the moment it is free. */
static char *mapping_resize(char *base, size_t old, size_t size) {
  if (piece_count(starts_of(base)) > 1) return pieces_resize(base, old, size);
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
  char *dest = map_fresh(size, true);
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

/* A cached mapping compose takes apart, with its pieces' starts read before they move,
 * and the bytes it gives from its start. */
typedef struct source {
  mapping m;
  uint64_t freed_ns;
  piece_starts starts;
  size_t len;
} source;

/* How many pieces of a mapping with starts s begin in its first len bytes. */
static unsigned pieces_within(const piece_starts *s, size_t len) {
  unsigned n = 0;
  while (n < piece_count(s) && piece_begin(s, n) < len) n++;
  return n;
}

/* Under c's lock: removes the mappings compose takes, biggest first, until they cover
 * need bytes or the result would have more than PIECES_MAX pieces (one kept for a fresh
 * tail). Returns how many it put in src. */
static unsigned compose_sources(mapping_cache *c, size_t need, source *src) {
  unsigned n = 0, pieces = 0;
  for (size_t covered = 0; covered < need;) {
    int big = -1;
    for (int i = 0; i < FM_MAPPED_CACHE_SLOTS; i++)
      if (c->slot[i].m.base && (big < 0 || c->slot[i].m.map_size > c->slot[big].m.map_size))
        big = i;
    if (big < 0) break;
    source s = {c->slot[big].m, c->slot[big].freed_ns, *starts_of(c->slot[big].m.base), 0};
    s.len = need - covered < s.m.map_size ? need - covered : s.m.map_size;
    if (s.len < need - covered) s.len &= ~(FM_MAPPED_ALIGN - 1);   /* the next starts aligned */
    unsigned used = pieces_within(&s.starts, s.len);
    if (!s.len || pieces + used > PIECES_MAX - 1) break;
    pieces += used;
    covered += s.len;
    cache_remove(c, (unsigned)big);
    src[n++] = s;
  }
  return n;
}

/* Caches the part of mapping s from byte len on, which a block did not take: a mapping of
 * its own, its piece starts rebased; unmapped when the cache has no room left. */
static void keep_rest(mapping_cache *c, const source *s, size_t len, bool threaded) {
  mapping rest = {s->m.base + len, s->m.map_size - len};
  piece_starts starts = {{0}};
  unsigned count = 0;
  for (unsigned i = pieces_within(&s->starts, len); i < piece_count(&s->starts); i++)
    if (piece_begin(&s->starts, i) > len)   /* (one that begins at len is the rest's first) */
      starts.unit[count++] = (uint16_t)((piece_begin(&s->starts, i) - len) >> FM_UNIT_SHIFT);
  *starts_of(rest.base) = starts;
  lock_take(&c->lock, threaded);
  bool kept = cache_insert(c, rest, s->freed_ns);
  lock_release(&c->lock, threaded);
  if (!kept) unmap_block(rest.base, rest.map_size);
}

/* A mapping of need bytes for a thread of cache c when no cached one is big enough: the
 * pages of c's mappings, biggest first, move into a fresh one (mremap moves page tables:
 * nothing is faulted in, zeroed or copied), so the pages freed by blocks of other sizes
 * serve it; the rest of it is fresh. The last mapping taken may give only its first part.
 * {NULL} when c holds none or out of memory (c keeps its mappings then). */
static mapping compose(mapping_cache *c, size_t need, bool threaded) {
  if (need > PIECED_MAX_BYTES) return (mapping){NULL, 0};
  source src[FM_MAPPED_CACHE_SLOTS];
  lock_take(&c->lock, threaded);
  unsigned n = compose_sources(c, need, src);
  lock_release(&c->lock, threaded);
  if (!n) return (mapping){NULL, 0};
  char *dest = map_fresh(need, true);
  if (dest && !unit_map_set(dest, need, FM_CLASS_MAPPED)) {
    os_unmap(dest, need);
    dest = NULL;
  }
  piece_starts starts = {{0}};
  unsigned count = 0;   /* starts recorded */
  size_t at = 0;        /* dest's bytes filled so far */
  bool moving = dest != NULL;
  for (unsigned k = 0; k < n; k++) {
    const source *s = &src[k];
    size_t len = moving ? s->len : 0;
    if (len < s->m.map_size) keep_rest(c, s, len, threaded);
    if (!len) continue;
    unit_map_set(s->m.base, len, 0);
    unsigned used = pieces_within(&s->starts, len);
    for (unsigned i = 0; i < used; i++) {
      size_t from = piece_begin(&s->starts, i), to = piece_end(&s->starts, i, s->m.map_size);
      if (to > len) to = len;
      if (at + from) starts.unit[count++] = (uint16_t)((at + from) >> FM_UNIT_SHIFT);
      if (os_move(s->m.base + from, to - from, dest + at + from, to - from)) continue;
      /* Refused (out of mapping slots, or a source the program split with mprotect or
       * madvise): the rest of the source goes, and dest too, but for this piece's place,
       * which older kernels free before they refuse, so another thread may map it: left
       * as it is, marked ours and never reused, as in mapping_resize. */
      os_unmap(s->m.base + from, len - from);
      size_t hole = at + from, hole_end = at + to;
      unit_map_set(dest, hole, 0);
      if (hole) os_unmap(dest, hole);
      unit_map_set(dest + hole_end, need - hole_end, 0);
      if (hole_end < need) os_unmap(dest + hole_end, need - hole_end);
      dest = NULL;
      moving = false;
      break;
    }
    at += len;
  }
  if (!dest) return (mapping){NULL, 0};
  if (at < need) starts.unit[count++] = (uint16_t)(at >> FM_UNIT_SHIFT);   /* the fresh tail */
  *starts_of(dest) = starts;
  return (mapping){dest, need};
}

/* A cached mapping of at least `need` bytes for a thread of arena `own`: the smallest that
 * fits in its own cache, else in another's (trimmed only if over 4x and 8 MiB too big),
 * else one composed of its own cache's; {NULL} when none is cached. Its pages are mostly
 * resident already, so the caller faults in few. A growing block (realloc's) takes only
 * mappings of one piece, which mremap moves whole, and grows its own cache's biggest. */
static mapping mapping_cache_take(unsigned own, size_t need, bool growing) {
  evicted old = {.n = 0};
  bool threaded = lock_threaded();
  mapping_cache *mine = &caches[own];
  lock_take(&mine->lock, threaded);
  cache_evict_old(mine, false, &old);
  mapping got = cache_remove_fit(mine, need, growing);
  lock_release(&mine->lock, threaded);
  for (unsigned k = 1; k < arena_count && !got.base; k++) {
    mapping_cache *c = &caches[(own + k) % arena_count];
    if (!__atomic_load_n(&c->bytes, __ATOMIC_RELAXED) || !lock_try(&c->lock, threaded)) continue;
    got = cache_remove_fit(c, need, growing);
    lock_release(&c->lock, threaded);
  }
  if (!got.base && growing) {
    lock_take(&mine->lock, threaded);
    got = cache_remove_fit(mine, 0, true);
    lock_release(&mine->lock, threaded);
  }
  cache_visit_other(&old, threaded);
  unmap_evicted(&old);
  if (!got.base && !growing) return compose(mine, need, threaded);
  if (!growing && got.map_size - need >= FM_MAPPED_ALIGN) {
    /* The rest serves the next blocks, compose's above all, rather than sit in this one. */
    source s = {got, os_now_ns(), *starts_of(got.base), need};
    keep_rest(mine, &s, need, threaded);
    got.map_size = need;
    pieces_cut(got.base, need);
    return got;
  }
  if (got.base && (got.map_size < need ||
                   (got.map_size / 4 > need && got.map_size - need > FM_MAPPED_TAKE_SLACK))) {
    char *resized = mapping_resize(got.base, got.map_size, need);
    if (!resized) unmap_block(got.base, got.map_size);
    got = (mapping){resized, need};
  }
  return got;
}

/* Keeps a freed mapping in arena own's cache, first evicting its oldest ones if it is
 * full; false when it cannot be kept (too big, or the other caches hold the whole
 * allowance). */
static bool mapping_cache_put(unsigned own, char *base, size_t map_size) {
  if (map_size > FM_MAPPED_CACHE_BYTES / 2) return false;
  evicted old = {.n = 0};
  bool threaded = lock_threaded();
  mapping_cache *c = &caches[own];
  bool kept = false;
  uint64_t now = os_now_ns();
  lock_take(&c->lock, threaded);
  cache_evict_old(c, false, &old);
  for (;;) {
    if (cache_insert(c, (mapping){base, map_size}, now)) {
      kept = true;
      break;
    }
    int oldest = -1;
    for (int i = 0; i < FM_MAPPED_CACHE_SLOTS; i++)
      if (c->slot[i].m.base && (oldest < 0 || c->slot[i].freed_ns < c->slot[oldest].freed_ns))
        oldest = i;
    if (oldest < 0) break;
    old.m[old.n++] = cache_remove(c, (unsigned)oldest);
  }
  lock_release(&c->lock, threaded);
  cache_visit_other(&old, threaded);
  unmap_evicted(&old);
  return kept;
}

/* Raises *highest to value, unless it is higher already. */
static void raise_to(size_t *highest, size_t value) {
  size_t seen = __atomic_load_n(highest, __ATOMIC_RELAXED);
  while (seen < value && !__atomic_compare_exchange_n(highest, &seen, value, true,
                                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

static void live_count(size_t blocks, size_t bytes) {
  lock_add(&figures.live_blocks, blocks);
  lock_add(&figures.live_bytes, bytes);
  raise_to(&figures.max_blocks, __atomic_load_n(&figures.live_blocks, __ATOMIC_RELAXED));
  raise_to(&figures.max_bytes, __atomic_load_n(&figures.live_bytes, __ATOMIC_RELAXED));
}

void mapped_figures(mapped_statistics *out) {
  out->live_blocks = __atomic_load_n(&figures.live_blocks, __ATOMIC_RELAXED);
  out->live_bytes = __atomic_load_n(&figures.live_bytes, __ATOMIC_RELAXED);
  out->max_blocks = __atomic_load_n(&figures.max_blocks, __ATOMIC_RELAXED);
  out->max_bytes = __atomic_load_n(&figures.max_bytes, __ATOMIC_RELAXED);
  out->new_mappings = __atomic_load_n(&figures.new_mappings, __ATOMIC_RELAXED);
  out->cached_mappings = __atomic_load_n(&figures.cached_mappings, __ATOMIC_RELAXED);
}

static void *place_block(char *base, size_t map_size, size_t offset) {
  char *p = base + offset;
  mapped_header *h = header_of(p);
  h->base = base;
  h->map_size = map_size;
  h->check = (uintptr_t)p ^ diag_key;
  return p;
}

void *mapped_alloc(size_t size, size_t align, const fm_arena *arena, large_use use, bool *zeroed) {
  size_t offset = align > MAPPED_BLOCK_OFFSET ? align : MAPPED_BLOCK_OFFSET;
  if (size > PTRDIFF_MAX - offset - FM_MAPPED_ALIGN) return NULL;
  if (size == 0) size = 1;   /* the block must lie inside its mapping */
  size_t need = round_mapping(offset + size);
  mapping got = {NULL, 0};
  if (offset == MAPPED_BLOCK_OFFSET)
    got = mapping_cache_take((unsigned)(arena - arenas), need, use == LARGE_GROWING);
  *zeroed = !got.base;
  if (!got.base && align <= FM_MAPPED_ALIGN)
    got = (mapping){map_fresh(need, use != LARGE_ZEROED), need};
  if (!got.base) {   /* (a bigger alignment, or short of address space: no rounding) */
    need = round_unit(offset + size);
    got = (mapping){os_map_aligned(need, align > FM_UNIT_SIZE ? align : FM_UNIT_SIZE), need};
    if (!got.base) return NULL;
  }
  if (*zeroed) {
    if (!unit_map_set(got.base, need, FM_CLASS_MAPPED)) {
      os_unmap(got.base, need);
      return NULL;
    }
  }
  lock_add(*zeroed ? &figures.new_mappings : &figures.cached_mappings, 1);
  live_count(1, got.map_size);
  return place_block(got.base, got.map_size, offset);
}

void mapped_free(void *p, const fm_arena *arena) {
  mapped_header *h = live_header(p, DIAG_INVALID_FREE, DIAG_DOUBLE_FREE);
  h->check = (uintptr_t)p ^ ~diag_key;
  live_count((size_t)-1, -h->map_size);
  if ((char *)p == h->base + MAPPED_BLOCK_OFFSET &&
      mapping_cache_put((unsigned)(arena - arenas), h->base, h->map_size))
    return;
  unmap_block(h->base, h->map_size);
}

size_t mapped_usable_size(const void *p, diag_report op) {
  mapped_header *h = live_header(p, op, op);
  return (size_t)(h->base + h->map_size - (const char *)p);
}

void *mapped_realloc(void *p, size_t size) {
  mapped_header *h = live_header(p, DIAG_INVALID_REALLOC, DIAG_INVALID_REALLOC);
  char *base = h->base;
  size_t offset = (size_t)((char *)p - base), old = h->map_size;
  if (size > PTRDIFF_MAX - offset - FM_MAPPED_ALIGN) return NULL;
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
  size_t grown = round_mapping(need + need / 8);
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

size_t mapped_cache_unmap(bool all) {
  bool threaded = lock_threaded();
  size_t released = 0;
  for (unsigned i = 0; i < arena_count; i++) {
    mapping_cache *c = &caches[i];
    evicted old = {.n = 0};
    if (all) lock_take(&c->lock, threaded);
    else if (!__atomic_load_n(&c->bytes, __ATOMIC_RELAXED) || !lock_try(&c->lock, threaded))
      continue;
    cache_evict_old(c, all, &old);
    lock_release(&c->lock, threaded);
    released += unmap_evicted(&old);
  }
  return released;
}

void mapped_lock_all_for_fork(void) {
  for (unsigned i = 0; i < arena_count; i++) lock_for_fork(&caches[i].lock);
}

void mapped_unlock_all_after_fork(void) {
  for (unsigned i = arena_count; i-- > 0;) lock_after_fork_parent(&caches[i].lock);
}

void mapped_after_fork_child(void) {
  for (unsigned i = 0; i < arena_count; i++) {
    mapping_cache *c = &caches[i];
    if (!lock_after_fork_child(&c->lock)) continue;
    lock_add(&caches_bytes, -c->bytes);
    memset(c->slot, 0, sizeof c->slot);
    c->bytes = 0;
  }
}
