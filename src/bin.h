/* A thread cache's bin: a stack of block pointers in the cache's own memory (not a list
 * linked through the free blocks: a pop follows no link a stray write could redirect),
 * with room up to a limit and, in the slot below its bottom, a sentinel. And the double-
 * free check that its slots carry (FM_FREE_MARK):
 * - free writes into the block's second word the address of the slot it pushes the block
 *   to, without reading the block;
 * - malloc pops a block only if its mark names the slot it pops it from: a block freed
 *   twice sits in two slots, one of which its mark cannot name (nor can a mark overwritten
 *   by a write into a free block); an empty bin's top slot holds the sentinel, a block
 *   whose mark names no slot, so the same compare finds the bin empty;
 * - blocks leave a bin for their span only with the right mark (bin_blocks_leave checks
 *   them), carrying FM_FREED_MARK instead, and a refill that takes a block handed out
 *   before checks it still carries that, or zero if its page was purged (bin_refilled):
 *   so a block freed again after its first free reached the span is caught when the span
 *   would hand it out twice;
 * - a block handed over to its arena waits in a box (arena_small.c) carrying
 *   FM_BOXED_MARK, which the refill that takes it from there requires, zero not accepted
 *   (its page is never purged): a box's block is free but its span counts it used, so
 *   nothing else would catch a second free of it, whose mark any such free rewrites.
 * Free itself compares nothing: free(p); free(p) is reported by the second malloc of the
 * class (the first hands p out from the upper slot, the second finds its mark naming it).
 * No block is ever handed out twice, and every double free is reported, at the latest
 * when the duplicate is reached. */
#ifndef FM_BIN_H
#define FM_BIN_H

#include "diag.h"

#define FM_FREED_MARK diag_key
/* A page block handed to its arena by another arena's thread (arena_hand_over_page_block),
 * and a small block in its arena's box: FM_FREED_MARK with one bit flipped. */
#define FM_HANDED_OVER_BIT 2
#define FM_HANDED_OVER_MARK (diag_key ^ FM_HANDED_OVER_BIT)
#define FM_BOXED_BIT 4
#define FM_BOXED_MARK (diag_key ^ FM_BOXED_BIT)

/* Whether mark is FM_FREED_MARK, or that with `bit` flipped: one compare. */
static fm_always_inline bool mark_freed_or(uintptr_t mark, uintptr_t bit) {
  return (mark | bit) == (FM_FREED_MARK | bit);
}

/* Tags arena_alloc_batch adds to the addresses it hands a refill (arena.h): a block never
 * handed out in its span's life, which may hold anything, and a block from its arena's
 * box, which carries FM_BOXED_MARK. */
#define FM_BLOCK_FRESH 1
#define FM_BLOCK_BOXED 2

/* The sentinel block: its second word, 0, names no slot. */
extern fm_hidden const uintptr_t bin_sentinel[2];

/* Whether block's mark names `slot` (always, without the check). */
static fm_always_inline bool mark_matches(const void *block, void *const *slot) {
  return !FM_FREE_MARK || ((void *const *const *)block)[1] == slot;
}
static fm_always_inline void mark_set(void *block, const void *mark) {
  if (FM_FREE_MARK) ((const void **)block)[1] = mark;
}

/* Checks the blocks of bin cls's slots [from, from + n) (each in a span of class cls, its
 * mark naming its slot) and gives each FM_FREED_MARK instead: they go back to their spans. */
void bin_blocks_leave(void **from, size_t n, unsigned cls);
/* Moves n blocks of bin cls from slots `from` to slots `to` (the ranges may overlap),
 * checking them and making their marks name their new slots. */
void bin_blocks_move(void **from, void **to, size_t n, unsigned cls);
/* Checks the block popped from `slot`; reports it when its mark does not name the slot. */
void bin_popped_check(void *p, void **slot);
/* A block from arena_alloc_batch, untagged, after the check of one handed out before
 * (above); a fresh one is not checked. */
fm_noinline void bin_mark_mismatch(void *p);
static inline void *bin_refilled(void *tagged) {
  uintptr_t t = (uintptr_t)tagged, p = t & ~(uintptr_t)(FM_BLOCK_FRESH | FM_BLOCK_BOXED);
  if (FM_FREE_MARK && fm_likely(!(t & FM_BLOCK_FRESH))) {
    bool boxed = t & FM_BLOCK_BOXED;
    uintptr_t mark = ((const uintptr_t *)p)[1];
    if (mark != (boxed ? FM_BOXED_MARK : FM_FREED_MARK) && (mark != 0 || boxed))
      bin_mark_mismatch((void *)p);
  }
  return (void *)p;
}

#endif
