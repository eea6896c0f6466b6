/* The arenas' shared machinery: set-up, the kept empty spans, the supply of chunks and
 * spans, the purge tick and the purge, statistics, and the fork window. The kinds of block
 * live in arena_small.c, arena_pages.c and arena_spans.c. */
#include "arena_internal.h"

#include "options.h"

/* On a page of their own: the first arena, which every process uses, then touches one
 * page, not the two it would straddle. */
fm_arena arenas[FM_ARENAS_MAX] __attribute__((aligned(FM_PAGE_SIZE)));
unsigned arena_count = 1;

/* The empty spans an arena keeps a while, per class, in address order: pushed in the
 * purge epoch they emptied in, so a purge tick can tell how long they have waited. A heap
 * freed about in the order it was built empties its spans upwards, each above or just
 * below the highest kept, and one freed in the reverse order each below the lowest: a
 * span's place is looked for from the highest down, after a look at the lowest. */
static void kept_push(fm_arena *arena, fm_span *span) {
  unsigned cls = span->cls;
  fm_span *lowest = arena->empty[cls], *below = arena->empty_highest[cls];
  span->empty_since = (uint32_t)arena->purge_epoch;
  if (lowest && span < lowest) below = NULL;
  while (below && below > span) below = below->prev;
  span->prev = below;
  span->next = below ? below->next : lowest;
  if (span->next) span->next->prev = span;
  else arena->empty_highest[cls] = span;
  if (below) below->next = span;
  else arena->empty[cls] = span;
  arena->empty_count[cls]++;
  fm_assert(!arena->empty_highest[cls]->next && !arena->empty[cls]->prev);
}

static void kept_remove(fm_arena *arena, fm_span *span) {
  if (arena->empty_highest[span->cls] == span) arena->empty_highest[span->cls] = span->prev;
  LIST_REMOVE(&arena->empty[span->cls], span);
  arena->empty_count[span->cls]--;
}

/* The lowest kept span of class cls and `units` units; NULL when there is none. */
static fm_span *kept_lowest(fm_arena *arena, unsigned cls, unsigned units) {
  fm_span *span = arena->empty[cls];
  while (span && span->units != units) span = span->next;
  return span;
}

/* Moves a chunk whose units were taken or given back to the list it now belongs on: a
 * chunk without a free unit waits on the full list, so searches never walk the (many)
 * full chunks of a big heap. The others are in address order: new spans take the lowest
 * room, so a heap that shrank gathers in its lowest chunks and the rest drain. */
void arena_relist_chunk(fm_arena *arena, fm_chunk *chunk, bool was_full) {
  bool full = !chunk->free_units;
  if (full == was_full) return;
  if (full) {
    LIST_REMOVE(&arena->chunks, chunk);
    LIST_PUSH(&arena->full_chunks, chunk);
    chunk->sparse_ticks = 0;   /* (the full list's chunks see no tick) */
  } else {
    LIST_REMOVE(&arena->full_chunks, chunk);
    LIST_INSERT_BY_ADDRESS(&arena->chunks, chunk);
  }
}

void arena_count_dirty(fm_arena *arena, unsigned before, unsigned after) {
  __atomic_store_n(&arena->dirty_free_units, arena->dirty_free_units - before + after,
                   __ATOMIC_RELAXED);
}

/* An arena that makes `units` clean units resident purges as many dirty free units of
 * the other arenas, beyond FM_DIRTY_FREE_UNITS_KEPT each, the highest first (busy arenas
 * are skipped, and until its next tick one whose purge the OS refused). Threads come and
 * go and the load moves between arenas, and each arena keeps the pages its threads freed
 * until they stay free a whole purge tick: without this a heap's RSS approaches the sum of
 * every arena's high-water mark. An arena that reuses its own dirty units purges nothing.
 * (A unit counts whole: a page span's first block costs another arena 64 KiB.) */
static void arena_offset_growth(fm_arena *arena, unsigned units) {
  bool threaded = lock_threaded();
  for (unsigned i = 0; i < arena_count && units; i++) {
    fm_arena *other = &arenas[i];
    if (other == arena ||
        __atomic_load_n(&other->dirty_free_units, __ATOMIC_RELAXED) <= FM_DIRTY_FREE_UNITS_KEPT ||
        !lock_try(&other->lock, threaded))
      continue;
    unsigned dirty = other->dirty_free_units;   /* (now under its lock) */
    bool refused_lately = other->offset_refused == other->purge_epoch + 1;
    unsigned excess =
        dirty > FM_DIRTY_FREE_UNITS_KEPT && !refused_lately ? dirty - FM_DIRTY_FREE_UNITS_KEPT : 0;
    if (excess > units) excess = units;
    fm_chunk *highest = other->chunks;
    while (excess && highest && highest->next) highest = highest->next;
    bool refused = false;
    for (fm_chunk *chunk = highest; chunk && excess && !refused; chunk = chunk->prev) {
      unsigned before = chunk_dirty_free_units(chunk);
      unsigned purged = chunk_purge_highest(chunk, excess, &refused);
      arena_count_dirty(other, before, before - purged);
      other->counters.bytes_purged += (size_t)purged * FM_UNIT_SIZE;
      excess -= purged;
      units -= purged;
    }
    if (refused) other->offset_refused = other->purge_epoch + 1;
    lock_release(&other->lock, threaded);
  }
}

/* A span of `units` units from chunk, which goes to the full list if it has no free unit
 * left; NULL when it has no room. */
static fm_span *arena_take_span_in(fm_arena *arena, fm_chunk *chunk, unsigned units, unsigned cls,
                                   bool resident_only) {
  unsigned clean;
  fm_span *span = chunk_take_span(chunk, units, cls, resident_only, &clean);
  if (!span) return NULL;
  arena_count_dirty(arena, units - clean, 0);   /* (the span's units that were dirty) */
  arena_relist_chunk(arena, chunk, false);
  if (clean) arena_offset_growth(arena, clean);
  arena->counters.spans_taken++;
  arena->units_taken += units;
  return span;
}

/* A span of `units` units from the lowest chunk with room. */
static fm_span *arena_find_span(fm_arena *arena, unsigned units, unsigned cls, bool resident_only) {
  for (fm_chunk *chunk = arena->chunks; chunk; chunk = chunk->next) {
    fm_span *span = arena_take_span_in(arena, chunk, units, cls, resident_only);
    if (span) return span;
  }
  return NULL;
}

static void arena_give_back_span(fm_arena *arena, fm_span *span, bool purged) {
  fm_chunk *chunk = chunk_of(span);
  bool was_full = !chunk->free_units;
  /* (a span's units count as dirty only once free again: units_take cleared their bits) */
  arena_count_dirty(arena, 0, purged ? 0 : span->units);
  chunk_give_back_span(span, purged);
  arena_relist_chunk(arena, chunk, was_full);
}

/* Gives one kept span back to its chunk, still resident, so a new span can take its
 * memory: the lowest of at least `units` units if any, else the lowest; false when none
 * is kept. Empty page spans (page_spans) or those of the other classes. */
static bool arena_give_back_kept_span(fm_arena *arena, unsigned units, bool page_spans) {
  for (unsigned need = units;; need = 1) {
    fm_span *lowest = NULL;
    for (unsigned c = 1; c <= FM_CLASS_PAGES; c++) {
      if ((c == FM_CLASS_PAGES) != page_spans) continue;
      fm_span *span = arena->empty[c];
      while (span && span->units < need) span = span->next;
      if (span && (!lowest || span < lowest)) lowest = span;
    }
    if (lowest) {
      kept_remove(arena, lowest);
      arena_give_back_span(arena, lowest, false);
      return true;
    }
    if (need == 1) return false;
  }
}

/* Unmaps the chunks the arena mapped ahead and has not used; returns their bytes. */
static size_t arena_unmap_reserve(fm_arena *arena) {
  size_t bytes = (size_t)(arena->reserve_end - arena->reserve);
  if (bytes) os_unmap(arena->reserve, bytes);
  arena->reserve = arena->reserve_end = NULL;
  return bytes;
}

static fm_chunk *arena_new_chunk(fm_arena *arena) {
  if (arena->reserve == arena->reserve_end) {
    size_t count = arena->chunk_count < 1 ? 1 : arena->chunk_count;
    if (count > FM_CHUNK_BATCH_MAX) count = FM_CHUNK_BATCH_MAX;   /* (config.h) */
    char *batch = os_map_aligned(count * FM_CHUNK_SIZE, FM_CHUNK_SIZE);
    if (!batch) {
      batch = os_map_aligned(FM_CHUNK_SIZE, FM_CHUNK_SIZE);   /* tight on address space */
      count = 1;
    }
    if (!batch) return NULL;
    arena->reserve = batch;
    arena->reserve_end = batch + count * FM_CHUNK_SIZE;
  }
  fm_chunk *chunk = chunk_init(arena->reserve, arena, arena->generation);
  if (!chunk) {   /* no unit-map leaf for it: out of memory */
    arena_unmap_reserve(arena);
    return NULL;
  }
  arena->reserve += FM_CHUNK_SIZE;
  arena->chunk_count++;
  return chunk;
}

/* Moves the spares that are empty to the kept spans, where they age and are purged, or
 * serve another class, as those do; returns whether it moved one. */
static bool arena_spares_to_kept(fm_arena *arena) {
  bool moved = false;
  for (unsigned cls = 1; cls <= FM_CLASS_PAGES; cls++) {
    fm_span *span = arena->spare[cls];
    arena->spare[cls] = NULL;
    if (span && !span->used) {
      arena_span_emptied(arena, span);
      moved = true;
    }
  }
  return moved;
}

/* Memory already resident first, so the heap grows its RSS only when it must: free units
 * still resident, then the empty spans other classes keep, one at a time, then untouched
 * or purged units, then empty page spans, then the spares (arena.h: each class's next
 * spans would come from them), then a new chunk. (Empty page spans wait for page blocks:
 * so a page block freed twice finds its page free, not a block of another class.) */
static fm_span *arena_take_span(fm_arena *arena, unsigned units, unsigned cls) {
  fm_span *span = arena_find_span(arena, units, cls, true);
  while (!span && arena_give_back_kept_span(arena, units, false))
    span = arena_find_span(arena, units, cls, true);
  if (!span) span = arena_find_span(arena, units, cls, false);
  while (!span && arena_give_back_kept_span(arena, units, true))
    span = arena_find_span(arena, units, cls, false);
  if (span) return span;
  if (arena_spares_to_kept(arena)) return arena_take_span(arena, units, cls);
  fm_chunk *chunk = arena_new_chunk(arena);
  if (!chunk) return NULL;
  LIST_INSERT_BY_ADDRESS(&arena->chunks, chunk);
  return arena_find_span(arena, units, cls, false);
}

/* Whether a kept span should leave its chunk for a lower one with room: only from a chunk
 * that has been mostly free for a whole purge delay. So a heap that shrank gathers in its
 * lowest chunks while its spans cycle, and the others drain; a heap freed and built
 * again at once (or in use) keeps its resident spans. */
static bool kept_span_moves_down(fm_arena *arena, fm_span *kept) {
  fm_chunk *chunk = chunk_of(kept), *lowest = arena->chunks;
  return lowest && lowest < chunk && chunk->sparse_ticks == 2 && chunk_mostly_free(chunk);
}

/* A span of class cls and `units` units: a kept one, unless it moves down (then one from
 * the lowest chunk with room, and the kept one waits for its purge), else a new one. */
fm_span *arena_reuse_or_take_span(fm_arena *arena, unsigned cls, unsigned units) {
  fm_span *kept = kept_lowest(arena, cls, units), *span = NULL;
  if (kept && kept_span_moves_down(arena, kept))
    span = arena_take_span_in(arena, arena->chunks, units, cls, false);
  if (span) return span;
  if (!kept) return arena_take_span(arena, units, cls);
  kept_remove(arena, kept);
  return kept;
}


/* Under the lock, from paths that free: every purge delay, a tick purges what stayed
 * empty for a whole tick. Each call reads the (coarse, vDSO) clock, about 3 ns: a program
 * that reaches its arena seldom still sees its memory go back on time. The same tick
 * visits the arenas that nobody frees into any more (a finished thread's), unless busy. */
#if FM_DEBUG
static unsigned dirty_free_units_counted(const fm_arena *arena) {
  unsigned units = 0;   /* (chunks on the full list have no free unit) */
  for (const fm_chunk *chunk = arena->chunks; chunk; chunk = chunk->next)
    units += chunk_dirty_free_units(chunk);
  return units;
}
#endif

/* Closes the count of the units the arena took since the last tick, and returns the most
 * it took in one of its last FM_DEMAND_TICKS ticks. A tick keeps that many stale dirty
 * units, the lowest, which the next spans take first: a program that frees a heap and then
 * builds another (or frees it over several ticks first) reuses its pages instead of
 * faulting them in again; once it stops building, they go FM_DEMAND_TICKS ticks later. */
static unsigned arena_demand_at_tick(fm_arena *arena) {
  arena->units_taken_in_tick[arena->purge_epoch % FM_DEMAND_TICKS] = arena->units_taken;
  arena->units_taken = 0;
  unsigned most = 0;
  for (unsigned i = 0; i < FM_DEMAND_TICKS; i++)
    if (arena->units_taken_in_tick[i] > most) most = arena->units_taken_in_tick[i];
  return most;
}

static void arena_tick(fm_arena *arena, uint64_t now) {
  fm_assert(arena->dirty_free_units == dirty_free_units_counted(arena));
  /* (other arenas' ticks read it without the lock: a hint) */
  __atomic_store_n(&arena->next_purge_ns, now + options.purge_delay_ns, __ATOMIC_RELAXED);
  /* (threads' idle sweeps read it without the lock) */
  __atomic_store_n(&arena->purge_epoch, arena->purge_epoch + 1, __ATOMIC_RELAXED);
  arena_purge(arena, FM_PURGE_STALE);
}

/* True when a tick ran. */
static bool arena_purge_tick(fm_arena *arena) {
  uint64_t now = os_now_ns();
  if (now < __atomic_load_n(&arena->next_purge_ns, __ATOMIC_RELAXED)) return false;
  arena_tick(arena, now);
  bool threaded = lock_threaded();
  for (unsigned i = 0; i < arena_count; i++) {
    fm_arena *idle = &arenas[i];
    uint64_t idle_due = __atomic_load_n(&idle->next_purge_ns, __ATOMIC_RELAXED);
    if (idle == arena || now < idle_due + options.purge_delay_ns) continue;
    if (!lock_try(&idle->lock, threaded)) continue;
    arena_tick(idle, now);
    lock_release(&idle->lock, threaded);
  }
  return true;
}

/* After a tick, outside the lock (munmap waits for the kernel's mapping lock): the
 * caller's other clients of the clock (arena_init_all). */
static void (*after_tick)(void);

void arena_tick_if_due(fm_arena *arena) {
  if (os_now_ns() < __atomic_load_n(&arena->next_purge_ns, __ATOMIC_RELAXED)) return;
  bool threaded = lock_threaded();
  lock_take(&arena->lock, threaded);
  bool ticked = arena_purge_tick(arena);
  lock_release(&arena->lock, threaded);
  if (ticked && after_tick) after_tick();
}

/* The arena's slow-path calls so far. */
static uint64_t arena_uses(const fm_arena *arena) {
  const arena_counters *c = &arena->counters;
  return c->refills + c->flushes + c->page_blocks_taken + c->page_blocks_given + c->span_blocks_taken;
}

void arena_tick_all(void) {
  uint64_t now = os_now_ns();
  bool threaded = lock_threaded();
  for (unsigned i = 0; i < arena_count; i++) {
    fm_arena *arena = &arenas[i];
    if (!lock_try(&arena->lock, threaded)) continue;   /* (its user ticks it) */
    arena_tick(arena, now);
    /* Free pages inside partly used spans (those that thread caches' blocks pin, say)
     * wait for no tick: they go when the arena rests. */
    uint64_t uses = arena_uses(arena);
    if (uses != arena->uses_seen) {
      arena->uses_seen = uses;
      arena->idle_purged = false;
    } else if (!arena->idle_purged) {
      arena_purge(arena, FM_PURGE_ALL);
      arena->idle_purged = true;
    }
    lock_release(&arena->lock, threaded);
  }
  if (after_tick) after_tick();
}

void arena_span_emptied_or_spare(fm_arena *arena, fm_span *span) {
  fm_span **spare = &arena->spare[span->cls];
  if (*spare == span) return;
  bool low = !arena->chunks || chunk_of(span) <= arena->chunks;
  if ((*spare && !(*spare)->used) || !low) return arena_span_emptied(arena, span);
  *spare = span;   /* (one with blocks out again is a partial span as any) */
}

void arena_unlock_after_free(fm_arena *arena, bool threaded) {
  bool ticked = arena_purge_tick(arena);
  lock_release(&arena->lock, threaded);
  if (ticked && after_tick) after_tick();
}

/* An empty span stays with its class for a purge tick (FM_KEPT_SPAN_BYTES of a size
 * class, FM_KEPT_PAGE_SPANS page spans, FM_KEPT_SPAN_BLOCK_UNITS of span blocks), so a
 * class whose spans keep emptying and refilling does not churn through its chunk; then it
 * is purged at once, having aged already. When the class keeps its most, the highest of
 * them and this one goes back to its chunk (a span block: this one). (A page span leaves
 * its list first.) */
void arena_span_emptied(fm_arena *arena, fm_span *span) {
  unsigned cls = span->cls;
  if (span->listed) partial_remove(arena, span);
  bool keep;
  if (cls == FM_CLASS_SPAN_BLOCK) {
    unsigned units = span->units;   /* kept with those already kept */
    for (fm_span *kept = arena->empty[cls]; kept; kept = kept->next) units += kept->units;
    keep = units <= FM_KEPT_SPAN_BLOCK_UNITS;
  } else {
    keep = cls == FM_CLASS_PAGES
               ? arena->empty_count[cls] < FM_KEPT_PAGE_SPANS
               : (size_t)arena->empty_count[cls] * span_bytes(span) < FM_KEPT_SPAN_BYTES;
  }
  if (!keep) {
    fm_span *highest = arena->empty_highest[cls];
    if (!highest || highest < span || cls == FM_CLASS_SPAN_BLOCK) {
      arena_give_back_span(arena, span, false);
      return;
    }
    kept_remove(arena, highest);
    arena_give_back_span(arena, highest, false);
  }
  kept_push(arena, span);
}

void arena_init_all(void (*on_tick)(void)) {
  unsigned wanted = options.arenas ? options.arenas : os_cpu_count();
  arena_count = wanted < FM_ARENAS_MAX ? wanted : FM_ARENAS_MAX;
  after_tick = on_tick;
  arena_small_init();
  arena_pages_init();
}

size_t arena_purge(fm_arena *arena, fm_purge how) {
  bool all = how != FM_PURGE_STALE, pages = how != FM_UNMAP_EMPTY;
  size_t released = 0;
  arena_free_handed_over_blocks(arena);
  arena_free_handed_over_page_blocks(arena);
  arena_spares_to_kept(arena);
  unsigned keep = all ? 0 : arena_demand_at_tick(arena);   /* units the tick leaves resident */
  for (unsigned cls = 1; cls <= FM_CLASS_PAGES; cls++) {
    for (fm_span *span = arena->empty[cls], *next; span; span = next) {
      next = span->next;
      if (all || (uint32_t)(arena->purge_epoch - span->empty_since) >= 2) {
        kept_remove(arena, span);
        bool resident = !all && keep >= span->units;   /* back to its chunk unpurged */
        if (resident) keep -= span->units;
        bool purged = pages && !resident && os_purge(span_base(span), span_bytes(span));
        if (purged) released += span_bytes(span);
        arena_give_back_span(arena, span, purged);
      }
    }
    if (how == FM_PURGE_ALL && cls <= FM_NUM_SPAN_CLASSES)
      for (fm_span *partial = arena->partial[cls]; partial; partial = partial->next)
        released += arena_small_span_purge(partial);
  }
  if (how == FM_PURGE_ALL)
    for (unsigned runs = 1; runs < FM_PAGES_PER_UNIT; runs++)
      for (fm_span *span = arena->page_spans[runs]; span; span = span->next)
        released += arena_page_span_purge(span);
  unsigned empty_kept = 0;
  bool shrank = false;   /* a tick unmapped an empty chunk */
  for (fm_chunk *chunk = arena->chunks, *next; chunk; chunk = next) {
    next = chunk->next;
    /* Trim and the retry unmap every empty chunk. A tick unmaps those beyond a small
     * reserve once purged, so the address space of a heap that shrank goes back too,
     * while a heap that breathes keeps a few: munmap and mmap hold the kernel's mapping
     * lock against every page fault of every thread, and a purged chunk costs no RSS. */
    bool empty = chunk->free_units == FM_CHUNK_ALL_UNITS;
    if (empty && (all || (!chunk->dirty_units && empty_kept++ >= FM_EMPTY_CHUNKS_KEPT))) {
      arena_count_dirty(arena, chunk_dirty_free_units(chunk), 0);
      LIST_REMOVE(&arena->chunks, chunk);
      unit_map_set(chunk, FM_UNIT_SIZE, 0);
      chunk_delete(chunk);
      arena->chunk_count--;
      released += FM_CHUNK_SIZE;
      shrank |= !all;
      continue;
    }
    if (pages) {
      unsigned before = chunk_dirty_free_units(chunk);
      released += chunk_purge(chunk, all, &keep);
      arena_count_dirty(arena, before, chunk_dirty_free_units(chunk));
    }
  }
  /* The chunks mapped ahead go too when a tick found the heap shrunk, which needs none of
   * them, and when out of address space. Trim leaves them: trimming programs would map
   * them again at their next allocation. */
  if (shrank || how == FM_UNMAP_EMPTY) released += arena_unmap_reserve(arena);
  arena->counters.bytes_purged += released;
  return released;
}

static void census_of_chunks(const fm_chunk *list, arena_census *census) {
  for (const fm_chunk *chunk = list; chunk; chunk = chunk->next) {
    census->mapped += FM_CHUNK_SIZE;
    for (unsigned unit = 1; unit < FM_UNITS_PER_CHUNK;) {
      if (chunk->free_units >> unit & 1) {
        unit++;
        continue;
      }
      const fm_span *span = &chunk->spans[unit];
      fm_assert(chunk->head_of[unit] == unit && span->units > 0);
      if (span->cls <= FM_NUM_SPAN_CLASSES) {
        census->classes[span->cls].spans++;
        census->classes[span->cls].out += span->used;
        census->classes[span->cls].free += span->capacity - span->used;
        census->used += (size_t)span->used * size_class_size[span->cls];
      } else if (span->cls == FM_CLASS_PAGES) {
        census->page_spans++;
        census->pages_out += span->used;
        census->pages_free += FM_PAGES_PER_UNIT - span->used;
        census->used += (size_t)span->used * FM_PAGE_SIZE;
      } else if (span->used) {   /* a span block: the whole span */
        census->span_blocks++;
        census->used += span_bytes(span);
      }
      unit += span->units;
    }
  }
}

void arena_take_census(fm_arena *arena, arena_census *census) {
  bool threaded = lock_threaded();
  *census = (arena_census){0};
  lock_take(&arena->lock, threaded);
  census_of_chunks(arena->chunks, census);
  census_of_chunks(arena->full_chunks, census);
  census->mapped += (size_t)(arena->reserve_end - arena->reserve);
  census->counters = arena->counters;
  lock_release(&arena->lock, threaded);
}

void arena_lock_all_for_fork(void) {
  for (unsigned i = 0; i < arena_count; i++) lock_for_fork(&arenas[i].lock);
}

void arena_unlock_all_after_fork(void) {
  for (unsigned i = arena_count; i-- > 0;) lock_after_fork_parent(&arenas[i].lock);
}

/* An arena whose lists a fork cut off mid-update starts again empty, in a new generation:
 * its chunks stay mapped, and the blocks the program holds there stay valid, but they are
 * never handed out again, and frees into them are dropped (in_abandoned_chunk). */
static void arena_abandon(fm_arena *arena) {
  fm_arena fresh = {.generation = arena->generation + 1,
                    .next_purge_ns = arena->next_purge_ns,
                    .purge_epoch = arena->purge_epoch,
                    .threads = arena->threads};
  *arena = fresh;
}

void arena_after_fork_child(void) {
  for (unsigned i = 0; i < arena_count; i++)
    if (lock_after_fork_child(&arenas[i].lock)) arena_abandon(&arenas[i]);
}
