/* C++ allocations through the standard library in code built -O2
 * -fomit-frame-pointer: std::string buffers (libstdc++'s own
 * basic_string::_M_create calls operator new) pushed into a growing
 * std::vector, and `new Foo` in a namespace. Waits for a line, allocates
 * (blocks stay live), prints "ready", and exits on the next line. */
#include <cstdio>
#include <string>
#include <vector>

#define ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static std::vector<std::string> *kept;

/* 2000 strings of 4095 chars (4096-byte buffers), and the vector's own
 * buffer, grown by doubling to 2048 slots of 32 bytes (64 KiB live). */
__attribute__((noinline)) void grow_vector() {
    kept = new std::vector<std::string>;
    for (int i = 0; i < 2000; i++) {
        kept->push_back(std::string(4095, char('a' + i % 26)));
        ESCAPE(kept->back().data());
    }
    ESCAPE(kept);
}

namespace ns {
struct Foo {
    char data[8192];
};

__attribute__((noinline)) Foo *make_foo() {
    Foo *f = new Foo;
    ESCAPE(f);
    return f;
}

__attribute__((noinline)) void f() {
    for (int i = 0; i < 1000; i++) ESCAPE(make_foo());
}
}  // namespace ns

int main() {
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;
    grow_vector();
    ESCAPE(kept);
    ns::f();
    std::printf("ready\n");
    std::fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 2;
    return 0;
}
