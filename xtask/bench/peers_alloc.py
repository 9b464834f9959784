# `cargo xtask bench peers`: the python3 workload. Waits for a line on stdin
# (so that a profiler can attach first), then churns objects of all sizes:
# small ones (pymalloc's) and, every few steps, lists, dicts, strings and
# buffers past 512 bytes, which Python takes from malloc.
import json
import sys

sys.stdin.readline()
n = int(sys.argv[1])
live = {}
for i in range(n):
    key = i % 50000
    s = ("item-%d;" % i) * (1 + i % 97)
    d = {"id": i, "name": s, "tags": [str(j) for j in range(i % 23)]}
    if i % 7 == 0:
        d["blob"] = bytearray(256 + i % 20000)
    if i % 11 == 0:
        d["json"] = json.dumps(d["tags"] + [s])
    live[key] = d
total = sum(len(d["name"]) for d in live.values())
print(total)
