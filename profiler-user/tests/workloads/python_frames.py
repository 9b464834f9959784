"""Allocation sites at known Python functions and lines, for
tests/python_walk.rs: nested calls and recursion allocating large
bytearrays, a recursion deeper than a page of the thread's data stack
(its frames large with locals), and a thread that allocates through ctypes (a malloc made
without the GIL) while another thread spins in Python holding it.

Prints, for each function, the address of its code object (id() is the
address) and the instruction indexes (code units) of the line it allocates
or calls from; then runs a scenario per command read from stdin."""

import ctypes
import sys
import threading

SIZE = 256 * 1024
ROUNDS = 40
KEEP = []
LIBC = ctypes.CDLL(None)
LIBC.malloc.restype = ctypes.c_void_p
LIBC.malloc.argtypes = [ctypes.c_size_t]


def units_of_line(code, line):
    return [i for i, pos in enumerate(code.co_positions()) if pos[0] == line]


def line_of(marker):
    with open(__file__) as f:
        for n, text in enumerate(f, 1):
            if text.rstrip().endswith("# " + marker):
                return n
    raise SystemExit(f"no line marked {marker}")


def leaf():
    KEEP.append(bytearray(SIZE))  # leaf-alloc


def recurse(depth):
    if depth == 0:
        leaf()  # recurse-leaf
    else:
        recurse(depth - 1)  # recurse-self


def outer():
    for _ in range(ROUNDS):
        recurse(3)  # outer-call


DEEP = 70


def wide(depth):
    # Sixteen locals: about 230 bytes a frame, 16 KiB for the recursion,
    # over several pages of the data stack and past its first chunk.
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = depth  # noqa: F841
    b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = depth  # noqa: F841
    if depth == 0:
        leaf()  # wide-leaf
    else:
        wide(depth - 1)  # wide-self


def deep_outer():
    for _ in range(ROUNDS):
        wide(DEEP - 1)  # deep-call


def gil_free_alloc(stop):
    while not stop.is_set():
        KEEP.append(LIBC.malloc(SIZE))  # ctypes-malloc


def spin(stop):
    while not stop.is_set():
        x = [0] * 10  # noqa: F841


def threads():
    stop = threading.Event()
    spinner = threading.Thread(target=spin, args=(stop,))
    spinner.start()
    allocator = threading.Thread(target=gil_free_alloc, args=(stop,))
    allocator.start()
    for line in sys.stdin:
        if line.strip() == "stop":
            break
    stop.set()
    allocator.join()
    spinner.join()


def describe(name, func, *markers):
    code = func.__code__
    units = [u for m in markers for u in units_of_line(code, line_of(m))]
    print(name, id(code), " ".join(map(str, units)), flush=True)


MODULE = sys._getframe().f_code
describe("leaf", leaf, "leaf-alloc")
describe("recurse_leaf", recurse, "recurse-leaf")
describe("recurse_self", recurse, "recurse-self")
describe("outer", outer, "outer-call")
describe("wide_leaf", wide, "wide-leaf")
describe("wide_self", wide, "wide-self")
describe("deep_outer", deep_outer, "deep-call")
describe("gil_free_alloc", gil_free_alloc, "ctypes-malloc")
describe("spin", spin)
print("module", id(MODULE), flush=True)
print("ready", flush=True)
for command in sys.stdin:
    command = command.strip()
    if command == "nested":
        outer()  # module-call
        print("done", flush=True)
    elif command == "deep":
        deep_outer()  # module-call
        print("done", flush=True)
    elif command == "threads":
        print("started", flush=True)
        threads()
        print("done", flush=True)
    elif command == "exit":
        break
