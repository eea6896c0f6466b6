/* Chunks, spans and the unit map. A chunk is FM_CHUNK_SIZE of memory aligned to its size;
 * unit 0 holds its metadata, the other units are grouped into spans. The unit map holds
 * the unit map (unit_map.h) says which class each unit's span holds. Callers hold the
 * owning arena's lock. */
#ifndef FM_CHUNK_H
#define FM_CHUNK_H

#include "size_class.h"
#include "unit_map.h"

struct fm_arena;

/* Free blocks of a span are bits in its chunk's header, not links in the blocks: giving
 * a block back writes nothing into it, a double free is one bit test, and the pages of
 * a partly used span whose blocks are all free can be purged without breaking a list. */
#define FM_SPAN_MAX_BLOCKS (FM_UNIT_SIZE / 16)
#define FM_SPAN_BITMAP_WORDS (FM_SPAN_MAX_BLOCKS / 64)

/* A page span (class FM_CLASS_PAGES) is one unit whose pages are the blocks: a block of
 * 12-64 KiB is a run of whole pages, so blocks of every such size share a unit, and a
 * block's pages are all it touches. Bit i of its masks stands for page i. */

typedef struct fm_span {
  uint32_t used;           /* blocks out of the span: in thread caches or with the user;
                              a page span's pages out */
  union {
    struct {               /* a span of blocks, or of a large block */
      uint32_t capacity;   /* blocks in the span */
      uint16_t scan;       /* no free bit below this bitmap word */
      /* Blocks from this index on were never handed out since the span's units were zero
       * (never touched, or purged): they read zero. capacity when the units were dirty. */
      uint16_t zeroed_from;
    };
    struct {               /* a page span */
      union {
        struct {
          uint16_t free_pages;   /* pages in no block */
          uint16_t run_starts;   /* first pages of the blocks out */
        };
        /* Both at once: a block's length is read from them without the lock (free), so
         * they change together, in one store (page_layout_set). */
        uint32_t page_layout;
      };
      uint16_t zeroed_pages;  /* pages that read zero: not handed out since they were */
      uint16_t touched_starts; /* pages that began a block since they were last clean:
                                  resident, as the mark or the block's user wrote there */
    };
  };
  uint8_t cls;             /* size class, FM_CLASS_SPAN_BLOCK or FM_CLASS_PAGES */
  uint8_t units;           /* length in units */
  uint8_t listed;          /* on its arena's partial list; a page span: the list of its
                              longest free run (0: on none) */
  uint32_t block_size;     /* stride: bytes from one block's start to the next */
  uint32_t index_magic;    /* block index = ((offset >> 4) * index_magic) >> 31, exactly */
  char *start;
  struct fm_arena *arena;
  struct fm_span *next, *prev;
  uint32_t empty_since;    /* for empty spans kept by the arena: purge epoch it emptied in */
  /* A span of small blocks: blocks below this index were handed out since the span was
   * taken from its chunk, so each went back through a path that marks it free
   * (FM_FREED_MARK, or zero once purged); a refill checks that they still are. */
  uint16_t issued;
} fm_span;
_Static_assert(sizeof(fm_span) == 64, "a span's metadata is one cache line");

typedef struct fm_chunk {
  struct fm_arena *arena;
  uint32_t generation;     /* the arena's when mapped (see arena_abandon) */
  struct fm_chunk *next, *prev;
  uint64_t free_units;     /* bit u: unit u belongs to no span */
  uint64_t dirty_units;    /* bit u: a free unit whose pages may still be resident */
  uint64_t stale_units;    /* dirty units that were already free at the last purge tick */
  uint8_t sparse_ticks;    /* purge ticks in a row (up to 2) that found most units free */
  uint8_t head_of[FM_UNITS_PER_CHUNK];   /* unit -> first unit of its span */
  fm_span spans[FM_UNITS_PER_CHUNK];     /* valid at each span's first unit */
  uint64_t free_bits[FM_UNITS_PER_CHUNK][FM_SPAN_BITMAP_WORDS];  /* bit i: block i is free */
} fm_chunk;
_Static_assert(sizeof(fm_chunk) <= FM_UNIT_SIZE, "chunk metadata fits in unit 0");

#define FM_CHUNK_ALL_UNITS (~(uint64_t)1)  /* unit 0 is the metadata */

static inline fm_chunk *chunk_of(const void *p) {
  return (fm_chunk *)((uintptr_t)p & ~(uintptr_t)(FM_CHUNK_SIZE - 1));
}

static inline fm_span *span_of(const void *p) {
  fm_chunk *chunk = chunk_of(p);
  unsigned unit = (unsigned)((uintptr_t)p >> FM_UNIT_SHIFT) & (FM_UNITS_PER_CHUNK - 1);
  return &chunk->spans[chunk->head_of[unit]];
}

static inline size_t span_bytes(const fm_span *span) { return (size_t)span->units * FM_UNIT_SIZE; }

/* The span's first unit: its start, unless a small-class span's colour moved that on. */
static inline char *span_base(const fm_span *span) {
  return (char *)((uintptr_t)span->start & ~(uintptr_t)(FM_UNIT_SIZE - 1));
}

static inline uint64_t *span_free_bits(fm_span *span) {
  fm_chunk *chunk = chunk_of(span);
  return chunk->free_bits[span - chunk->spans];
}

/* Page i of the unit p lies in (for a page span). */
static inline unsigned page_index(const void *p) {
  return (unsigned)((uintptr_t)p / FM_PAGE_SIZE) & (FM_PAGES_PER_UNIT - 1);
}

/* Sets a page span's free pages and block starts at once (see page_layout). */
static inline void page_layout_set(fm_span *span, uint32_t free_pages, uint32_t run_starts) {
  __atomic_store_n(&span->page_layout, (free_pages & 0xffffu) | run_starts << 16, __ATOMIC_RELAXED);
}

/* Pages in the block that starts at page `first` of a page span: up to the next block's
 * first page or the next free page. */
static inline unsigned page_run_length(const fm_span *span, unsigned first) {
  uint32_t layout = __atomic_load_n(&span->page_layout, __ATOMIC_RELAXED);
  uint32_t ends = ((layout & 0xffffu) | layout >> 16) >> (first + 1);
  return (unsigned)__builtin_ctz(ends | 1u << (FM_PAGES_PER_UNIT - 1 - first)) + 1;
}

/* Whether p starts a block out of its page span (a block's first page is never free). */
static inline bool page_block_at(const fm_span *span, const void *p) {
  return span->cls == FM_CLASS_PAGES && !((uintptr_t)p & (FM_PAGE_SIZE - 1)) &&
         (__atomic_load_n(&span->page_layout, __ATOMIC_RELAXED) >> (16 + page_index(p)) & 1);
}

/* The pages of block p of a page span when p starts a block out of it, else 0. Takes no
 * lock: a block's own pages do not change while it is out, so the answer holds for a live
 * block; for any other pointer it is a hint (arena_free_pages gives the verdict). */
static inline unsigned page_block_pages(const void *p) {
  const fm_span *span = span_of(p);
  return page_block_at(span, p) ? page_run_length(span, page_index(p)) : 0;
}

/* Whether most of the chunk's units are free. */
static inline bool chunk_mostly_free(const fm_chunk *chunk) {
  return (unsigned)__builtin_popcountll(chunk->free_units) > FM_UNITS_PER_CHUNK / 2;
}

/* Sets up chunk metadata in fresh, chunk-aligned memory from the OS; NULL on failure. */
fm_chunk *chunk_init(void *memory, struct fm_arena *arena, uint32_t generation);
void chunk_delete(fm_chunk *chunk);
/* A span of `units` free units of chunk (only units whose pages may still be resident,
 * when resident_only), or NULL; unit-map entries are set to cls. Free units are dirty (their
 * pages may hold data) unless never used or purged since; *clean: how many it took that
 * were not. */
fm_span *chunk_take_span(fm_chunk *chunk, unsigned units, unsigned cls, bool resident_only,
                         unsigned *clean);
/* Frees the span's units; purged says their pages were already given back to the OS. */
void chunk_give_back_span(fm_span *span, bool purged);
/* Resizes the span of a large block in place to `units` units: it takes the free units
 * that follow it (false when one of them is not free, or the chunk ends first), or gives
 * back its last ones, dirty. Its unit-map entries follow. */
bool chunk_resize_span_block(fm_span *span, unsigned units);
/* The free units whose pages may still be resident. */
unsigned chunk_dirty_free_units(const fm_chunk *chunk);
/* Purges up to `most` dirty free units, the highest first; returns how many it purged.
 * *refused: set when the OS refused a purge. */
unsigned chunk_purge_highest(fm_chunk *chunk, unsigned most, bool *refused);
/* Purges the dirty free units that stayed free since the last tick (all when force),
 * but for the lowest *keep of them, which stay dirty (*keep counts down by those kept),
 * and starts the next generation (a tick's: sparse_ticks too, unless force); returns
 * bytes purged. */
size_t chunk_purge(fm_chunk *chunk, bool force, unsigned *keep);

#endif
