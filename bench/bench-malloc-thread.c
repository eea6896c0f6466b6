/* bench-malloc-thread [THREADS] [--duration S]: the method of glibc's benchtests/bench-malloc-thread,
 * own code. Each thread keeps 1024 slots; every iteration frees a random slot and mallocs a block
 * of 4..32768 bytes (inverse-square distribution, fixed seed) into it, until the time is up.
 * With one thread the loop runs in the main thread, which stays single-threaded, as in glibc.
 * Prints glibc's JSON: duration (ns, summed over threads), iterations, time_per_iteration (ns),
 * max_rss (peak RSS in KiB, VmHWM, see bench-common.h). */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "bench-common.h"

#define WORKING_SET 1024
#define MIN_SIZE 4
#define MAX_SIZE 32768
#define NSIZES 8000                 /* precomputed block sizes, cycled */
#define NOFFSETS (WORKING_SET * 4)  /* precomputed slot indices, cycled */
#define SEED 88

static unsigned size_table[NSIZES];
static unsigned offset_table[NOFFSETS];
static volatile sig_atomic_t time_is_up;

/* Inverse transform of the density ~ 1/x^2 on [MIN_SIZE, MAX_SIZE]: F^-1(u) = 1/(1/a - u(1/a - 1/b)). */
static unsigned inverse_square_size(double u)
{
    const double inv_min = 1.0 / MIN_SIZE, inv_max = 1.0 / MAX_SIZE;
    return (unsigned)(1.0 / (inv_min - u * (inv_min - inv_max)));
}

static void fill_tables(void)
{
    bench_rng rng;
    bench_rng_seed(&rng, SEED);
    for (int i = 0; i < NSIZES; i++)
        size_table[i] = inverse_square_size(bench_rng_unit(&rng));
    for (int i = 0; i < NOFFSETS; i++)
        offset_table[i] = (unsigned)bench_rng_below(&rng, WORKING_SET);
}

struct worker {
    pthread_t thread;
    uint64_t iterations;
    uint64_t elapsed_ns;
};

static void *work(void *arg)
{
    struct worker *w = arg;
    void **slots = calloc(WORKING_SET, sizeof *slots);
    if (!slots)
        abort();
    unsigned size_i = 0, offset_i = 0;
    uint64_t n = 0;
    uint64_t start = bench_now_ns();
    while (!time_is_up) {
        unsigned slot = offset_table[offset_i];
        offset_i = offset_i + 1 == NOFFSETS ? 0 : offset_i + 1;
        size_t size = size_table[size_i];
        size_i = size_i + 1 == NSIZES ? 0 : size_i + 1;
        free(slots[slot]);
        slots[slot] = malloc(size);
        bench_escape(slots[slot]);
        n++;
    }
    w->elapsed_ns = bench_now_ns() - start;
    w->iterations = n;
    for (int i = 0; i < WORKING_SET; i++)
        free(slots[i]);
    free(slots);
    return NULL;
}

static void on_alarm(int sig)
{
    (void)sig;
    time_is_up = 1;
}

static void usage(const char *prog)
{
    fprintf(stderr, "usage: %s [THREADS] [--duration SECONDS]   (defaults: 1 thread, 10 s)\n", prog);
    exit(2);
}

int main(int argc, char **argv)
{
    long threads = 1;
    double duration = 10.0;
    for (int i = 1; i < argc; i++) {
        char *end;
        if (strcmp(argv[i], "--duration") == 0 && i + 1 < argc) {
            duration = strtod(argv[++i], &end);
            if (*end || !(duration > 0 && duration < 86400))
                usage(argv[0]);
        } else {
            threads = strtol(argv[i], &end, 10);
            if (*end || threads < 1 || threads > 1024)
                usage(argv[0]);
        }
    }
    fill_tables();

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval timer = {.it_value = {.tv_sec = (time_t)duration,
                                           .tv_usec = (suseconds_t)((duration - floor(duration)) * 1e6)}};

    struct worker *workers = calloc((size_t)threads, sizeof *workers);
    if (!workers)
        return 1;
    setitimer(ITIMER_REAL, &timer, NULL);
    if (threads == 1) {
        work(&workers[0]);
    } else {
        for (long i = 0; i < threads; i++)
            if (pthread_create(&workers[i].thread, NULL, work, &workers[i]) != 0) {
                perror("pthread_create");
                return 1;
            }
        for (long i = 0; i < threads; i++)
            pthread_join(workers[i].thread, NULL);
    }

    uint64_t total_ns = 0, total_iterations = 0;
    for (long i = 0; i < threads; i++) {
        total_ns += workers[i].elapsed_ns;
        total_iterations += workers[i].iterations;
    }
    free(workers);

    printf("{\n \"timing_type\": \"clock_gettime\",\n \"functions\": {\n  \"malloc\": {\n   \"\": {\n");
    printf("    \"duration\": %llu,\n    \"iterations\": %llu,\n    \"time_per_iteration\": %.3f,\n",
           (unsigned long long)total_ns, (unsigned long long)total_iterations,
           total_iterations ? (double)total_ns / (double)total_iterations : 0.0);
    printf("    \"max_rss\": %ld,\n    \"threads\": %ld,\n    \"min_size\": %d,\n    \"max_size\": %d,\n"
           "    \"random_seed\": %d\n",
           bench_peak_rss_kib(), threads, MIN_SIZE, MAX_SIZE, SEED);
    printf("   }\n  }\n }\n}\n");
    return 0;
}
