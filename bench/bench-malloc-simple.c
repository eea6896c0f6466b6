/* bench-malloc-simple [SIZE]: the method of glibc's benchtests/bench-malloc-simple, own code.
 * For COUNT in 25, 100, 400, 1600: (malloc COUNT blocks of SIZE bytes, then free them), repeated
 * 200000/COUNT times after a warm-up pass, in the main thread while single-threaded, in a second thread, and in the
 * main thread after that thread was joined. Prints glibc's JSON: ns per malloc+free pair;
 * max_rss is the peak RSS in KiB (VmHWM, see bench-common.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench-common.h"

#define PAIRS_PER_TEST 200000
#define NCOUNTS 4
#define MAX_COUNT 1600

static const int counts[NCOUNTS] = {25, 100, 400, MAX_COUNT};

enum { MAIN_ST, MAIN_MT, THREAD, NSCENARIOS };

/* glibc's key prefixes, in glibc's output order. */
static const char *const scenario_key[NSCENARIOS] = {
    [MAIN_ST] = "main_arena_st", [MAIN_MT] = "main_arena_mt", [THREAD] = "thread_arena_"};

static size_t block_size;
static void **blocks;
static double ns_per_pair[NSCENARIOS][NCOUNTS];

/* Returns the elapsed ns of rounds x (count mallocs, count frees). */
static uint64_t run_rounds(int count, int rounds)
{
    uint64_t start = bench_now_ns();
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < count; i++) {
            blocks[i] = malloc(block_size);
            bench_escape(blocks[i]);
        }
        for (int i = 0; i < count; i++)
            free(blocks[i]);
    }
    return bench_now_ns() - start;
}

static void run_scenario(int scenario)
{
    for (int c = 0; c < NCOUNTS; c++) {
        int rounds = PAIRS_PER_TEST / counts[c];
        uint64_t ns = run_rounds(counts[c], rounds);
        ns_per_pair[scenario][c] = (double)ns / ((double)rounds * counts[c]);
    }
}

static void *thread_main(void *arg)
{
    run_scenario(THREAD);
    return arg;
}

int main(int argc, char **argv)
{
    long size = 16;
    if (argc > 2 || (argc == 2 && (size = strtol(argv[1], NULL, 0)) <= 0)) {
        fprintf(stderr, "usage: %s [SIZE]   (block size in bytes, default 16)\n", argv[0]);
        return 2;
    }
    block_size = (size_t)size;
    blocks = malloc(MAX_COUNT * sizeof *blocks);
    if (!blocks)
        return 1;

    run_scenario(MAIN_ST); /* warm-up, as glibc does: one untimed pass of every count */
    run_scenario(MAIN_ST);

    pthread_t t;
    if (pthread_create(&t, NULL, thread_main, NULL) != 0 || pthread_join(t, NULL) != 0) {
        perror("pthread");
        return 1;
    }
    run_scenario(MAIN_MT);
    free(blocks);

    printf("{\n \"timing_type\": \"clock_gettime\",\n \"functions\": {\n  \"malloc\": {\n   \"\": {\n");
    printf("    \"malloc_block_size\": %zu,\n    \"max_rss\": %ld", block_size, bench_peak_rss_kib());
    for (int s = 0; s < NSCENARIOS; s++)
        for (int c = 0; c < NCOUNTS; c++)
            printf(",\n    \"%s_allocs_%04d_time\": %.3f", scenario_key[s], counts[c], ns_per_pair[s][c]);
    printf("\n   }\n  }\n }\n}\n");
    return 0;
}
