/* instr-loop PATTERN PAIRS: the loops whose malloc+free cost bench/instr-count measures with
 * callgrind. "single": p = malloc(32); free(p), PAIRS times. "batch100": 100 mallocs of 32 bytes,
 * then their 100 frees, PAIRS/100 times. The loop functions' names are what instr-count looks for. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench-common.h"

#define BLOCK 32
#define BATCH 100

__attribute__((noinline)) static void loop_single(long pairs)
{
    for (long i = 0; i < pairs; i++) {
        void *p = malloc(BLOCK);
        bench_escape(p);
        free(p);
    }
}

__attribute__((noinline)) static void loop_batch100(long pairs)
{
    void *block[BATCH];
    for (long r = 0; r < pairs / BATCH; r++) {
        for (int i = 0; i < BATCH; i++) {
            block[i] = malloc(BLOCK);
            bench_escape(block[i]);
        }
        for (int i = 0; i < BATCH; i++)
            free(block[i]);
    }
}

int main(int argc, char **argv)
{
    long pairs = argc == 3 ? strtol(argv[2], NULL, 10) : 0;
    if (argc != 3 || pairs <= 0) {
        fprintf(stderr, "usage: %s single|batch100 PAIRS\n", argv[0]);
        return 2;
    }
    if (strcmp(argv[1], "single") == 0)
        loop_single(pairs);
    else if (strcmp(argv[1], "batch100") == 0)
        loop_batch100(pairs);
    else
        return 2;
    return 0;
}
