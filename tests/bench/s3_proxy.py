"""A counting proxy in front of moto's S3 server: every request the job makes, counted by method and
by what it touches, with an optional fixed latency added to each (the round trip of a real store).

    proxy = CountingProxy("http://127.0.0.1:5000", latency=0.02)   # forwards to moto
    proxy.start()                                                    # proxy.url: the endpoint to give s3fs
    ...
    proxy.counts()        # Counter of (kind, method) -> requests; proxy.reset() starts again
    proxy.peaks()         # Counter of method -> the most requests in flight at once
    proxy.stop()

Kinds are read from the object key (``kind_of``): spill tokens and references, unit markers, staged
shards, the input, the tree's own files, listings. Methods: GET, PUT, POST (multipart parts and
their completion count as POST/PUT as S3 has them), HEAD, DELETE, LIST (a GET of a bucket with
``list-type``/``prefix``), COPY (a PUT with x-amz-copy-source). Only 127.0.0.1. Not a test.
"""

from __future__ import annotations

import collections
import http.client
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


def kind_of(path: str) -> str:
    """What a request's path touches, by its key (``/bucket/key?query``)."""
    key = urllib.parse.urlsplit(path).path.lstrip("/")
    if "/" not in key:
        return "bucket"
    key = key.split("/", 1)[1]
    if "/.pretokenize-tmp/" in f"/{key}":
        if "/spill/" in key:
            return "spill tokens" if key.endswith(".bin") else "spill refs" if key.endswith(".refs") else "spill other"
        if "/units/" in key:
            return "unit markers"
        if "/staged/" in key:
            return "staged"
        return "temporary other"
    if "/in/" in f"/{key}":
        return "input"
    return "tree"


def method_of(command: str, path: str, headers) -> str:
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query, keep_blank_values=True)
    if command == "GET" and ("list-type" in query or "prefix" in query or "delimiter" in query):
        return "LIST"
    if command == "PUT" and headers.get("x-amz-copy-source"):
        return "COPY"
    return command


class CountingProxy:
    def __init__(self, upstream: str, latency: float = 0.0):
        self.upstream = urllib.parse.urlsplit(upstream)
        self.latency = latency
        self._counts: collections.Counter = collections.Counter()
        self._in_flight: collections.Counter = collections.Counter()
        self._peak: collections.Counter = collections.Counter()  # the most requests of a method at once
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def counts(self) -> collections.Counter:
        with self._lock:
            return collections.Counter(self._counts)

    def peaks(self) -> collections.Counter:
        with self._lock:
            return collections.Counter(self._peak)

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._peak.clear()

    def start(self) -> None:
        proxy = self
        local = threading.local()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    parts = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(parts)
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _forward(self):
                body = self._body()
                method = method_of(self.command, self.path, self.headers)
                with proxy._lock:
                    proxy._counts[(kind_of(self.path), method)] += 1
                    proxy._in_flight[method] += 1
                    proxy._peak[method] = max(proxy._peak[method], proxy._in_flight[method])
                try:
                    self._relay(body)
                finally:
                    with proxy._lock:
                        proxy._in_flight[method] -= 1

            def _relay(self, body: bytes):
                if proxy.latency:
                    time.sleep(proxy.latency)
                conn = getattr(local, "conn", None)
                if conn is None:
                    conn = local.conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port,
                                                                   timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                headers["Content-Length"] = str(len(body))
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                except (http.client.HTTPException, OSError):
                    conn.close()
                    conn = local.conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port,
                                                                   timeout=120)
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status, resp.reason)
                length_sent = False
                for k, v in resp.getheaders():
                    if k.lower() in HOP_HEADERS:
                        continue
                    if k.lower() == "content-length":
                        length_sent = True
                        if self.command != "HEAD":
                            v = str(len(data))
                    self.send_header(k, v)
                if not length_sent:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
