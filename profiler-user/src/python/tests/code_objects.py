# Prints the code objects of known functions (address, qualname, file, first
# line, the line of each instruction); told to, frees a function made by
# exec and allocates nothing ("quiet"); then, told to, frees two more and
# allocates over their code objects (bytes objects and another function's
# code), saying which took each address.
import gc, json, sys


def plain(a):
    return a + 1


class Handler:
    def handle_request(self, x):
        def nested(y):
            return [y] * x
        return nested


def grüße(n):
    for i in range(n):
        yield "ü" * i


def long_body(x):
    total = 0

    for i in range(3):
        total += x
        try:
            total //= i
        except ZeroDivisionError:
            total = -total
    return total


def describe(f):
    code = f.__code__
    return {
        "address": id(code),
        "qualname": code.co_qualname,
        "filename": code.co_filename,
        "first": code.co_firstlineno,
        "lines": [p[0] for p in code.co_positions()],
    }


def made(name):
    ns = {}
    source = f"def {name}(a, b):\n    c = [a, b] * 3\n    return c\n"
    exec(compile(source, f"/generated/{name}.py", "exec"), ns)
    return ns[name]


doomed_quiet = made("doomed_quiet")
doomed_bytes = made("doomed_bytes")
doomed_code = made("doomed_code")
functions = [plain, Handler.handle_request, Handler().handle_request(3), grüße, long_body,
             doomed_quiet, doomed_bytes, doomed_code]
print(json.dumps({
    "version": list(sys.version_info[:3]),
    "functions": [describe(f) for f in functions],
}), flush=True)

assert sys.stdin.readline().strip() == "quiet"
functions = None
# The function and its globals hold each other: the collector frees them.
del doomed_quiet
gc.collect()
print(json.dumps({"quiet": True}), flush=True)

assert sys.stdin.readline().strip() == "free"
targets = {id(doomed_bytes.__code__): "bytes", id(doomed_code.__code__): "code"}
size = sys.getsizeof(doomed_bytes.__code__)
del doomed_bytes, doomed_code, describe
gc.collect()
keep = []
found = {}
for _ in range(20000):
    if len(found) == 2:
        break
    # A bytes object of the freed object's size (the same size class), and
    # another function's code; each may land at either address.
    b = bytes(size - 33)
    f = made("usurper")
    keep += [b, f]
    for obj, kind in ((b, "bytes"), (f.__code__, "code")):
        if id(obj) in targets:
            found[id(obj)] = kind
print(json.dumps({"reused": {str(a): k for a, k in found.items()}}), flush=True)
sys.stdin.read()
