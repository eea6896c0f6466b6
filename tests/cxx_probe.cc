// C++'s operators new and delete: a program's calls reach fastmalloc's own definitions (the
// shared library linked or preloaded), or, linked with the static library (argument
// "archive"), libstdc++'s, whose blocks are fastmalloc's; either way the standard's rules
// hold: a new that cannot be met calls the new-handler while one is set and then throws
// std::bad_alloc; the nothrow forms return nullptr; aligned forms align; new of 0 bytes
// gives distinct blocks. Exits 1 with a line on stderr at each failure.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <new>

static int failures;

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "cxx_probe:%d: failed: %s\n", __LINE__, #cond); \
      failures++;                                                            \
    }                                                                        \
  } while (0)

// The object that defines `symbol` in the process's global scope.
static const char *definer(const char *symbol) {
  void *address = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info;
  if (!address || !dladdr(address, &info) || !info.dli_fname) return "(none)";
  return info.dli_fname;
}

static int handler_calls;
static int handler_budget;
static void counting_handler() {
  if (++handler_calls >= handler_budget) std::set_new_handler(nullptr);
}

extern "C" int fm_owns(const void *) __attribute__((weak));

// An impossible size the compiler cannot see through.
static volatile std::size_t impossible = SIZE_MAX / 2;

static const char *const operators[] = {
    "_Znwm", "_Znam", "_ZnwmSt11align_val_t", "_ZnamSt11align_val_t", "_ZdlPv", "_ZdaPv",
    "_ZdlPvm", "_ZdaPvm", "_ZdlPvSt11align_val_t", "_ZdlPvmSt11align_val_t"};

int main(int argc, char **argv) {
  bool archive = argc > 1 && std::strcmp(argv[1], "archive") == 0;
  if (archive) {
    void *block = ::operator new(24);
    CHECK(fm_owns && fm_owns(block));   // libstdc++'s operator new, fastmalloc's malloc
    ::operator delete(block);
  } else {
    for (const char *symbol : operators) {
      const char *object = definer(symbol);
      if (!std::strstr(object, "libfastmalloc")) {
        std::fprintf(stderr, "cxx_probe: %s is defined by %s, not by fastmalloc\n", symbol, object);
        failures++;
      }
    }
  }

  // Blocks that work, of every kind of new, and their deletes.
  char *volatile one = new char[100];
  std::memset(one, 1, 100);
  delete[] one;
  int *volatile scalar = new int(7);
  CHECK(*scalar == 7);
  ::operator delete(scalar, sizeof(int));
  void *volatile zero_a = ::operator new(0);
  void *volatile zero_b = ::operator new(0);
  CHECK(zero_a && zero_b && zero_a != zero_b);
  ::operator delete(zero_a);
  ::operator delete(zero_b);
  struct alignas(256) Wide {
    char c[40];
  };
  Wide *volatile wide = new Wide;
  CHECK(reinterpret_cast<std::uintptr_t>(wide) % 256 == 0);
  delete wide;
  void *volatile page = ::operator new(100, std::align_val_t(4096));
  CHECK(reinterpret_cast<std::uintptr_t>(page) % 4096 == 0);
  ::operator delete(page, std::align_val_t(4096));

  // Out of memory: the handler runs until it unsets itself, then std::bad_alloc.
  for (int budget : {1, 3}) {
    handler_calls = 0;
    handler_budget = budget;
    std::set_new_handler(counting_handler);
    bool thrown = false;
    try {
      void *volatile p = ::operator new(impossible);
      ::operator delete(p);
    } catch (const std::bad_alloc &) {
      thrown = true;
    }
    CHECK(thrown);
    CHECK(handler_calls == budget);
  }
  bool thrown = false;
  try {
    void *volatile p = ::operator new[](impossible, std::align_val_t(64));
    ::operator delete[](p, std::align_val_t(64));
  } catch (const std::bad_alloc &) {
    thrown = true;
  }
  CHECK(thrown);
  CHECK(::operator new(impossible, std::nothrow) == nullptr);
  CHECK(::operator new[](impossible, std::nothrow) == nullptr);

  if (failures) return 1;
  std::puts(archive ? "cxx_probe: libstdc++'s operators, on fastmalloc's malloc, keep the rules"
                    : "cxx_probe: operators new and delete are fastmalloc's, and keep the rules");
  return 0;
}
