/* The unit map: one byte per 64 KiB unit of the address space, saying what lies there (a
 * size class, a marker for the other kinds of block, or 0 for "not ours"). free() reads it
 * with two dependent loads and no lock. It must not hold address space it does not use:
 * a program that lowers its own RLIMIT_AS must find its stacks and files still mappable. */
#ifndef FM_UNIT_MAP_H
#define FM_UNIT_MAP_H

#include "config.h"

/* Two levels: a static root of 512 entries, each for 256 GiB of the 47-bit user address
 * space, pointing at a leaf of 2^22 bytes (one a unit) that is mapped the first time
 * something of ours lies in its 256 GiB; until then every root entry points at one shared
 * leaf of zeros. So the map holds 4 MiB of address space for each 256 GiB region that has
 * our memory, and reads "not ours" everywhere else, from the first instruction of the
 * process on (before any set-up: the root is initialised by the loader). The root is
 * small because the loader's pages of it are resident whole: 8 KiB in all. Below the root
 * lie 512 more entries, for the kernel's half of the address space, that always point at
 * the zero leaf: the lookup shifts a pointer as a signed number, so a pointer such as
 * (void *)-1 or MAP_FAILED reads "not ours" with no test on the fast path. */
#define UNIT_MAP_LEAF_SHIFT 38
#define UNIT_MAP_ROOT_ENTRIES ((size_t)1 << (FM_ADDRESS_BITS - UNIT_MAP_LEAF_SHIFT))
#define UNIT_MAP_LEAF_ENTRIES ((size_t)1 << (UNIT_MAP_LEAF_SHIFT - FM_UNIT_SHIFT))

/* Root entry i holds its leaf's address minus i * UNIT_MAP_LEAF_ENTRIES, so the leaf is
 * indexed by the whole unit number: one shift of the pointer serves the second load.
 * unit_map_root[i] is entry i, for i from -UNIT_MAP_ROOT_ENTRIES (the kernel's half) up
 * to UNIT_MAP_ROOT_ENTRIES - 1: a symbol in the middle of the entries (unit_map.c). */
extern fm_hidden uintptr_t unit_map_root[];

/* The entry of pointer p, which must be canonical (bits 47 to 63 alike: every user-space
 * and every kernel address): the fast path's lookup. Entries change under readers one
 * byte at a time. */
static fm_always_inline unsigned unit_map_class(const void *p) {
  intptr_t a = (intptr_t)p;   /* (signed shifts: the kernel's half indexes below the root) */
  uintptr_t leaf = __atomic_load_n(&unit_map_root[a >> UNIT_MAP_LEAF_SHIFT], __ATOMIC_RELAXED);
  return __atomic_load_n((const uint8_t *)(leaf + (uintptr_t)(a >> FM_UNIT_SHIFT)),
                         __ATOMIC_RELAXED);
}

/* The same for any pointer: 0 at or above 2^47. */
static fm_always_inline unsigned unit_map_class_checked(const void *p) {
  return (uintptr_t)p >> FM_ADDRESS_BITS ? 0 : unit_map_class(p);
}

/* Maps the leaves that [start, start + size) needs, so a later unit_map_set of any part
 * of it cannot fail; false when the OS refuses a leaf. Lock-free. */
bool unit_map_prepare(const void *start, size_t size);

/* Sets the entries of the units [start, start + size) touches to cls, mapping leaves as
 * needed; false (nothing set) when a leaf cannot be mapped. Lock-free: the caller owns
 * the range (it mapped it, or holds the lock of the arena whose chunk it lies in). */
bool unit_map_set(const void *start, size_t size, uint8_t cls);

/* Maps `count` leaves ahead (at most UNIT_MAP_SPARES_MAX), which later calls take when
 * the OS refuses a leaf: for a caller that must register memory it cannot give back (a
 * block already moved); false when they cannot be mapped. */
#define UNIT_MAP_SPARES_MAX 4
bool unit_map_hold_spares(unsigned count);

#endif
