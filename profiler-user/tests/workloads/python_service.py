"""A small web service under load (issue 30's done-when): an http.server
whose handlers cache and leak, at known functions and lines.

- `GET /cache?key=K` renders an entry for K (a string built per request,
  then its bytes) and keeps it in CACHE, a dict that grows with each
  distinct key: the held bytes are `render_entry`'s (`# site: cache`).
- `POST /upload` reads the request body and keeps one body in KEEP_EVERY in
  LEAKED, a list nothing empties: the held bytes are the bodies read at
  `# site: leak`, in `Handler.do_POST`.
- `GET /truth` answers what the service holds, as the interpreter counts
  it: for each site, the number of objects and their bytes
  (`sys.getsizeof`, the size of each object's malloc under
  PYTHONMALLOC=malloc).

The test reads the site lines from the `# site: NAME` comments. Listens on
a free port of 127.0.0.1 and prints `port N` when it accepts connections.
Run with PYTHONMALLOC=malloc under liballocprof.so: every object is a
malloc the sampler sees.
"""

import http.server
import json
import sys
import threading
import urllib.parse

ENTRY = 32 * 1024
KEEP_EVERY = 2

CACHE = {}
LEAKED = []
LOCK = threading.Lock()
uploads = 0


def render_entry(key):
    text = (key + ";") * (ENTRY // len(key) + 1)
    return text.encode()[:ENTRY]  # site: cache


def cached(key):
    with LOCK:
        value = CACHE.get(key)
    if value is None:
        value = render_entry(key)
        with LOCK:
            value = CACHE.setdefault(key, value)
    return value


def remember(body):
    global uploads
    with LOCK:
        uploads += 1
        if uploads % KEEP_EVERY == 0:
            LEAKED.append(body)


def truth():
    with LOCK:
        cache = list(CACHE.values())
        leaked = list(LEAKED)
    return {
        "cache": {"objects": len(cache), "bytes": sum(map(sys.getsizeof, cache))},
        "leak": {"objects": len(leaked), "bytes": sum(map(sys.getsizeof, leaked))},
    }


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/cache":
            key = urllib.parse.parse_qs(url.query).get("key", ["-"])[0]
            self.reply(cached(key))
        elif url.path == "/truth":
            self.reply(json.dumps(truth()).encode())
        else:
            self.send_error(404)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)  # site: leak
        remember(body)
        self.reply(b"%d\n" % len(body))

    def reply(self, payload):
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print("port", server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
