"""Code objects freed between their samples and their resolution, for
tests/python_robust.rs. Functions are made at run time (compile and exec:
a qualified name of its own each), all alive at once (each code object at
its own address), each allocates, and then all are dropped with their
code objects (a weak reference checks each is freed). No code object is
made after that until `decoys`: what reuses their memory meanwhile is
other objects. Decoys are code objects of other names, kept, made likely
at the addresses the freed ones had.

Commands, one per line on stdin:
  make N     N functions fn_0000.. (file freed_code.py), each allocating
             COUNT blocks of SIZE (kept) on line 3, then all freed ->
             "made", then per function its name and its code object's
             address, then "end"
  keep N     the same, the functions kept alive until `free`
  free       frees the functions kept -> "freed"
  decoys M   M decoy code objects (decoy_0000.., file decoys.py), kept ->
             "decoys K": K of them sit where a freed code object was
  exit       exits"""

import gc
import sys
import weakref

SIZE = 64 * 1024
COUNT = 16
KEEP = []
DECOYS = []
FREED = {}
# (globals, weak references to the code objects) of functions kept alive.
KEPT = []
SOURCE = """def {name}(keep):
    for _ in range({count}):
        keep.append(bytearray({size}))
"""


def make(first, n, keep):
    names = [f"fn_{i:04d}" for i in range(first, first + n)]
    space = {}
    for name in names:
        source = SOURCE.format(name=name, size=SIZE, count=COUNT)
        exec(compile(source, "freed_code.py", "exec"), space)
    codes = {name: weakref.ref(space[name].__code__) for name in names}
    for name in names:
        space[name](KEEP)  # site: call
        FREED[name] = id(space[name].__code__)
    KEPT.append((space, codes))
    del space
    if not keep:
        free()
    return names


def free():
    # A comprehension's names go with it: no loop variable holds a globals.
    codes = {name: code for _, kept in KEPT for name, code in kept.items()}
    KEPT.clear()
    # The functions and their globals hold each other: the collector frees them.
    gc.collect()
    alive = [name for name, code in codes.items() if code() is not None]
    if alive:
        raise SystemExit(f"code objects outlived their functions: {alive}")


def main():
    for line in sys.stdin:
        words = line.split()
        if words[0] == "exit":
            return
        if words[0] in ("make", "keep"):
            names = make(len(FREED), int(words[1]), words[0] == "keep")
            print("made", flush=True)
            for name in names:
                print(name, FREED[name], flush=True)
            print("end", flush=True)
        elif words[0] == "free":
            free()
            print("freed", flush=True)
        elif words[0] == "decoys":
            for i in range(len(DECOYS), len(DECOYS) + int(words[1])):
                name = f"decoy_{i:04d}"
                space = {}
                source = SOURCE.format(name=name, size=SIZE, count=COUNT)
                exec(compile(source, "decoys.py", "exec"), space)
                DECOYS.append(space[name])
            reused = set(FREED.values()) & {id(f.__code__) for f in DECOYS}
            print("decoys", len(reused), flush=True)


main()
