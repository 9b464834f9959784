# Dumps, for every code object of this file and of a few standard-library
# modules, its line table and the line of each instruction as the running
# interpreter computes it (co_positions and co_lines): the Rust decoder must
# agree on every instruction.
import asyncio, json, sys, types


def plain(a, b):
    c = a + b
    return c * 2


def nested(x):
    def inner(y):
        def innermost(z):
            return [z] * y
        return innermost(x)
    return inner(x + 1)


def generator(n):
    for i in range(n):
        if i % 2:
            yield i
        else:
            yield -i


def comprehensions(xs):
    a = [x * 2 for x in xs if x]
    b = {x: x for x in xs}
    c = {x
         for x in xs}
    d = (x for x in xs)
    return a, b, c, list(d)


def exceptions(v):
    try:
        r = 1 / v
    except ZeroDivisionError as e:
        r = str(e)
    except (TypeError,
            ValueError):
        r = None
    else:
        r += 1
    finally:
        v = 0
    with open(__file__) as f:
        pass
    return r


async def coroutine(n):
    await asyncio.sleep(0)
    async with asyncio.Lock():
        return n




def walk(code, out):
    positions = [p[0] for p in code.co_positions()]
    lines = [None] * len(positions)
    for start, end, line in code.co_lines():
        for unit in range(start // 2, end // 2):
            if unit < len(lines):
                lines[unit] = line
    out.append({
        "name": code.co_qualname,
        "first": code.co_firstlineno,
        "table": code.co_linetable.hex(),
        "positions": positions,
        "lines": lines,
    })
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            walk(const, out)


sources = [open(__file__).read()]
long_src = "def long_function(x):\n    total = 0\n" + "".join(
    f"    total += x * {i}; x = (x + {i}) % 97\n" for i in range(400)
) + "    return (total,\n            x,\n\n\n            total + x)\n"
sources.append(long_src)
import json.decoder, asyncio.base_events, argparse
for module in (json.decoder, asyncio.base_events, argparse):
    sources.append(open(module.__file__).read())
out = []
for i, src in enumerate(sources):
    walk(compile(src, f"source{i}.py", "exec"), out)
json.dump(out, sys.stdout)
