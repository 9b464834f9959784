# `cargo xtask bench pipeline`'s Python row: N bytearrays allocated at the
# bottom of DEPTH nested Python calls (`recursive`: one function calling
# itself, the default; `distinct`: a function of its own per level), run by
# CPython under liballocprof.so with PYTHONMALLOC=malloc (every object a
# malloc) and a low ALLOCPROF_RATE.
# Waits for a line on stdin before starting (so allocprof can attach), prints
# `key value` lines then `end`, and waits for another line before exiting
# (so the harness reads the kernel's statistics while allocprof is attached).
import os
import sys
import time
from itertools import repeat


def cost(n):
    # `repeat`, not `range`: no int objects, so each step's mallocs are the
    # bytearray's own (its object and its buffer).
    keep = []
    add = keep.append
    # The process's CPU time (user and system: the uprobe and the eBPF
    # program run in its context), which other work on the shared cores
    # inflates less than wall time; wall time too.
    c0, t0 = time.process_time_ns(), time.perf_counter_ns()
    for _ in repeat(None, n):
        add(bytearray(64))
    c1, t1 = time.process_time_ns(), time.perf_counter_ns()
    print("step_cpu_ns %.1f" % ((c1 - c0) / n))
    print("step_ns %.1f" % ((t1 - t0) / n))
    print("steps %d" % n)
    # Live until exit, so allocprof's report names their site.
    return keep


def deep(depth, n):
    # A Python frame per level: 3.11+ runs Python-to-Python calls in the same
    # C eval call, so the native stack stays shallow whatever the depth.
    if depth == 0:
        return cost(n)
    return deep(depth - 1, n)


def distinct(depth):
    # `depth` functions of their own, each calling the next: every frame
    # runs another code object (the `deep` chain runs one).
    space = {"cost": cost}
    callee = "cost"
    for level in range(depth):
        name = "level_%d" % level
        exec("def %s(n):\n    return %s(n)\n" % (name, callee), space)
        callee = name
    return space[callee]


n, depth = int(sys.argv[1]), int(sys.argv[2])
shape = sys.argv[3] if len(sys.argv) > 3 else "recursive"
if shape == "distinct":
    # As many frames as `deep`'s chain: the lambda stands for its extra level.
    top = distinct(depth)
    run = lambda: top(n)  # noqa: E731
else:
    run = lambda: deep(depth, n)  # noqa: E731
sys.stdin.readline()
live = run()
print("end", flush=True)
sys.stdin.readline()
# Without the interpreter's finalization, which would free them: the
# report shows them live when the process went.
os._exit(0)
