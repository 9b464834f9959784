"""Allocation sites at known Python functions and lines (issue 30's tests).

Each site holds COUNT blocks of SIZE bytes until stdin closes. A site is the
line that carries its `# site: NAME` comment: the test reads the lines from
this file, so nothing here is repeated there. Run with PYTHONMALLOC=malloc
under liballocprof.so: every block is a malloc the sampler sees.

Waits for a line on stdin (the profiler attaches meanwhile), prints `ready`
when every site holds its blocks; then each line `more` makes the `late`
site allocate again (and prints `ready`), until stdin closes.
"""

import asyncio
import ctypes
import json
import re
import sys
import threading

SIZE = 64 * 1024
COUNT = 64

held = []


def inner():
    return bytearray(SIZE)  # site: nested


def middle():
    return inner()


def outer():
    for _ in range(COUNT):
        held.append(middle())


def recurse(depth):
    if depth == 0:
        return bytearray(SIZE)  # site: recursion
    return recurse(depth - 1)


def blocks():
    for _ in range(COUNT):
        yield bytearray(SIZE)  # site: generator


async def fill():
    await asyncio.sleep(0)
    return bytearray(SIZE)  # site: coroutine


async def coroutines():
    return await asyncio.gather(*(fill() for _ in range(COUNT)))


def hook(obj):
    held.append(bytearray(SIZE))  # site: json_hook
    return obj


def replace(match):
    held.append(bytearray(SIZE))  # site: re_callback
    return match.group(0)


class Cleanup:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        held.append(bytearray(SIZE))  # site: unwinding
        return True


def raising():
    with Cleanup():
        raise ValueError("unwind")


LIBC = ctypes.CDLL(None)
LIBC.malloc.restype = ctypes.c_void_p
LIBC.malloc.argtypes = [ctypes.c_size_t]


def without_gil():
    # A ctypes call releases the GIL around the foreign function.
    return LIBC.malloc(SIZE)  # site: without_gil


def thread_a(barrier):
    barrier.wait()
    for _ in range(COUNT):
        held.append(bytearray(SIZE))  # site: thread_a


def thread_b(barrier):
    barrier.wait()
    for _ in range(COUNT):
        held.append(bytearray(SIZE))  # site: thread_b


def late():
    for _ in range(COUNT):
        held.append(bytearray(SIZE))  # site: late


def main():
    sys.stdin.readline()
    outer()
    for _ in range(COUNT):
        held.append(recurse(12))
    held.extend(blocks())
    held.extend(asyncio.run(coroutines()))
    json.loads(json.dumps([{"k": i} for i in range(COUNT)]), object_hook=hook)
    re.sub("x", replace, "x" * COUNT)
    for _ in range(COUNT):
        raising()
    pointers = [without_gil() for _ in range(COUNT)]
    barrier = threading.Barrier(2)
    threads = [threading.Thread(target=f, args=(barrier,)) for f in (thread_a, thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "more":
            late()
            print("ready", flush=True)
    return pointers


if __name__ == "__main__":
    main()
