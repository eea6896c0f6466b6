/* bench-cxx cxx [--parallel[=N]] [--scale K]: C++ new and delete of small objects, through
 * std::map<int, std::string>, std::list and polymorphic objects held by std::unique_ptr.
 * Prints the JSON line of bench-workload (bench/compare runs both alike); `--list` names it. */
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench-common.h"

namespace {

const char *const NAME = "cxx";
const char *const WHAT = "C++ new/delete: std::map<int, std::string>, std::list, small objects";

/* One running copy: with --parallel, each thread runs its own. */
struct alignas(64) Ctx {
    double scale = 1;
    bench_rng rng{};
    uint64_t ops = 0; /* objects created (one with a string over 15 chars is two allocations) */

    size_t scaled(double n) const
    {
        double v = n * scale;
        return v < 1 ? 1 : static_cast<size_t>(v);
    }
    size_t below(size_t n) { return static_cast<size_t>(bench_rng_below(&rng, n)); }
};

/* A string of 4..40 letters: the short ones fit in std::string itself, the others are
 * malloc'ed, as a program's names and keys are. */
std::string short_string(Ctx &c)
{
    size_t len = 4 + c.below(37);
    std::string s(len, static_cast<char>('a' + c.below(26)));
    s[len / 2] = static_cast<char>('a' + c.below(26));
    return s;
}

/* A map of 20000 keys, each key then replaced twice over at random, looked up, cleared. */
void map_phase(Ctx &c, size_t &sum)
{
    const size_t keys = 20000;
    std::map<int, std::string> m;
    std::vector<int> live(keys);
    for (int &k : live) {
        k = static_cast<int>(bench_rng_next(&c.rng) >> 33);
        m[k] = short_string(c);
    }
    for (size_t i = 0; i < 2 * keys; i++) {
        int &k = live[c.below(keys)];
        m.erase(k);
        k = static_cast<int>(bench_rng_next(&c.rng) >> 33);
        m[k] = short_string(c);
    }
    for (int k : live) {
        auto it = m.find(k); /* a key drawn twice is erased once for both */
        sum += it == m.end() ? 0 : it->second.size();
    }
    c.ops += m.size() + 2 * keys;
}

struct Item {
    uint64_t id;
    std::string name;
};

/* A list of 20000 items, every third removed, 10000 more at the front, walked, cleared. */
void list_phase(Ctx &c, size_t &sum)
{
    std::list<Item> l;
    for (uint64_t i = 0; i < 20000; i++)
        l.push_back(Item{i, short_string(c)});
    l.remove_if([](const Item &it) { return it.id % 3 == 0; });
    for (uint64_t i = 0; i < 10000; i++)
        l.push_front(Item{i, short_string(c)});
    for (const Item &it : l)
        sum += it.name.size();
    c.ops += 30000;
}

/* Objects of three sizes behind a virtual destructor: delete goes through the vtable. */
struct Shape {
    virtual ~Shape() = default;
    virtual size_t area() const = 0;
};
struct Dot : Shape {
    uint32_t x = 1;
    size_t area() const override { return x; }
};
struct Rect : Shape {
    uint64_t w = 2, h = 3;
    size_t area() const override { return w * h; }
};
struct Poly : Shape {
    uint64_t pt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    size_t area() const override { return pt[0] + pt[7]; }
};

std::unique_ptr<Shape> new_shape(Ctx &c)
{
    switch (c.below(3)) {
    case 0: return std::make_unique<Dot>();
    case 1: return std::make_unique<Rect>();
    default: return std::make_unique<Poly>();
    }
}

/* 4096 live objects, replaced at random 100000 times. */
void shape_phase(Ctx &c, size_t &sum)
{
    std::vector<std::unique_ptr<Shape>> live(4096);
    for (auto &s : live)
        s = new_shape(c);
    for (size_t i = 0; i < 100000; i++) {
        auto &s = live[c.below(live.size())];
        sum += s->area();
        s = new_shape(c);
    }
    c.ops += live.size() + 100000;
}

void run(Ctx &c)
{
    size_t sum = 0;
    for (size_t r = 0, reps = c.scaled(12); r < reps; r++) {
        map_phase(c, sum);
        list_phase(c, sum);
        shape_phase(c, sum);
    }
    bench_escape(&sum);
}

[[noreturn]] void usage(const char *prog)
{
    std::fprintf(stderr,
                 "usage: %s %s [--parallel[=N]] [--scale K]\n"
                 "       %s --list\n"
                 "  --parallel[=N]  run N copies at once, one per thread (default N: online CPUs)\n"
                 "  --scale K       multiply the work by K (default 1, the quick size)\n",
                 prog, NAME, prog);
    std::exit(2);
}

struct Args {
    int copies = 1;
    double scale = 1;
};

Args parse(int argc, char **argv)
{
    Args a;
    bool named = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        char *end;
        if (std::strcmp(arg, "--list") == 0) {
            std::printf("%-14s %s\n", NAME, WHAT);
            std::exit(0);
        } else if (std::strcmp(arg, "--parallel") == 0) {
            a.copies = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
        } else if (std::strncmp(arg, "--parallel=", 11) == 0) {
            a.copies = static_cast<int>(std::strtol(arg + 11, &end, 10));
            if (*end || a.copies < 1 || a.copies > 256)
                usage(argv[0]);
        } else if (std::strcmp(arg, "--scale") == 0 && i + 1 < argc) {
            a.scale = std::strtod(argv[++i], &end);
            if (*end || !(a.scale > 0))
                usage(argv[0]);
        } else if (!named && std::strcmp(arg, NAME) == 0) {
            named = true;
        } else {
            usage(argv[0]);
        }
    }
    if (!named || a.copies < 1)
        usage(argv[0]);
    return a;
}

/* Runs the copies (the first in the main thread when alone) and returns the seconds taken
 * and the objects created. */
double run_copies(const Args &a, uint64_t &ops)
{
    std::vector<Ctx> ctx(a.copies);
    uint64_t name_seed = 0;
    for (const char *s = NAME; *s; s++)
        name_seed = name_seed * 131 + static_cast<unsigned char>(*s);
    for (int i = 0; i < a.copies; i++) {
        ctx[i].scale = a.scale;
        bench_rng_seed(&ctx[i].rng, name_seed + static_cast<uint64_t>(i));
    }
    uint64_t t0 = bench_now_ns();
    if (a.copies == 1) {
        run(ctx[0]); /* a single-threaded process stays so */
    } else {
        std::vector<std::thread> t;
        for (Ctx &c : ctx)
            t.emplace_back(run, std::ref(c));
        for (std::thread &th : t)
            th.join();
    }
    double seconds = static_cast<double>(bench_now_ns() - t0) * 1e-9;
    ops = 0;
    for (const Ctx &c : ctx)
        ops += c.ops;
    return seconds;
}

} // namespace

int main(int argc, char **argv)
{
    Args a = parse(argc, argv);
    long rss_start = bench_rss_kib();
    uint64_t ops;
    double seconds = run_copies(a, ops);
    long rss_end = bench_rss_kib();
    malloc_trim(0);
    long rss_trim = bench_rss_kib();
    std::printf("{\"workload\": \"%s\", \"threads\": %d, \"scale\": %g, \"time_s\": %.6f, \"ops\": %llu, "
                "\"peak_rss_kib\": %ld, \"rss_start_kib\": %ld, \"rss_end_kib\": %ld, \"rss_trim_kib\": %ld}\n",
                NAME, a.copies, a.scale, seconds, static_cast<unsigned long long>(ops), bench_peak_rss_kib(),
                rss_start, rss_end, rss_trim);
    return 0;
}
