# `cargo xtask bench python`: a small web service's request handling, without
# the network. Waits for a line on stdin (so that a profiler can attach first),
# then serves argv[1] requests: each parses a JSON body, renders an HTML page
# from it through a cache of rendered fragments (an LRU dict), logs a line and
# keeps a window of recent responses; every 100th request's response is kept
# for good (the leak the profiler should find).
import collections
import html
import json
import sys

CACHE_SIZE = 2000
WINDOW = 500

cache = collections.OrderedDict()
recent = collections.deque(maxlen=WINDOW)
leaked = []
log = []


def fragment(item):
    key = (item["kind"], item["id"] % 5000)
    page = cache.get(key)
    if page is None:
        page = "<li class=%s>%s: %s</li>" % (
            item["kind"],
            html.escape(item["name"]),
            ", ".join(str(t) for t in item["tags"]),
        )
        cache[key] = page
        if len(cache) > CACHE_SIZE:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return page


def handle(body):
    request = json.loads(body)
    items = [fragment(item) for item in request["items"]]
    response = "<html><body><h1>%s</h1><ul>%s</ul></body></html>" % (
        html.escape(request["user"]),
        "".join(items),
    )
    log.append("GET /%s %d" % (request["user"], len(response)))
    if len(log) > 1000:
        del log[:500]
    recent.append(response)
    if request["id"] % 100 == 0:
        leaked.append(response)
    return len(response)


def body(i):
    return json.dumps(
        {
            "id": i,
            "user": "user%d" % (i % 311),
            "items": [
                {
                    "id": i * 7 + j,
                    "kind": ("a", "b", "c")[j % 3],
                    "name": "item <%d>" % (i + j),
                    "tags": list(range(j % 9)),
                }
                for j in range(i % 40)
            ],
        }
    )


sys.stdin.readline()
n = int(sys.argv[1])
print(sum(handle(body(i)) for i in range(n)))
