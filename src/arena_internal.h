/* What the arena files (arena.c, arena_small.c, arena_pages.c, arena_spans.c) share and
 * nothing else sees: the intrusive lists, the kept spans, the purge tick's unlock. Every
 * function here runs under the arena's lock. */
#ifndef FM_ARENA_INTERNAL_H
#define FM_ARENA_INTERNAL_H

#include "arena.h"
#include "diag.h"

/* The lists of spans and of chunks, doubly linked through their next and prev fields. */
#define LIST_PUSH(list, node)                 \
  do {                                        \
    (node)->prev = NULL;                      \
    (node)->next = *(list);                   \
    if (*(list)) (*(list))->prev = (node);    \
    *(list) = (node);                         \
  } while (0)

/* Inserts node where the list, kept in address order, has room for it. */
#define LIST_INSERT_BY_ADDRESS(list, node)                    \
  do {                                                        \
    __typeof__(node) *link_ = (list), before_ = NULL;         \
    while (*link_ && *link_ < (node)) {                       \
      before_ = *link_;                                       \
      link_ = &before_->next;                                 \
    }                                                         \
    (node)->prev = before_;                                   \
    (node)->next = *link_;                                    \
    if (*link_) (*link_)->prev = (node);                      \
    *link_ = (node);                                          \
  } while (0)

#define LIST_REMOVE(list, node)                              \
  do {                                                       \
    if ((node)->prev) (node)->prev->next = (node)->next;     \
    else *(list) = (node)->next;                             \
    if ((node)->next) (node)->next->prev = (node)->prev;     \
    (node)->next = (node)->prev = NULL;                      \
  } while (0)

/* Whether p lies in a chunk its arena abandoned in a fork child (arena_abandon): frees
 * there are dropped, since the chunk's spans may have been cut off mid-update. */
static inline bool in_abandoned_chunk(const fm_arena *arena, const void *p) {
  return fm_unlikely(chunk_of(p)->generation != arena->generation);
}

/* The partial lists: spans with a free block; `listed` says whether a span is on one. */
static inline void partial_push(fm_arena *arena, fm_span *span) {
  LIST_PUSH(&arena->partial[span->cls], span);
  span->listed = 1;
}

static inline void partial_remove(fm_arena *arena, fm_span *span) {
  LIST_REMOVE(&arena->partial[span->cls], span);
  span->listed = 0;
}

/* After a change to a chunk's units: its dirty free units were `before`, are `after`
 * (arena->dirty_free_units follows). */
void arena_count_dirty(fm_arena *arena, unsigned before, unsigned after);

/* A span of class cls and `units` units: one the class kept empty, or a new one. */
fm_span *arena_reuse_or_take_span(fm_arena *arena, unsigned cls, unsigned units);
/* A span that has become empty: kept a while with its class, or given back to its chunk. */
void arena_span_emptied(fm_arena *arena, fm_span *span);
/* The same, but for the class's first span to empty, which stays at hand as its spare
 * (arena.h) until the next purge tick, or until the arena would map a new chunk: a thread
 * that frees the last blocks of a span and mallocs in the class again (threads that come
 * and go with a few blocks each; page blocks of over half a unit replaced in turn) takes
 * it back as it is. Only a span in or below the lowest chunk with a free unit is a spare:
 * a heap that shrank gathers in its lowest chunks while its spans cycle
 * (arena_reuse_or_take_span), so that the others drain. */
void arena_span_emptied_or_spare(fm_arena *arena, fm_span *span);
/* Moves a chunk whose units were taken or given back to the list it now belongs on. */
void arena_relist_chunk(fm_arena *arena, fm_chunk *chunk, bool was_full);
/* Ends a call that freed into the arena: the purge tick when one is due, then the unlock
 * (releasing the lock taken with `threaded`). */
void arena_unlock_after_free(fm_arena *arena, bool threaded);
/* Pushes the chain first .. last (linked through their first words, last's link about to
 * be written) onto a list of handed-over blocks with one compare-and-swap: the caller holds
 * no lock, the list's arena frees them under its own. */
static inline void handed_over_push(void **list, void *first, void *last) {
  void *head = __atomic_load_n(list, __ATOMIC_RELAXED);
  do *(void **)last = head;
  while (!__atomic_compare_exchange_n(list, &head, first, true, __ATOMIC_RELEASE,
                                      __ATOMIC_RELAXED));
}

/* Free the small blocks (arena_small.c) and the page blocks (arena_pages.c) handed over to
 * the arena. */
void arena_free_handed_over_blocks(fm_arena *arena);
void arena_free_handed_over_page_blocks(fm_arena *arena);

/* Purge the free pages inside a partly used span (malloc_trim); return their bytes. */
size_t arena_small_span_purge(fm_span *span);
size_t arena_page_span_purge(fm_span *span);

void arena_small_init(void);
void arena_pages_init(void);

#endif
