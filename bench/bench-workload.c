/* bench-workload NAME [--parallel[=N]] [--scale K]: workloads modelled on WebKit's MallocBench,
 * larson and mstress, and on the memory issues of real services (thread churn, fragmentation).
 * Prints one JSON line: time, peak RSS, RSS after everything was freed, and after malloc_trim(0).
 * `bench-workload --list` names them. Scale 1 is the quick size (well under a second each, but
 * bigfill, whose time is mostly page faults: a second or more where faults are slow). */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <malloc.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "bench-common.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define PAGE 4096

/* What one running copy of a workload gets: with --parallel, each thread runs its own copy. */
/* One per thread; a cache line each, so the copies of --parallel share nothing. */
struct ctx {
    double scale;
    int copies;      /* copies running at once (--parallel), for the threads a copy starts */
    bench_rng rng;
    uint64_t ops;    /* allocations made, reported as "ops" */
} __attribute__((aligned(64)));

/* n scaled, at least 1. */
static size_t scaled(const struct ctx *c, double n)
{
    double v = n * c->scale;
    return v < 1 ? 1 : (size_t)v;
}

static void *xmalloc(struct ctx *c, size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "bench-workload: malloc(%zu) failed\n", n);
        exit(1);
    }
    c->ops++;
    bench_escape(p);
    return p;
}

/* The byte touch_pages writes at offset off (a page boundary): never 0, so a lost page shows. */
static char page_mark(size_t off)
{
    return (char)((off / PAGE) | 1);
}

/* Writes one byte in every page of p[from, to), from a page boundary: the memory is really used. */
static void touch_pages(char *p, size_t from, size_t to)
{
    for (size_t off = from; off < to; off += PAGE)
        ((volatile char *)p)[off] = page_mark(off);
}

/* Threads a multi-threaded copy runs at once: its share of the online CPUs, `least` at the
 * fewest. So one copy alone keeps every CPU busy, and --parallel's copies (one per CPU) run
 * `least` threads each. */
static int cpu_share(const struct ctx *c, int least)
{
    long share = sysconf(_SC_NPROCESSORS_ONLN) / c->copies;
    return share < least ? least : (int)share;
}

static void *xaligned_calloc(size_t n, size_t size) /* zeroed, 64-aligned (for struct ctx) */
{
    void *p = aligned_alloc(64, (n * size + 63) & ~(size_t)63);
    if (!p)
        exit(1);
    return memset(p, 0, n * size);
}

static pthread_t start_thread(void *(*fn)(void *), void *arg)
{
    pthread_t t;
    if (pthread_create(&t, NULL, fn, arg) != 0) {
        perror("pthread_create");
        exit(1);
    }
    return t;
}

static size_t uniform(struct ctx *c, size_t lo, size_t hi) /* [lo, hi] */
{
    return lo + bench_rng_below(&c->rng, hi - lo + 1);
}

/* A size mix is a list of bands; a percentile drawn below a band's `below` (and not below an
 * earlier band's) picks a size uniformly in [lo, hi]. The last band has below = 100. */
struct band {
    unsigned below;
    size_t lo, hi;
};

static size_t mixed_size(struct ctx *c, const struct band *band)
{
    unsigned pick = (unsigned)bench_rng_below(&c->rng, 100);
    while (pick >= band->below)
        band++;
    return uniform(c, band->lo, band->hi);
}

static void run_threads(int n, void *(*fn)(void *), void *args, size_t arg_size)
{
    pthread_t *t = malloc((size_t)n * sizeof *t);
    if (!t)
        exit(1);
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, fn, (char *)args + (size_t)i * arg_size) != 0) {
            perror("pthread_create");
            exit(1);
        }
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    free(t);
}

/* ---- churn: many short-lived small objects (a FIFO of 64 live ones) ---- */
static void churn(struct ctx *c)
{
    static const unsigned sizes[] = {16, 24, 32, 48, 64, 80, 96, 128, 160, 256};
    void *ring[64] = {0};
    size_t n = scaled(c, 20e6);
    for (size_t i = 0; i < n; i++) {
        unsigned k = i & 63;
        free(ring[k]);
        ring[k] = xmalloc(c, sizes[bench_rng_below(&c->rng, 10)]);
        *(size_t *)ring[k] = i;
    }
    for (int k = 0; k < 64; k++)
        free(ring[k]);
}

/* ---- list: build linked lists of nodes with payloads, unlink a third, grow, walk, free ---- */
struct lnode {
    struct lnode *next;
    char *payload;
    size_t len;
};

static struct lnode *list_push(struct ctx *c, struct lnode *head)
{
    struct lnode *n = xmalloc(c, sizeof *n);
    n->len = uniform(c, 8, 248);
    n->payload = xmalloc(c, n->len);
    memset(n->payload, (int)n->len, n->len);
    n->next = head;
    return n;
}

static void list_free_node(struct lnode *n)
{
    free(n->payload);
    free(n);
}

static void list(struct ctx *c)
{
    size_t reps = scaled(c, 100), len = 20000;
    size_t sum = 0;
    for (size_t r = 0; r < reps; r++) {
        struct lnode *head = NULL;
        for (size_t i = 0; i < len; i++)
            head = list_push(c, head);
        for (struct lnode *n = head; n && n->next; n = n->next) { /* unlink every third */
            if (bench_rng_below(&c->rng, 3) == 0) {
                struct lnode *dead = n->next;
                n->next = dead->next;
                list_free_node(dead);
            }
        }
        for (size_t i = 0; i < len / 3; i++)
            head = list_push(c, head);
        for (struct lnode *n = head; n; n = n->next)
            sum += (unsigned char)n->payload[n->len - 1];
        while (head) {
            struct lnode *next = head->next;
            list_free_node(head);
            head = next;
        }
    }
    bench_escape(&sum);
}

/* ---- tree: a binary search tree with payloads; insert, then replace random keys ---- */
struct tnode {
    struct tnode *child[2];
    uint64_t key;
    char *payload;
};

static void tree_insert(struct ctx *c, struct tnode **root, uint64_t key)
{
    struct tnode **at = root;
    while (*at)
        at = &(*at)->child[key > (*at)->key];
    struct tnode *n = xmalloc(c, sizeof *n);
    n->child[0] = n->child[1] = NULL;
    n->key = key;
    size_t len = uniform(c, 8, 120);
    n->payload = xmalloc(c, len);
    memset(n->payload, 0x5a, len);
    *at = n;
}

/* Unlinks the node holding key (present) and frees it; a node with two children takes its successor's place. */
static void tree_delete(struct tnode **root, uint64_t key)
{
    struct tnode **at = root;
    while ((*at)->key != key)
        at = &(*at)->child[key > (*at)->key];
    struct tnode *dead = *at;
    if (!dead->child[0] || !dead->child[1]) {
        *at = dead->child[dead->child[0] == NULL];
    } else {
        struct tnode **succ = &dead->child[1];
        while ((*succ)->child[0])
            succ = &(*succ)->child[0];
        struct tnode *s = *succ;
        *succ = s->child[1];
        s->child[0] = dead->child[0];
        s->child[1] = dead->child[1];
        *at = s;
    }
    free(dead->payload);
    free(dead);
}

static void tree_free(struct tnode *n)
{
    while (n) { /* recurse on the left, loop on the right */
        tree_free(n->child[0]);
        struct tnode *right = n->child[1];
        free(n->payload);
        free(n);
        n = right;
    }
}

static void tree(struct ctx *c)
{
    size_t reps = scaled(c, 4), size = 40000;
    uint64_t *keys = xmalloc(c, size * sizeof *keys);
    for (size_t r = 0; r < reps; r++) {
        struct tnode *root = NULL;
        for (size_t i = 0; i < size; i++) {
            keys[i] = bench_rng_next(&c->rng);
            tree_insert(c, &root, keys[i]);
        }
        for (size_t i = 0; i < 2 * size; i++) {
            size_t k = bench_rng_below(&c->rng, size);
            tree_delete(&root, keys[k]);
            keys[k] = bench_rng_next(&c->rng);
            tree_insert(c, &root, keys[k]);
        }
        tree_free(root);
    }
    free(keys);
}

/* ---- fragment: allocate many small blocks, free every other, allocate larger ones in the gaps ---- */
static void fragment(struct ctx *c)
{
    size_t reps = scaled(c, 8), n = 200000;
    char **blocks = xmalloc(c, n * sizeof *blocks);
    for (size_t r = 0; r < reps; r++) {
        for (size_t i = 0; i < n; i++) {
            size_t len = 16 + 8 * bench_rng_below(&c->rng, 15); /* 16..128 */
            blocks[i] = xmalloc(c, len);
            blocks[i][0] = (char)i;
        }
        for (size_t i = 0; i < n; i += 2)
            free(blocks[i]);
        for (size_t i = 0; i < n; i += 2) {
            size_t len = 144 + 16 * bench_rng_below(&c->rng, 8); /* 144..256 */
            blocks[i] = xmalloc(c, len);
            blocks[i][0] = (char)i;
        }
        for (size_t i = 0; i < n; i++)
            free(blocks[i]);
    }
    free(blocks);
}

/* ---- medium and big: random replacement in a small set of live blocks, every page used ---- */
static void replace_loop(struct ctx *c, size_t live, size_t iterations, size_t lo, size_t hi)
{
    void **slot = calloc(live, sizeof *slot);
    if (!slot)
        exit(1);
    for (size_t i = 0; i < iterations; i++) {
        size_t k = bench_rng_below(&c->rng, live);
        free(slot[k]);
        size_t len = uniform(c, lo, hi);
        slot[k] = xmalloc(c, len);
        touch_pages(slot[k], 0, len);
    }
    for (size_t k = 0; k < live; k++)
        free(slot[k]);
    free(slot);
}

static void medium(struct ctx *c)
{
    replace_loop(c, 128, scaled(c, 600000), 8 * KIB, 64 * KIB);
}

static void big(struct ctx *c)
{
    replace_loop(c, 8, scaled(c, 300), 1 * MIB, 8 * MIB);
}

/* ---- big-loop: malloc, use and free a few MiB (2..8 MiB in turn), over and over ---- */
static void big_loop(struct ctx *c)
{
    size_t n = scaled(c, 1500);
    for (size_t i = 0; i < n; i++) {
        size_t len = (2 + i % 7) * MIB;
        char *p = xmalloc(c, len);
        touch_pages(p, 0, len);
        free(p);
    }
}

/* ---- realloc-grow: grow one buffer in 64 KiB steps, using each new page, to 64 MiB at scale 1;
 * larger scales grow further, up to 256 MiB (scale 4), then repeat the growth. ---- */
static void realloc_grow(struct ctx *c)
{
    size_t step = 64 * KIB;
    size_t top = c->scale >= 4 ? 256 * MIB : (size_t)(c->scale * 64) * MIB;
    size_t reps = scaled(c, 0.25);
    if (top < step)
        top = step;
    for (size_t r = 0; r < reps; r++) {
        char *buf = NULL;
        for (size_t len = step; len <= top; len += step) {
            char *p = realloc(buf, len);
            if (!p) {
                fprintf(stderr, "bench-workload: realloc(%zu) failed\n", len);
                exit(1);
            }
            c->ops++;
            buf = p;
            touch_pages(buf, len - step, len);
        }
        for (size_t off = 0; off < top; off += MIB) /* the contents survived every move */
            if (buf[off] != page_mark(off)) {
                fprintf(stderr, "bench-workload: realloc lost the byte at offset %zu\n", off);
                exit(1);
            }
        free(buf);
    }
}

/* ---- message: blocks allocated by a producer thread and freed by a consumer thread ----
 * The two sides wait for each other by sleeping on a futex after a short spin, and a sleeper
 * is woken only once its side has half the queue to work on: so the pair hands over
 * batches however the scheduler places it (waiting with sched_yield would make the time
 * depend on that placement). */
#define QUEUE_SLOTS 1024
#define QUEUE_SPINS 256

struct queue {
    _Alignas(64) _Atomic size_t head;       /* next slot to read, written by the consumer */
    _Atomic uint32_t producer_sleeps;       /* 1: the producer waits for room */
    _Alignas(64) _Atomic size_t tail;       /* next slot to write, written by the producer */
    _Atomic uint32_t consumer_sleeps;       /* 1: the consumer waits for messages */
    _Alignas(64) void *slot[QUEUE_SLOTS];
};

static void futex_wait(_Atomic uint32_t *word)
{
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, 1, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *word)
{
    atomic_store(word, 0);
    syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* Waits until ready(q, arg) holds: spins a little, then sleeps on *sleeps. The sleeper's
 * store to *sleeps and the other side's store to head or tail are both seq_cst, and each
 * side loads the other's word after its own store, so one of them always sees the other:
 * no wake-up is lost. */
static void queue_wait(struct queue *q, _Atomic uint32_t *sleeps, bool (*ready)(struct queue *, size_t),
                       size_t arg)
{
    for (int i = 0; i < QUEUE_SPINS; i++) {
        if (ready(q, arg))
            return;
        __builtin_ia32_pause();
    }
    for (;;) {
        atomic_store(sleeps, 1);
        if (ready(q, arg))
            break;
        futex_wait(sleeps);
    }
    atomic_store(sleeps, 0);
}

static bool queue_has_room(struct queue *q, size_t t) { return t - atomic_load(&q->head) < QUEUE_SLOTS; }
static bool queue_has_message(struct queue *q, size_t h) { return atomic_load(&q->tail) != h; }

/* msg NULL ends the stream, and wakes the consumer whatever the queue holds. */
static void queue_push(struct queue *q, void *msg)
{
    size_t t = atomic_load_explicit(&q->tail, memory_order_relaxed);
    if (t - atomic_load_explicit(&q->head, memory_order_acquire) == QUEUE_SLOTS)
        queue_wait(q, &q->producer_sleeps, queue_has_room, t);
    q->slot[t % QUEUE_SLOTS] = msg;
    atomic_store(&q->tail, t + 1);
    if (atomic_load(&q->consumer_sleeps) &&
        (!msg || t + 1 - atomic_load_explicit(&q->head, memory_order_relaxed) >= QUEUE_SLOTS / 2))
        futex_wake(&q->consumer_sleeps);
}

static void *queue_pop(struct queue *q)
{
    size_t h = atomic_load_explicit(&q->head, memory_order_relaxed);
    if (atomic_load_explicit(&q->tail, memory_order_acquire) == h)
        queue_wait(q, &q->consumer_sleeps, queue_has_message, h);
    void *msg = q->slot[h % QUEUE_SLOTS];
    atomic_store(&q->head, h + 1);
    if (atomic_load(&q->producer_sleeps) &&
        atomic_load_explicit(&q->tail, memory_order_relaxed) - (h + 1) <= QUEUE_SLOTS / 2)
        futex_wake(&q->producer_sleeps);
    return msg;
}

static void *message_consumer(void *arg)
{
    struct queue *q = arg;
    size_t sum = 0;
    for (char *msg; (msg = queue_pop(q)) != NULL; free(msg))
        sum += (unsigned char)msg[0];
    bench_escape(&sum);
    return NULL;
}

static void message(struct ctx *c)
{
    struct queue *q = calloc(1, sizeof *q);
    if (!q)
        exit(1);
    pthread_t consumer;
    if (pthread_create(&consumer, NULL, message_consumer, q) != 0)
        exit(1);
    size_t n = scaled(c, 1.5e6);
    for (size_t i = 0; i < n; i++) {
        size_t len = uniform(c, 16, 512);
        char *msg = xmalloc(c, len);
        memset(msg, (int)i, len < 64 ? len : 64);
        queue_push(q, msg);
    }
    queue_push(q, NULL);
    pthread_join(consumer, NULL);
    free(q);
}

/* ---- thread-churn: threads that each allocate a little, created and joined one after another ---- */
#define SMALL_THREAD_BLOCKS 32 /* plus one 8 KiB buffer */

static void *small_thread(void *arg)
{
    struct ctx c = {.scale = 1};
    bench_rng_seed(&c.rng, (uintptr_t)arg);
    void *keep[SMALL_THREAD_BLOCKS];
    for (int i = 0; i < SMALL_THREAD_BLOCKS; i++)
        keep[i] = xmalloc(&c, uniform(&c, 16, 1024));
    void *buf = xmalloc(&c, 8 * KIB);
    memset(buf, 1, 8 * KIB);
    for (int i = 0; i < SMALL_THREAD_BLOCKS; i++)
        free(keep[i]);
    free(buf);
    return NULL;
}

static void spawn_and_join_one(uintptr_t seed)
{
    pthread_t t;
    if (pthread_create(&t, NULL, small_thread, (void *)seed) != 0) {
        perror("pthread_create");
        exit(1);
    }
    pthread_join(t, NULL);
}

static long rss_after_one_thread = -1;

static void thread_churn_prepare(void)
{
    spawn_and_join_one(1);
    rss_after_one_thread = bench_rss_kib();
}

static void thread_churn(struct ctx *c)
{
    size_t n = scaled(c, 10000);
    for (size_t i = 0; i < n; i++)
        spawn_and_join_one(i + 2);
    c->ops += (SMALL_THREAD_BLOCKS + 1) * n;
}

/* ---- many-threads: 400 threads in waves of 80 live at once, each churning a mix of sizes ---- */
#define WAVE 80
#define WAVES 5

struct wave_arg {
    pthread_barrier_t *all_loaded;
    double scale;
    uint64_t seed;
    uint64_t ops;
};

static const struct band wave_mix[] = { /* 70% 16..256, 25% 257..4 KiB, 5% 4..64 KiB */
    {70, 16, 256}, {95, 257, 4 * KIB}, {100, 4 * KIB + 1, 64 * KIB}};

static void *wave_thread(void *arg)
{
    struct wave_arg *a = arg;
    struct ctx c = {.scale = a->scale};
    bench_rng_seed(&c.rng, a->seed);
    enum { LIVE = 64 };
    char *slot[LIVE];
    for (int k = 0; k < LIVE; k++)
        slot[k] = xmalloc(&c, mixed_size(&c, wave_mix));
    pthread_barrier_wait(a->all_loaded); /* the whole wave holds its memory at once */
    size_t n = scaled(&c, 2000);
    for (size_t i = 0; i < n; i++) {
        size_t k = bench_rng_below(&c.rng, LIVE);
        free(slot[k]);
        slot[k] = xmalloc(&c, mixed_size(&c, wave_mix));
        slot[k][0] = (char)i;
    }
    for (int k = 0; k < LIVE; k++)
        free(slot[k]);
    a->ops = c.ops;
    return NULL;
}

static void many_threads(struct ctx *c)
{
    struct wave_arg args[WAVE];
    pthread_barrier_t loaded;
    for (int w = 0; w < WAVES; w++) {
        pthread_barrier_init(&loaded, NULL, WAVE);
        for (int i = 0; i < WAVE; i++)
            args[i] = (struct wave_arg){&loaded, c->scale, bench_rng_next(&c->rng), 0};
        run_threads(WAVE, wave_thread, args, sizeof args[0]);
        pthread_barrier_destroy(&loaded);
        for (int i = 0; i < WAVE; i++)
            c->ops += args[i].ops;
    }
}

/* ---- fragment-mix: a large mixed heap, 90% freed in random order, then a different mix ---- */
static const struct band first_mix[] = { /* 80% 16..256, 18% 257..4 KiB, 2% 4..32 KiB */
    {80, 16, 256}, {98, 257, 4 * KIB}, {100, 4 * KIB + 1, 32 * KIB}};
static const struct band second_mix[] = { /* 60% 20..60, 30% 600..1500, 10% 20..100 KiB */
    {60, 20, 60}, {90, 600, 1500}, {100, 20 * KIB, 100 * KIB}};

static void fragment_mix(struct ctx *c)
{
    size_t n = scaled(c, 200000);
    char **a = xmalloc(c, n * sizeof *a);
    size_t bytes_a = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = mixed_size(c, first_mix);
        a[i] = xmalloc(c, len);
        memset(a[i], 1, len);
        bytes_a += len;
    }
    for (size_t i = n - 1; i > 0; i--) { /* shuffle, then free the first 90% */
        size_t j = bench_rng_below(&c->rng, i + 1);
        char *t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
    size_t freed = n * 9 / 10;
    for (size_t i = 0; i < freed; i++)
        free(a[i]);

    size_t cap = 1024, nb = 0, bytes_b = 0;
    char **b = xmalloc(c, cap * sizeof *b);
    while (bytes_b < bytes_a / 2) {
        if (nb == cap) {
            cap *= 2;
            b = realloc(b, cap * sizeof *b);
            if (!b)
                exit(1);
        }
        size_t len = mixed_size(c, second_mix);
        b[nb] = xmalloc(c, len);
        memset(b[nb++], 2, len);
        bytes_b += len;
    }
    for (size_t i = freed; i < n; i++)
        free(a[i]);
    for (size_t i = 0; i < nb; i++)
        free(b[i]);
    free(a);
    free(b);
}

/* ---- larson: a server's threads each replace random blocks of their own pool; a thread in
 * turn ends and hands its pool to a thread it creates, which frees what its predecessor
 * allocated. One lineage of threads per CPU (cpu_share), each with its own pool. ---- */
#define LARSON_BLOCKS 2000      /* a pool: blocks of 10..1000 bytes, about 1 MB */
#define LARSON_TURN 10000       /* replacements a thread makes before it hands the pool on */

struct larson_line {
    struct ctx c;               /* the lineage's generator and count, passed on with the pool */
    char *pool[LARSON_BLOCKS];
    size_t threads_left;        /* threads still to run in this lineage, the running one too */
    pthread_t prev;             /* the thread that handed the pool over; its successor joins it */
    bool has_prev;
    pthread_t last;             /* the lineage's last thread, joined by larson() */
    sem_t *done;                /* posted by each lineage's last thread */
};

static char *larson_block(struct larson_line *l)
{
    size_t len = uniform(&l->c, 10, 1000);
    char *p = xmalloc(&l->c, len);
    memset(p, (int)len, 8);
    memset(p + len - 8, (int)len, 8);
    return p;
}

static void *larson_thread(void *arg)
{
    struct larson_line *l = arg;
    if (l->has_prev)
        pthread_join(l->prev, NULL);
    else
        for (size_t k = 0; k < LARSON_BLOCKS; k++)
            l->pool[k] = larson_block(l);
    for (size_t i = 0; i < LARSON_TURN; i++) {
        size_t k = bench_rng_below(&l->c.rng, LARSON_BLOCKS);
        free(l->pool[k]);
        l->pool[k] = larson_block(l);
    }
    if (--l->threads_left > 0) { /* nothing of l is touched after the successor starts */
        l->prev = pthread_self();
        l->has_prev = true;
        start_thread(larson_thread, l);
        return NULL;
    }
    for (size_t k = 0; k < LARSON_BLOCKS; k++)
        free(l->pool[k]);
    l->last = pthread_self();
    sem_post(l->done);
    return NULL;
}

static void larson(struct ctx *c)
{
    int lines = cpu_share(c, 2);
    struct larson_line *line = xaligned_calloc((size_t)lines, sizeof *line);
    sem_t done;
    sem_init(&done, 0, 0);
    for (int i = 0; i < lines; i++) {
        line[i].c = (struct ctx){.scale = c->scale, .copies = c->copies};
        bench_rng_seed(&line[i].c.rng, bench_rng_next(&c->rng));
        line[i].threads_left = scaled(c, 600);
        line[i].done = &done;
        start_thread(larson_thread, &line[i]);
    }
    for (int i = 0; i < lines; i++)
        sem_wait(&done);
    for (int i = 0; i < lines; i++) {
        pthread_join(line[i].last, NULL);
        c->ops += line[i].c.ops;
    }
    sem_destroy(&done);
    free(line);
}

/* ---- mstress: twice as many threads as CPUs (cpu_share), restarted a few times, replace
 * blocks of up to 1 MiB at random in a set of their own; one replacement in ten hands the
 * block over to a shared slot instead, and frees the one it finds there, another thread's,
 * maybe one that ended. Each block is written at its start and in a few of its pages. ---- */
#define MSTRESS_LIVE 256        /* blocks a thread holds */
#define MSTRESS_SHARED 128      /* shared slots per thread */
#define MSTRESS_RUNS 4          /* each thread slot runs this many threads, one after another */

static const struct band mstress_mix[] = { /* 85% 8..512, 12% 513..64 KiB, 3% 64 KiB..1 MiB */
    {85, 8, 512}, {97, 513, 64 * KIB}, {100, 64 * KIB + 1, MIB}};

struct mstress_arg {
    struct ctx c;
    _Atomic(char *) *shared;
    size_t nshared;
};

/* Writes the first bytes of p, and a byte a quarter in, halfway and at the end: a few pages
 * of a large block. */
static char *touch_spread(char *p, size_t len)
{
    memset(p, (int)len, len < 32 ? len : 32);
    p[len / 4] = 1;
    p[len / 2] = 2;
    p[len - 1] = 3;
    return p;
}

static char *mstress_block(struct ctx *c)
{
    size_t len = mixed_size(c, mstress_mix);
    return touch_spread(xmalloc(c, len), len);
}

static void *mstress_thread(void *arg)
{
    struct mstress_arg *a = arg;
    struct ctx *c = &a->c;
    char *slot[MSTRESS_LIVE];
    for (size_t k = 0; k < MSTRESS_LIVE; k++)
        slot[k] = mstress_block(c);
    size_t n = scaled(c, 60000);
    for (size_t i = 0; i < n; i++) {
        size_t k = bench_rng_below(&c->rng, MSTRESS_LIVE);
        if (bench_rng_below(&c->rng, 10) == 0)
            free(atomic_exchange(&a->shared[bench_rng_below(&c->rng, a->nshared)], slot[k]));
        else
            free(slot[k]);
        slot[k] = mstress_block(c);
    }
    for (size_t k = 0; k < MSTRESS_LIVE; k++)
        free(slot[k]);
    return NULL;
}

static void mstress(struct ctx *c)
{
    int threads = 2 * cpu_share(c, 2);
    size_t nshared = (size_t)threads * MSTRESS_SHARED;
    _Atomic(char *) *shared = xaligned_calloc(nshared, sizeof *shared);
    struct mstress_arg *args = xaligned_calloc((size_t)threads, sizeof *args);
    for (int run = 0; run < MSTRESS_RUNS; run++) {
        for (int i = 0; i < threads; i++) {
            args[i] = (struct mstress_arg){.c = {.scale = c->scale, .copies = c->copies},
                                           .shared = shared, .nshared = nshared};
            bench_rng_seed(&args[i].c.rng, bench_rng_next(&c->rng));
        }
        run_threads(threads, mstress_thread, args, sizeof args[0]);
        for (int i = 0; i < threads; i++)
            c->ops += args[i].c.ops;
    }
    for (size_t j = 0; j < nshared; j++)
        free(atomic_load(&shared[j]));
    free(args);
    free(shared);
}

/* ---- prodcons: several producers and several consumers (cpu_share each). A producer mallocs
 * messages (3 in 4 of 64 bytes, the others 8..256), writes them, and sends each to a consumer
 * chosen at random, in batches of PC_BATCH; a consumer reads and frees them. So every consumer
 * frees blocks of every producer. (message has one producer and one consumer.) ---- */
#define PC_BATCH 32             /* messages a producer hands over at once, in a malloc'ed batch */
#define PC_QUEUE 16             /* batches a consumer's queue holds; a producer waits for room */

struct pc_batch {
    size_t n;
    char *msg[PC_BATCH];
};

struct pc_queue {
    pthread_mutex_t lock;
    pthread_cond_t not_empty, not_full;
    struct pc_batch *ring[PC_QUEUE];
    size_t head, count;
    int producers_left;         /* the queue is finished once no producer is left and it is empty */
} __attribute__((aligned(64)));

struct pc_producer {
    struct ctx c;
    struct pc_queue *queue;
    int nqueues;
};

static void pc_push(struct pc_queue *q, struct pc_batch *b)
{
    pthread_mutex_lock(&q->lock);
    while (q->count == PC_QUEUE)
        pthread_cond_wait(&q->not_full, &q->lock);
    q->ring[(q->head + q->count++) % PC_QUEUE] = b;
    pthread_cond_signal(&q->not_empty);
    pthread_mutex_unlock(&q->lock);
}

/* Takes every batch in q into out; returns how many, 0 once q is finished. */
static size_t pc_take(struct pc_queue *q, struct pc_batch **out)
{
    pthread_mutex_lock(&q->lock);
    while (q->count == 0 && q->producers_left > 0)
        pthread_cond_wait(&q->not_empty, &q->lock);
    size_t n = q->count;
    for (size_t i = 0; i < n; i++)
        out[i] = q->ring[(q->head + i) % PC_QUEUE];
    q->head = (q->head + n) % PC_QUEUE;
    q->count = 0;
    pthread_cond_broadcast(&q->not_full);
    pthread_mutex_unlock(&q->lock);
    return n;
}

static void pc_producer_done(struct pc_queue *q)
{
    pthread_mutex_lock(&q->lock);
    q->producers_left--;
    pthread_cond_signal(&q->not_empty);
    pthread_mutex_unlock(&q->lock);
}

static char *pc_message(struct ctx *c, size_t i)
{
    size_t len = bench_rng_below(&c->rng, 4) ? 64 : uniform(c, 8, 256);
    char *msg = xmalloc(c, len);
    memset(msg, (int)i | 1, len < 64 ? len : 64);
    return msg;
}

static void *pc_produce(void *arg)
{
    struct pc_producer *p = arg;
    struct pc_batch **pending = calloc((size_t)p->nqueues, sizeof *pending);
    if (!pending)
        exit(1);
    size_t n = scaled(&p->c, 1000000);
    for (size_t i = 0; i < n; i++) {
        size_t q = bench_rng_below(&p->c.rng, (uint64_t)p->nqueues);
        if (!pending[q]) {
            pending[q] = xmalloc(&p->c, sizeof *pending[q]);
            pending[q]->n = 0;
        }
        pending[q]->msg[pending[q]->n++] = pc_message(&p->c, i);
        if (pending[q]->n == PC_BATCH) {
            pc_push(&p->queue[q], pending[q]);
            pending[q] = NULL;
        }
    }
    for (int q = 0; q < p->nqueues; q++) {
        if (pending[q])
            pc_push(&p->queue[q], pending[q]);
        pc_producer_done(&p->queue[q]);
    }
    free(pending);
    return NULL;
}

static void *pc_consume(void *arg)
{
    struct pc_queue *q = arg;
    struct pc_batch *got[PC_QUEUE];
    size_t sum = 0;
    for (size_t n; (n = pc_take(q, got)) > 0;)
        for (size_t i = 0; i < n; i++) {
            for (size_t m = 0; m < got[i]->n; m++) {
                sum += (unsigned char)got[i]->msg[m][0];
                free(got[i]->msg[m]);
            }
            free(got[i]);
        }
    bench_escape(&sum);
    return NULL;
}

static void prodcons(struct ctx *c)
{
    int np = cpu_share(c, 2), nc = np;
    struct pc_queue *queue = xaligned_calloc((size_t)nc, sizeof *queue);
    struct pc_producer *prod = xaligned_calloc((size_t)np, sizeof *prod);
    pthread_t *t = xaligned_calloc((size_t)(np + nc), sizeof *t);
    for (int q = 0; q < nc; q++) {
        pthread_mutex_init(&queue[q].lock, NULL);
        pthread_cond_init(&queue[q].not_empty, NULL);
        pthread_cond_init(&queue[q].not_full, NULL);
        queue[q].producers_left = np;
        t[q] = start_thread(pc_consume, &queue[q]);
    }
    for (int i = 0; i < np; i++) {
        prod[i] = (struct pc_producer){.c = {.scale = c->scale, .copies = c->copies},
                                       .queue = queue, .nqueues = nc};
        bench_rng_seed(&prod[i].c.rng, bench_rng_next(&c->rng));
        t[nc + i] = start_thread(pc_produce, &prod[i]);
    }
    for (int i = 0; i < np + nc; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < np; i++)
        c->ops += prod[i].c.ops;
    for (int q = 0; q < nc; q++) {
        pthread_mutex_destroy(&queue[q].lock);
        pthread_cond_destroy(&queue[q].not_empty);
        pthread_cond_destroy(&queue[q].not_full);
    }
    free(t);
    free(prod);
    free(queue);
}

/* ---- bigfill: blocks of 5..25 MiB replaced at random, each zero-filled by the program right
 * after malloc (what C++'s std::make_unique<char[]>(n) does): whether the allocator keeps
 * such blocks' pages for the next one or has every page faulted in afresh. A copy holds 20
 * blocks, or under --parallel 40 / copies (2 at the fewest): up to 20 CPUs, 40 blocks
 * (1000 MiB) at most in the process. 100 replacements at scale 1, 400 at --full's 4. ---- */
static void bigfill(struct ctx *c)
{
    size_t live = (size_t)(40 / c->copies);
    live = live > 20 ? 20 : live < 2 ? 2 : live;
    char **slot = calloc(live, sizeof *slot);
    if (!slot)
        exit(1);
    size_t n = scaled(c, 100);
    for (size_t i = 0; i < n; i++) {
        size_t k = bench_rng_below(&c->rng, live);
        free(slot[k]);
        size_t len = uniform(c, 5 * MIB, 25 * MIB);
        slot[k] = xmalloc(c, len);
        memset(slot[k], 0, len);
    }
    for (size_t k = 0; k < live; k++)
        free(slot[k]);
    free(slot);
}

/* ---- scratch: a thread frees a block another thread made, then works in blocks of its own
 * of that size. The main thread mallocs one small block per worker (neighbours, so in one
 * cache line) and hands one to each; a worker frees it, then over and over mallocs a block,
 * writes it many times and frees it. Workers handed back the blocks they were given, or
 * their neighbours, write one cache line (false sharing). One worker per CPU (cpu_share). */
#define SCRATCH_BLOCK 8

struct scratch_arg {
    char *given;
    size_t rounds, writes;
};

static void *scratch_worker(void *arg)
{
    struct scratch_arg *a = arg;
    free(a->given);
    for (size_t r = 0; r < a->rounds; r++) {
        volatile char *p = malloc(SCRATCH_BLOCK);
        if (!p)
            exit(1);
        for (size_t w = 0; w < a->writes; w++)
            for (int k = 0; k < SCRATCH_BLOCK; k++)
                p[k] = (char)(p[k] + k);
        free((void *)p);
    }
    return NULL;
}

static void scratch(struct ctx *c)
{
    int workers = cpu_share(c, 2);
    struct scratch_arg *args = xmalloc(c, (size_t)workers * sizeof *args);
    for (int i = 0; i < workers; i++)
        args[i] = (struct scratch_arg){xmalloc(c, SCRATCH_BLOCK), 1000, scaled(c, 40000)};
    run_threads(workers, scratch_worker, args, sizeof args[0]);
    c->ops += (uint64_t)workers * args[0].rounds;
    free(args);
}

/* ---- handoff: the thread pool of rpmalloc's benchmark, from its published description.
 * One thread per CPU (cpu_share, at least 2) keeps HANDOFF_SLOTS blocks of 8..16000 bytes,
 * the smaller likelier (a linear falloff). Each round it frees HANDOFF_OPS blocks scattered
 * over its set, then allocates as many into scattered slots (freeing what a slot still
 * holds); every other round it also allocates HANDOFF_OPS blocks and hands them to the next
 * thread, which frees them at its next round (a thread that runs ahead frees a batch itself
 * when the next one has HANDOFF_QUEUED waiting, so the heap stays bounded). Half of the
 * blocks are over 4 KiB. ---- */
#define HANDOFF_SLOTS 1000
#define HANDOFF_OPS 100
#define HANDOFF_QUEUED 4

struct handoff_batch {
    struct handoff_batch *next;
    char *block[HANDOFF_OPS];
};

struct handoff_arg {
    struct ctx c;
    pthread_mutex_t lock;          /* guards inbox and queued */
    struct handoff_batch *inbox;   /* batches handed to this thread */
    int queued;                    /* batches in inbox */
    struct handoff_arg *next;      /* the thread this one hands batches to */
};

static char *handoff_block(struct ctx *c)
{
    size_t a = uniform(c, 8, 16000), b = uniform(c, 8, 16000);
    size_t len = a < b ? a : b; /* the lower of two uniform draws: a linear falloff */
    char *p = xmalloc(c, len);
    memset(p, (int)len, len < 64 ? len : 64);
    return p;
}

static void handoff_free(struct handoff_batch *batch)
{
    while (batch) {
        struct handoff_batch *next = batch->next;
        for (int k = 0; k < HANDOFF_OPS; k++)
            free(batch->block[k]);
        free(batch);
        batch = next;
    }
}

static void handoff_drain(struct handoff_arg *a)
{
    pthread_mutex_lock(&a->lock);
    struct handoff_batch *batch = a->inbox;
    a->inbox = NULL;
    a->queued = 0;
    pthread_mutex_unlock(&a->lock);
    handoff_free(batch);
}

static void *handoff_thread(void *arg)
{
    struct handoff_arg *a = arg;
    struct ctx *c = &a->c;
    char **slot = xmalloc(c, HANDOFF_SLOTS * sizeof *slot);
    for (int k = 0; k < HANDOFF_SLOTS; k++)
        slot[k] = handoff_block(c);
    size_t rounds = scaled(c, 2000);
    for (size_t r = 0; r < rounds; r++) {
        for (int i = 0; i < HANDOFF_OPS; i++) {
            size_t k = bench_rng_below(&c->rng, HANDOFF_SLOTS);
            free(slot[k]);
            slot[k] = NULL;
        }
        for (int i = 0; i < HANDOFF_OPS; i++) {
            size_t k = bench_rng_below(&c->rng, HANDOFF_SLOTS);
            free(slot[k]);
            slot[k] = handoff_block(c);
        }
        if (r % 2) {
            struct handoff_batch *batch = xmalloc(c, sizeof *batch);
            for (int k = 0; k < HANDOFF_OPS; k++)
                batch->block[k] = handoff_block(c);
            batch->next = NULL;
            pthread_mutex_lock(&a->next->lock);
            bool room = a->next->queued < HANDOFF_QUEUED;
            if (room) {
                batch->next = a->next->inbox;
                a->next->inbox = batch;
                a->next->queued++;
            }
            pthread_mutex_unlock(&a->next->lock);
            if (!room)
                handoff_free(batch);
        }
        handoff_drain(a);
    }
    for (int k = 0; k < HANDOFF_SLOTS; k++)
        free(slot[k]);
    free(slot);
    return NULL;
}

static void handoff(struct ctx *c)
{
    int threads = cpu_share(c, 2);
    struct handoff_arg *args = xaligned_calloc((size_t)threads, sizeof *args);
    for (int i = 0; i < threads; i++) {
        args[i].c = (struct ctx){.scale = c->scale, .copies = c->copies};
        bench_rng_seed(&args[i].c.rng, bench_rng_next(&c->rng));
        pthread_mutex_init(&args[i].lock, NULL);
        args[i].next = &args[(i + 1) % threads];
    }
    run_threads(threads, handoff_thread, args, sizeof args[0]);
    for (int i = 0; i < threads; i++) {
        handoff_drain(&args[i]); /* what the next thread handed over after this one ended */
        pthread_mutex_destroy(&args[i].lock);
        c->ops += args[i].c.ops;
    }
    free(args);
}

/* ---- the table, the harness ---- */
struct workload {
    const char *name;
    void (*run)(struct ctx *);
    void (*prepare)(void); /* runs once in the main thread before the clock starts, or NULL */
    const char *what;
};

static const struct workload workloads[] = {
    {"churn", churn, NULL, "short-lived small objects"},
    {"list", list, NULL, "linked lists with payloads: build, unlink, walk, free"},
    {"tree", tree, NULL, "binary search tree with payloads: insert, replace, free"},
    {"fragment", fragment, NULL, "many small blocks, free every other, larger ones in the gaps"},
    {"medium", medium, NULL, "blocks of 8..64 KiB replaced at random"},
    {"big", big, NULL, "blocks of 1..8 MiB replaced at random"},
    {"big-loop", big_loop, NULL, "malloc, use, free 2..8 MiB in a loop"},
    {"realloc-grow", realloc_grow, NULL, "realloc a buffer up in 64 KiB steps to 64 MiB x scale (max 256)"},
    {"message", message, NULL, "producer thread mallocs, consumer thread frees"},
    {"thread-churn", thread_churn, thread_churn_prepare, "10000 x scale short threads, each allocates a little"},
    {"many-threads", many_threads, NULL, "400 threads, 80 live at once, mixed sizes"},
    {"fragment-mix", fragment_mix, NULL, "mixed heap, 90% freed at random, then another mix"},
    {"larson", larson, NULL, "server threads replace pool blocks, each hands its pool to a new thread"},
    {"mstress", mstress, NULL, "2 threads a CPU, restarted, blocks up to 1 MiB, some freed by others"},
    {"prodcons", prodcons, NULL, "producers malloc messages, consumers free them, many to many"},
    {"bigfill", bigfill, NULL, "blocks of 5..25 MiB replaced at random, each zero-filled"},
    {"scratch", scratch, NULL, "threads free blocks made by another, then write their own"},
    {"handoff", handoff, NULL, "threads replace blocks of 8..16000 bytes, hand batches on to free"},
};
#define NWORKLOADS (sizeof workloads / sizeof workloads[0])

static const struct workload *chosen;

static void *run_copy(void *arg)
{
    chosen->run(arg);
    return NULL;
}

static void usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s NAME [--parallel[=N]] [--scale K] [--linger MS]\n"
            "       %s --list\n"
            "  --parallel[=N]  run N copies at once, one per thread (default N: online CPUs)\n"
            "  --scale K       multiply the work by K (default 1, the quick size)\n"
            "  --linger MS     after the workload, go on allocating a little for MS milliseconds\n"
            "                  (untimed), then report the RSS (rss_linger_kib)\n",
            prog, prog);
    exit(2);
}

/* A program that freed its heap and goes on working a little: every 10 ms, 256 blocks of
 * 48 bytes malloc'ed, written and freed, for ms milliseconds. What memory the allocator
 * gives back meanwhile without malloc_trim shows in the RSS after. */
static void linger(long ms)
{
    void *p[256];
    uint64_t end = bench_now_ns() + (uint64_t)ms * 1000000;
    while (bench_now_ns() < end) {
        usleep(10 * 1000);
        for (int i = 0; i < 256; i++) {
            p[i] = malloc(48);
            if (!p[i])
                exit(1);
            memset(p[i], i, 48);
        }
        for (int i = 0; i < 256; i++)
            free(p[i]);
    }
}

int main(int argc, char **argv)
{
    int copies = 1;
    double scale = 1;
    long linger_ms = -1;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        char *end;
        if (strcmp(arg, "--list") == 0) {
            for (size_t w = 0; w < NWORKLOADS; w++)
                printf("%-14s %s\n", workloads[w].name, workloads[w].what);
            return 0;
        } else if (strcmp(arg, "--parallel") == 0) {
            copies = (int)sysconf(_SC_NPROCESSORS_ONLN);
        } else if (strncmp(arg, "--parallel=", 11) == 0) {
            copies = (int)strtol(arg + 11, &end, 10);
            if (*end || copies < 1 || copies > 256)
                usage(argv[0]);
        } else if (strcmp(arg, "--linger") == 0 && i + 1 < argc) {
            linger_ms = strtol(argv[++i], &end, 10);
            if (*end || linger_ms < 0 || linger_ms > 60000)
                usage(argv[0]);
        } else if (strcmp(arg, "--scale") == 0 && i + 1 < argc) {
            scale = strtod(argv[++i], &end);
            if (*end || !(scale > 0))
                usage(argv[0]);
        } else if (!chosen) {
            for (size_t w = 0; w < NWORKLOADS; w++)
                if (strcmp(arg, workloads[w].name) == 0)
                    chosen = &workloads[w];
            if (!chosen)
                usage(argv[0]);
        } else {
            usage(argv[0]);
        }
    }
    if (!chosen || copies < 1)
        usage(argv[0]);

    struct ctx *ctx = aligned_alloc(_Alignof(struct ctx), (size_t)copies * sizeof *ctx);
    if (!ctx)
        return 1;
    memset(ctx, 0, (size_t)copies * sizeof *ctx);
    uint64_t name_seed = 0;
    for (const char *s = chosen->name; *s; s++)
        name_seed = name_seed * 131 + (unsigned char)*s;
    for (int i = 0; i < copies; i++) {
        ctx[i].scale = scale;
        ctx[i].copies = copies;
        bench_rng_seed(&ctx[i].rng, name_seed + (uint64_t)i);
    }

    long rss_start = bench_rss_kib();
    if (chosen->prepare)
        chosen->prepare();
    uint64_t t0 = bench_now_ns();
    if (copies == 1)
        chosen->run(&ctx[0]); /* in the main thread: a single-threaded process stays so */
    else
        run_threads(copies, run_copy, ctx, sizeof *ctx);
    double seconds = (double)(bench_now_ns() - t0) * 1e-9;

    uint64_t ops = 0;
    for (int i = 0; i < copies; i++)
        ops += ctx[i].ops;
    free(ctx);
    long rss_end = bench_rss_kib(), rss_linger = -1;
    if (linger_ms >= 0) {
        linger(linger_ms);
        rss_linger = bench_rss_kib();
    }
    malloc_trim(0);
    long rss_trim = bench_rss_kib();

    printf("{\"workload\": \"%s\", \"threads\": %d, \"scale\": %g, \"time_s\": %.6f, \"ops\": %llu, "
           "\"peak_rss_kib\": %ld, \"rss_start_kib\": %ld, \"rss_end_kib\": %ld, \"rss_trim_kib\": %ld",
           chosen->name, copies, scale, seconds, (unsigned long long)ops, bench_peak_rss_kib(),
           rss_start, rss_end, rss_trim);
    if (rss_after_one_thread >= 0)
        printf(", \"rss_one_thread_kib\": %ld", rss_after_one_thread);
    if (rss_linger >= 0)
        printf(", \"rss_linger_kib\": %ld", rss_linger);
    printf("}\n");
    return 0;
}
