/* The heap's figures of stats.h: glibc's shapes for the programs that read them, and
 * fastmalloc's own report. Every figure comes from what the arenas and the mapped blocks'
 * counters hold when read: nothing is counted on a fast path. */
#include "stats.h"

#include <errno.h>

#include "arena.h"
#include "diag.h"
#include "init.h"
#include "mapped.h"
#include "options.h"
#include "tcache.h"

struct mallinfo2 stats_mallinfo2(void) {
  struct mallinfo2 info = {0};
  if (!init_process()) return info;
  mapped_statistics mapped;
  mapped_figures(&mapped);
  info.hblks = mapped.live_blocks;
  info.hblkhd = mapped.live_bytes;
  for (unsigned i = 0; i < arena_count; i++) {
    arena_census census;
    arena_take_census(&arenas[i], &census);
    info.uordblks += census.used;
  }
  info.uordblks += info.hblkhd;
  info.arena = os_mapped_bytes();
  info.fordblks = info.arena > info.uordblks ? info.arena - info.uordblks : 0;
  return info;
}

/* Lines built in a buffer, written to stderr or a stream when full or done. */
typedef struct out {
  char buf[512];
  diag_text t;
  FILE *stream;   /* NULL: stderr, with write(2) */
  bool failed;
} out;

static void out_open(out *o, FILE *stream) {
  o->t = diag_text_in(o->buf, sizeof o->buf);
  o->stream = stream;
  o->failed = false;
}

static void out_flush(out *o) {
  diag_finish(&o->t);
  if (o->stream) o->failed |= fputs(o->buf, o->stream) < 0;
  else diag_print(o->buf);
  o->t = diag_text_in(o->buf, sizeof o->buf);
}

static void put(out *o, const char *text) {
  if (o->t.end - o->t.at < 128) out_flush(o);
  diag_append(&o->t, text);
}

/* value right-aligned in `width` columns (0: as it is). */
static void put_u64(out *o, uint64_t value, unsigned width) {
  char digits[24];
  diag_text d = diag_text_in(digits, sizeof digits);
  diag_append_u64(&d, value, 10);
  diag_finish(&d);
  for (unsigned n = (unsigned)(d.at - digits); n < width; n++) put(o, " ");
  put(o, digits);
}

/* name="value" */
static void put_attribute(out *o, const char *name, uint64_t value) {
  put(o, " ");
  put(o, name);
  put(o, "=\"");
  put_u64(o, value, 0);
  put(o, "\"");
}

/* The arenas' census, and their totals. */
typedef struct heap {
  arena_census arenas[FM_ARENAS_MAX];
  arena_census total;
  mapped_statistics mapped;
} heap;

static void heap_read(heap *h) {
  h->total = (arena_census){0};
  for (unsigned i = 0; i < arena_count; i++) {
    arena_census *c = &h->arenas[i];
    arena_take_census(&arenas[i], c);
    h->total.mapped += c->mapped;
    h->total.used += c->used;
    for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
      h->total.classes[cls].spans += c->classes[cls].spans;
      h->total.classes[cls].out += c->classes[cls].out;
      h->total.classes[cls].free += c->classes[cls].free;
    }
    h->total.page_spans += c->page_spans;
    h->total.pages_out += c->pages_out;
    h->total.pages_free += c->pages_free;
    h->total.span_blocks += c->span_blocks;
    const arena_counters *from = &c->counters;
    arena_counters *to = &h->total.counters;
    to->refills += from->refills;
    to->blocks_refilled += from->blocks_refilled;
    to->flushes += from->flushes;
    to->blocks_flushed += from->blocks_flushed;
    to->blocks_handed_over += from->blocks_handed_over;
    to->page_blocks_taken += from->page_blocks_taken;
    to->page_blocks_given += from->page_blocks_given;
    to->span_blocks_taken += from->span_blocks_taken;
    to->bytes_purged += from->bytes_purged;
    to->spans_taken += from->spans_taken;
  }
  mapped_figures(&h->mapped);
}

/* fastmalloc's report: the mapped and used bytes, the caller's cache, the slow paths'
 * counters, and per size class the spans and blocks. */
static void report(out *o, const heap *h) {
  put(o, "fastmalloc: mapped ");
  put_u64(o, os_mapped_bytes(), 0);
  put(o, " bytes (peak ");
  put_u64(o, os_mapped_peak_bytes(), 0);
  put(o, "); in blocks out ");
  put_u64(o, h->total.used + h->mapped.live_bytes, 0);
  put(o, " bytes (with the program or in thread caches)\n");
  size_t cached_bytes, cached_blocks;
  tcache_holdings(&cached_bytes, &cached_blocks);
  put(o, "fastmalloc: this thread's cache holds ");
  put_u64(o, cached_blocks, 0);
  put(o, " blocks, ");
  put_u64(o, cached_bytes, 0);
  put(o, " bytes\n");
  const arena_counters *c = &h->total.counters;
  put(o, "fastmalloc: refills ");
  put_u64(o, c->refills, 0);
  put(o, " (");
  put_u64(o, c->blocks_refilled, 0);
  put(o, " blocks), new spans ");
  put_u64(o, c->spans_taken, 0);
  put(o, ", flushes ");
  put_u64(o, c->flushes, 0);
  put(o, " (");
  put_u64(o, c->blocks_flushed, 0);
  put(o, " blocks, ");
  put_u64(o, c->blocks_handed_over, 0);
  put(o, " handed over), purged ");
  put_u64(o, c->bytes_purged, 0);
  put(o, " bytes\n");
  put(o, "fastmalloc: page blocks taken ");
  put_u64(o, c->page_blocks_taken, 0);
  put(o, ", given back ");
  put_u64(o, c->page_blocks_given, 0);
  put(o, "; span blocks taken ");
  put_u64(o, c->span_blocks_taken, 0);
  put(o, ", out ");
  put_u64(o, h->total.span_blocks, 0);
  put(o, "; mapped blocks out ");
  put_u64(o, h->mapped.live_blocks, 0);
  put(o, " (");
  put_u64(o, h->mapped.live_bytes, 0);
  put(o, " bytes), new mappings ");
  put_u64(o, h->mapped.new_mappings, 0);
  put(o, ", cached ones ");
  put_u64(o, h->mapped.cached_mappings, 0);
  put(o, "\n");
  put(o, "fastmalloc:  class  size  spans  blocks out  blocks free\n");
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
    if (!h->total.classes[cls].spans) continue;
    put(o, "fastmalloc: ");
    put_u64(o, cls, 6);
    put_u64(o, size_class_size[cls], 6);
    put_u64(o, h->total.classes[cls].spans, 7);
    put_u64(o, h->total.classes[cls].out, 12);
    put_u64(o, h->total.classes[cls].free, 13);
    put(o, "\n");
  }
  put(o, "fastmalloc: page spans ");
  put_u64(o, h->total.page_spans, 0);
  put(o, ", pages out ");
  put_u64(o, h->total.pages_out, 0);
  put(o, ", pages free ");
  put_u64(o, h->total.pages_free, 0);
  put(o, "\n");
}

/* glibc's lines first (per arena "system bytes" and "in use bytes", then the totals),
 * so scripts that read them keep working; fastmalloc's report after them. */
static lock_t stats_lock = LOCK_INIT;   /* for the one heap the calls below read into */
static heap h;   /* (about 40 KiB: not on a caller's stack) */

void stats_print(void) {
  if (!init_process()) return;
  lock_take(&stats_lock, true);
  heap_read(&h);
  out o;
  out_open(&o, NULL);
  for (unsigned i = 0; i < arena_count; i++) {
    put(&o, "Arena ");
    put_u64(&o, i, 0);
    put(&o, ":\nsystem bytes     = ");
    put_u64(&o, h.arenas[i].mapped, 10);
    put(&o, "\nin use bytes     = ");
    put_u64(&o, h.arenas[i].used, 10);
    put(&o, "\n");
  }
  put(&o, "Total (incl. mmap):\nsystem bytes     = ");
  put_u64(&o, os_mapped_bytes(), 10);
  put(&o, "\nin use bytes     = ");
  put_u64(&o, h.total.used + h.mapped.live_bytes, 10);
  put(&o, "\nmax mmap regions = ");
  put_u64(&o, h.mapped.max_blocks, 10);
  put(&o, "\nmax mmap bytes   = ");
  put_u64(&o, h.mapped.max_bytes, 10);
  put(&o, "\n");
  report(&o, &h);
  out_flush(&o);
  lock_release(&stats_lock, true);
}

/* The free blocks of each class, as glibc's <sizes> lists its free chunks. */
static void put_sizes(out *o, const arena_census *c, uint64_t *count, uint64_t *bytes) {
  put(o, "<sizes>\n");
  for (unsigned cls = 1; cls <= FM_NUM_SPAN_CLASSES; cls++) {
    if (!c->classes[cls].free) continue;
    uint64_t size = size_class_size[cls];
    put(o, "  <size");
    put_attribute(o, "from", cls > 1 ? size_class_size[cls - 1] + 1 : 1);
    put_attribute(o, "to", size);
    put_attribute(o, "total", c->classes[cls].free * size);
    put_attribute(o, "count", c->classes[cls].free);
    put(o, "/>\n");
    *count += c->classes[cls].free;
    *bytes += c->classes[cls].free * size;
  }
  put(o, "</sizes>\n");
}

static void put_total(out *o, const char *type, uint64_t count, uint64_t size) {
  put(o, "<total type=\"");
  put(o, type);
  put(o, "\"");
  put_attribute(o, "count", count);
  put_attribute(o, "size", size);
  put(o, "/>\n");
}

static void put_system(out *o, uint64_t current, uint64_t max) {
  put(o, "<system type=\"current\"");
  put_attribute(o, "size", current);
  put(o, "/>\n<system type=\"max\"");
  put_attribute(o, "size", max);
  put(o, "/>\n<aspace type=\"total\"");
  put_attribute(o, "size", current);
  put(o, "/>\n<aspace type=\"mprotect\"");
  put_attribute(o, "size", current);
  put(o, "/>\n");
}

/* glibc's shape: a <heap> per arena, then the totals. The caller's stream may allocate
 * its buffer: that re-enters malloc, which never takes stats_lock. */
int stats_print_xml(int options_given, FILE *stream) {
  if (options_given != 0) return EINVAL;
  if (!init_process()) return -1;
  lock_take(&stats_lock, true);
  heap_read(&h);
  out o;
  out_open(&o, stream);
  put(&o, "<malloc version=\"1\">\n");
  uint64_t all_count = 0, all_bytes = 0;
  for (unsigned i = 0; i < arena_count; i++) {
    uint64_t count = 0, bytes = 0;
    put(&o, "<heap");
    put_attribute(&o, "nr", i);
    put(&o, ">\n");
    put_sizes(&o, &h.arenas[i], &count, &bytes);
    put_total(&o, "fast", 0, 0);
    put_total(&o, "rest", count, bytes);
    put_system(&o, h.arenas[i].mapped, h.arenas[i].mapped);
    put(&o, "</heap>\n");
    all_count += count;
    all_bytes += bytes;
  }
  put_total(&o, "fast", 0, 0);
  put_total(&o, "rest", all_count, all_bytes);
  put_total(&o, "mmap", h.mapped.live_blocks, h.mapped.live_bytes);
  put_system(&o, os_mapped_bytes(), os_mapped_peak_bytes());
  put(&o, "</malloc>\n");
  out_flush(&o);
  lock_release(&stats_lock, true);
  return o.failed ? -1 : 0;
}

/* FASTMALLOC_STATS=1: the report at exit (a destructor: it allocates nothing). */
__attribute__((destructor)) static void stats_at_exit(void) {
  if (!options.stats) return;
  lock_take(&stats_lock, true);
  heap_read(&h);
  out o;
  out_open(&o, NULL);
  report(&o, &h);
  out_flush(&o);
  lock_release(&stats_lock, true);
}
