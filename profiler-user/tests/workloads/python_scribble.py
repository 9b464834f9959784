"""A CPython 3.11 program that scribbles over its own frame chain, for
tests/python_robust.rs: through ctypes it overwrites the `previous` of
its current `_PyInterpreterFrame` (or of its caller's), allocates while
the chain is wrong, and restores it before returning (the interpreter
itself follows `previous` only when the frame returns).

3.11's layouts (Include/internal/pycore_frame.h, cpython/frameobject.h):
a frame object's `f_frame` (the interpreter frame) is at 24, an
interpreter frame's `previous` at 48 (profiler-user/src/python/offsets.rs
says the same to the kernel).

Commands, one per line on stdin; each answers "ready":
  self     the frame's previous is the frame itself (a cycle of one)
  pair     its caller's previous is the frame (a cycle of two)
  wild     the frame's previous is an unmapped address
  odd      the frame's previous is no pointer (unaligned)
  restored allocates at another site with the chain intact
  exit     exits"""

import ctypes
import sys

if sys.version_info[:2] != (3, 11):
    raise SystemExit(f"written for CPython 3.11's frame layout, not {sys.version}")

SIZE = 64 * 1024
COUNT = 64
KEEP = []
F_FRAME = 24
PREVIOUS = 48
WILD = 0xDEAD_BEEF_000
ODD = 0x7F00_0000_1003


def previous_slot(iframe):
    return ctypes.c_uint64.from_address(iframe + PREVIOUS)


def scribbled(mode):
    me = ctypes.c_uint64.from_address(id(sys._getframe()) + F_FRAME).value
    slot = previous_slot(me)
    caller = slot.value
    caller_slot = previous_slot(caller)
    saved, caller_saved = slot.value, caller_slot.value
    if mode == "self":
        slot.value = me
    elif mode == "pair":
        caller_slot.value = me
    elif mode == "wild":
        slot.value = WILD
    else:
        slot.value = ODD
    for _ in range(COUNT):
        KEEP.append(bytearray(SIZE))  # site: scribbled
    caller_slot.value = caller_saved
    slot.value = saved


def restored():
    for _ in range(COUNT):
        KEEP.append(bytearray(SIZE))  # site: restored


def main():
    for line in sys.stdin:
        command = line.strip()
        if command == "exit":
            return
        if command == "restored":
            restored()
        else:
            scribbled(command)
        print("ready", flush=True)


main()
