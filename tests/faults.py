"""Failures on purpose, from outside the production code.

In-process tests patch a DoFn with ``fail_first``; tests of an object store put ``FaultProxy``
(an HTTP proxy on 127.0.0.1 that fails the requests a test picks) in front of moto's server; tests
that run a job in a subprocess (to kill it) start it through this file, which patches the process
and then runs the CLI:

    python tests/faults.py --publish-delay 0.05 -- bucketed --input ... --output ...
    python tests/faults.py --marker-delay 0.5 --marker-note notes.txt -- scaffold --input ... --output ...
    python tests/faults.py --spill-full-disk 2 -- bucketed --input ... --output ...
"""

from __future__ import annotations

import argparse
import collections
import functools
import http.client
import http.server
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path


def fail_first(monkeypatch, cls, method: str, times: int, counter: collections.Counter, name: str) -> None:
    """The first ``times`` calls of ``cls.method`` (a DoFn's generator method) in this process fail
    after producing their first output, as a worker that crashes mid-bundle would. ``counter[name]``
    counts the failures."""
    original = getattr(cls, method)

    @functools.wraps(original)
    def failing(self, *args, **kwargs):
        outputs = original(self, *args, **kwargs)
        if counter[name] >= times:
            yield from outputs or ()
            return
        for value in outputs or ():
            yield value
            break
        counter[name] += 1
        raise RuntimeError(f"injected failure #{counter[name]} in {name}")

    monkeypatch.setattr(cls, method, failing)


class FaultProxy(http.server.ThreadingHTTPServer):
    """An HTTP proxy on 127.0.0.1 in front of ``upstream`` (moto's server) that fails the requests
    ``when(method, path, headers)`` picks, as ``mode`` says, until the test switches it off:

        "500", "503"  the status, with S3's error body (InternalError, SlowDown), never forwarded
        "reset"       the connection reset (RST) before any answer, never forwarded
        "cut"         forwarded, and the answer's body cut in half: the connection closed midway

    ``proxy.faults("503", when=...)`` switches faults on (every request by default), ``proxy.off()``
    off; ``proxy.failed`` counts the requests failed. ``proxy.endpoint`` is the URL to give s3fs."""

    daemon_threads = True

    def __init__(self, upstream: str):
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.mode: str | None = None
        self.when: Callable[[str, str, dict], bool] = lambda method, path, headers: True
        self.failed = 0
        self._count = threading.Lock()
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def faults(self, mode: str, when: Callable[[str, str, dict], bool] | None = None) -> None:
        assert mode in ("500", "503", "reset", "cut"), mode
        self.when = when or (lambda method, path, headers: True)
        self.mode = mode

    def off(self) -> None:
        self.mode = None

    def picks(self, method: str, path: str, headers: dict) -> str | None:
        mode = self.mode
        if mode is None or not self.when(method, path, headers):
            return None
        with self._count:
            self.failed += 1
        return mode


_S3_ERRORS = {"500": ("InternalError", "We encountered an internal error. Please try again."),
              "503": ("SlowDown", "Please reduce your request rate.")}


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def _any(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body, length = self._chunked(), -1  # read whole, whatever is answered: the connection stays in step
        headers = {k: v for k, v in self.headers.items()}
        if length < 0:  # passed on whole, not chunked
            headers = {k: v for k, v in headers.items() if k.lower() != "transfer-encoding"}
            headers["Content-Length"] = str(len(body))
        mode = self.server.picks(self.command, self.path, headers)
        if mode == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
            return
        if mode in _S3_ERRORS:
            code, message = _S3_ERRORS[mode]
            data = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>{message}"
                    f"</Message><RequestId>fault-proxy</RequestId></Error>").encode()
            self.send_response(int(mode))
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":  # an answer to HEAD has no body, whatever its length says
                self.wfile.write(data)
            return
        upstream = http.client.HTTPConnection(*self.server.upstream, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body if body or length > 0 else None, headers=headers)
            answer = upstream.getresponse()
            data = answer.read()
        finally:
            upstream.close()
        self.send_response(answer.status, answer.reason)
        head = self.command == "HEAD"
        for key, value in answer.getheaders():
            if key.lower() not in ("transfer-encoding", "connection") and (head or key.lower() != "content-length"):
                self.send_header(key, value)
        if not head:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if mode == "cut" and self.command != "HEAD" and len(data) > 1:
            self.wfile.write(data[:len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if self.command != "HEAD":
            self.wfile.write(data)

    def _chunked(self) -> bytes:
        chunks = []
        while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()
        while self.rfile.readline().strip():  # trailers, up to the empty line
            pass
        return b"".join(chunks)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any


def slow_publish(seconds: float) -> None:
    """Each staged file moved into place waits ``seconds`` afterwards, so a test can kill the job
    in the middle of publishing."""
    from fsspec.implementations.local import LocalFileSystem

    move = LocalFileSystem.mv

    def mv(self, src, dst, *args, **kwargs):
        result = move(self, src, dst, *args, **kwargs)
        if "/staged/" in str(src):
            time.sleep(seconds)
        return result

    LocalFileSystem.mv = mv


def slow_markers(seconds: float, note: str | None) -> None:
    """Before each unit's completion marker is written (its spill files are closed by then), append
    a line to the file ``note`` and wait ``seconds``: a test can count finished units and kill the job
    between a unit's files and its marker. Patched in this process, so for the in-process runner."""
    from shards import storage

    write = storage.write_atomic

    def write_atomic(url, data, scratch=None):
        if "/units/" in str(url):
            if note:
                with open(note, "a", encoding="utf-8") as f:
                    f.write(f"{url}\n")
            time.sleep(seconds)
        return write(url, data, scratch)

    storage.write_atomic = write_atomic


def slow_spill(seconds: float) -> None:
    """Each batch a SpillTokensFn spills waits ``seconds`` afterwards, its spill file open."""
    from transforms.core import spill

    original = spill.SpillTokensFn.process

    def process(self, batch):
        yield from original(self, batch)
        time.sleep(seconds)

    spill.SpillTokensFn.process = process


def spill_full_disk(at_flush: int) -> None:
    """The ``at_flush``-th spill a SpillTokensFn writes (counted in this process) goes out, then
    fails as a full disk does: OSError(ENOSPC) naming its file, which is left as written."""
    import errno

    from transforms.core import spill

    original, flushes = spill.SpillTokensFn._flush, [0]

    def _flush(self):
        written = original(self)
        flushes[0] += 1
        if flushes[0] == at_flush and self._file is not None:
            self._file.flush()
            raise OSError(errno.ENOSPC, "No space left on device", self._path)
        return written

    spill.SpillTokensFn._flush = _flush


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--publish-delay", type=float, default=0.0)
    parser.add_argument("--marker-delay", type=float, default=0.0)
    parser.add_argument("--marker-note", default=None)
    parser.add_argument("--spill-delay", type=float, default=0.0)
    parser.add_argument("--spill-full-disk", type=int, default=0)
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if args.publish_delay:
        slow_publish(args.publish_delay)
    if args.marker_delay or args.marker_note:
        slow_markers(args.marker_delay, args.marker_note)
    if args.spill_delay:
        slow_spill(args.spill_delay)
    if args.spill_full_disk:
        spill_full_disk(args.spill_full_disk)
    from pipelines import cli

    return cli.main(argv[split + 1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
