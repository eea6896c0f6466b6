/* The unit map's leaves: mapped on first use, published with one compare-and-swap, never
 * given back (a leaf costs 4 MiB of address space for each 256 GiB that ever held our
 * memory, and only the pages of it that hold entries are resident). */
#include "unit_map.h"

#include "os.h"

/* The leaf of every region without one: all zero, never written. */
static uint8_t zero_leaf[UNIT_MAP_LEAF_ENTRIES];

#define ZERO_ENTRY(i) ((uintptr_t)zero_leaf - (uintptr_t)(i) * UNIT_MAP_LEAF_ENTRIES)
#define ZERO_ENTRIES_4(i) ZERO_ENTRY(i), ZERO_ENTRY(i + 1), ZERO_ENTRY(i + 2), ZERO_ENTRY(i + 3)
#define ZERO_ENTRIES_16(i) \
  ZERO_ENTRIES_4(i), ZERO_ENTRIES_4(i + 4), ZERO_ENTRIES_4(i + 8), ZERO_ENTRIES_4(i + 12)
#define ZERO_ENTRIES_64(i) \
  ZERO_ENTRIES_16(i), ZERO_ENTRIES_16(i + 16), ZERO_ENTRIES_16(i + 32), ZERO_ENTRIES_16(i + 48)
#define ZERO_ENTRIES_256(i) \
  ZERO_ENTRIES_64(i), ZERO_ENTRIES_64(i + 64), ZERO_ENTRIES_64(i + 128), ZERO_ENTRIES_64(i + 192)
_Static_assert(UNIT_MAP_ROOT_ENTRIES == 512, "the initialiser below writes 2 x 512 entries");
static __attribute__((used)) uintptr_t unit_map_entries[2 * UNIT_MAP_ROOT_ENTRIES] = {
    ZERO_ENTRIES_256(-512), ZERO_ENTRIES_256(-256), ZERO_ENTRIES_256(0), ZERO_ENTRIES_256(256)};
/* unit_map_root, the one name the rest of the library uses, is the upper half's first
 * entry as a symbol of its own: gcc would add the offset to each index rather than fold it
 * into the position-independent address. (used: only the asm refers to the array.) The
 * assembler computes the offset from the same two shifts as UNIT_MAP_ROOT_ENTRIES. */
#define UNIT_MAP_TEXT_(x) #x
#define UNIT_MAP_TEXT(x) UNIT_MAP_TEXT_(x)
_Static_assert(sizeof(uintptr_t) == 8, "the entry size below");
__asm__(".globl unit_map_root\n\t.hidden unit_map_root\n\t"
        ".set unit_map_root, unit_map_entries + (8 << (" UNIT_MAP_TEXT(FM_ADDRESS_BITS) " - "
        UNIT_MAP_TEXT(UNIT_MAP_LEAF_SHIFT) "))");

/* Leaves mapped ahead (unit_map_hold_spares), taken when the OS refuses a new one. */
static uint8_t *spare_leaves[UNIT_MAP_SPARES_MAX];

bool unit_map_hold_spares(unsigned count) {
  if (count > UNIT_MAP_SPARES_MAX) return false;
  for (unsigned i = 0; i < count; i++) {
    if (__atomic_load_n(&spare_leaves[i], __ATOMIC_ACQUIRE)) continue;
    uint8_t *leaf = os_map_sparse(UNIT_MAP_LEAF_ENTRIES);
    if (!leaf) return false;
    uint8_t *none = NULL;
    if (!__atomic_compare_exchange_n(&spare_leaves[i], &none, leaf, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
      os_unmap(leaf, UNIT_MAP_LEAF_ENTRIES);
  }
  return true;
}

static uint8_t *new_leaf(void) {
  uint8_t *leaf = os_map_sparse(UNIT_MAP_LEAF_ENTRIES);
  for (unsigned i = 0; !leaf && i < UNIT_MAP_SPARES_MAX; i++)
    leaf = __atomic_exchange_n(&spare_leaves[i], NULL, __ATOMIC_ACQ_REL);
  return leaf;
}

/* The leaf of root entry i, mapped if it has none yet; 0 when the OS refuses one. */
static uintptr_t leaf_of(size_t i) {
  uintptr_t entry = __atomic_load_n(&unit_map_root[i], __ATOMIC_ACQUIRE);
  if (entry != ZERO_ENTRY(i)) return entry;
  uint8_t *leaf = new_leaf();
  if (!leaf) return 0;
  uintptr_t mine = (uintptr_t)leaf - i * UNIT_MAP_LEAF_ENTRIES;
  if (__atomic_compare_exchange_n(&unit_map_root[i], &entry, mine, false, __ATOMIC_ACQ_REL,
                                  __ATOMIC_ACQUIRE))
    return mine;
  os_unmap(leaf, UNIT_MAP_LEAF_ENTRIES);   /* another thread's leaf came first */
  return entry;
}

/* Root entries first .. last hold the units of [start, start + size). */
static bool root_range(const void *start, size_t size, size_t *first, size_t *last) {
  uintptr_t end = (uintptr_t)start + size - 1;
  if (size == 0 || end < (uintptr_t)start || end >> FM_ADDRESS_BITS) return false;
  *first = (uintptr_t)start >> UNIT_MAP_LEAF_SHIFT;
  *last = end >> UNIT_MAP_LEAF_SHIFT;
  return true;
}

bool unit_map_prepare(const void *start, size_t size) {
  size_t first, last;
  if (!root_range(start, size, &first, &last)) return false;
  for (size_t i = first; i <= last; i++)
    if (!leaf_of(i)) return false;
  return true;
}

bool unit_map_set(const void *start, size_t size, uint8_t cls) {
  if (!unit_map_prepare(start, size)) return false;
  uintptr_t unit = (uintptr_t)start >> FM_UNIT_SHIFT;
  uintptr_t last = ((uintptr_t)start + size - 1) >> FM_UNIT_SHIFT;
  for (; unit <= last; unit++) {
    uintptr_t leaf = __atomic_load_n(&unit_map_root[unit >> (UNIT_MAP_LEAF_SHIFT - FM_UNIT_SHIFT)],
                                     __ATOMIC_RELAXED);
    __atomic_store_n((uint8_t *)(leaf + unit), cls, __ATOMIC_RELAXED);
  }
  return true;
}
