"""A stand-in for Google Cloud Storage's JSON API on 127.0.0.1, enough for gcsfs to write, read
and list objects: what a Dataflow worker's gs:// access goes through, without a cloud account.

gcsfs sends its requests to ``STORAGE_EMULATOR_HOST`` when that is set; ``FSSPEC_GS_TOKEN=anon``
keeps it from looking for credentials, and ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` from first
asking the Storage Control gRPC API whether a bucket is zonal (gcsfs 2026's default), which the
stand-in does not serve. Served: uploads (``uploadType=multipart`` in one request,
``uploadType=resumable`` in chunks), an object's metadata, its bytes (whole or a ``Range``), the
listing of a bucket under a prefix (with ``delimiter``), and deleting an object. Buckets exist
when first written to. Anything else is answered 501, so a request the stand-in does not know
fails the test instead of passing it by accident.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

_OBJECT = re.compile(r"^/(?:download/)?storage/v1/b/([^/]+)/o/(.+)$")
_BUCKET_OBJECTS = re.compile(r"^/(?:upload/)?storage/v1/b/([^/]+)/o$")
_RESUMABLE = re.compile(r"^/resumable/([0-9a-f]+)$")


class FakeGcs:
    """The objects, {(bucket, name): bytes}, and the uploads in progress, behind one lock."""

    def __init__(self):
        self.objects: dict[tuple[str, str], bytes] = {}
        self.generations: dict[tuple[str, str], int] = {}
        self.uploads: dict[str, tuple[str, str, bytearray]] = {}
        self.lock = threading.Lock()

    def put(self, bucket: str, name: str, data: bytes) -> dict:
        with self.lock:
            self.objects[(bucket, name)] = bytes(data)
            self.generations[(bucket, name)] = self.generations.get((bucket, name), 0) + 1
            return self.resource(bucket, name)

    def resource(self, bucket: str, name: str) -> dict:
        data = self.objects[(bucket, name)]
        generation = str(self.generations[(bucket, name)])
        md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
        return {"kind": "storage#object", "bucket": bucket, "name": name, "size": str(len(data)),
                "generation": generation, "metageneration": "1", "md5Hash": md5,
                "contentType": "application/octet-stream", "updated": "2026-01-01T00:00:00.000Z",
                "timeCreated": "2026-01-01T00:00:00.000Z", "storageClass": "STANDARD"}


class _Handler(BaseHTTPRequestHandler):
    store: FakeGcs

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def _reply(self, status: int, body: bytes = b"", headers: dict | None = None, json_body=None):
        if json_body is not None:
            body = json.dumps(json_body).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _route(self):
        url = urlsplit(self.path)
        return url.path, {k: v[-1] for k, v in parse_qs(url.query).items()}

    def do_GET(self):  # noqa: N802 - http.server's name
        path, query = self._route()
        found = _OBJECT.match(path)
        if found:
            self._get_object(unquote(found[1]), unquote(found[2]), media=path.startswith("/download/")
                             or query.get("alt") == "media")
            return
        found = _BUCKET_OBJECTS.match(path)
        if found:
            self._list(unquote(found[1]), query.get("prefix", ""), query.get("delimiter"))
            return
        self._reply(501, b"not served by the stand-in: GET " + self.path.encode())

    def _get_object(self, bucket: str, name: str, media: bool):
        with self.store.lock:
            if (bucket, name) not in self.store.objects:
                self._reply(404, json_body={"error": {"code": 404, "message": f"No such object: {bucket}/{name}"}})
                return
            data, resource = self.store.objects[(bucket, name)], self.store.resource(bucket, name)
        if not media:
            self._reply(200, json_body=resource)
            return
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if not wanted:
            self._reply(200, data)
            return
        start, end = int(wanted[1]), int(wanted[2]) if wanted[2] else len(data) - 1
        part = data[start:end + 1]
        self._reply(206, part, {"Content-Range": f"bytes {start}-{start + len(part) - 1}/{len(data)}"})

    def _list(self, bucket: str, prefix: str, delimiter: str | None):
        items, prefixes = [], set()
        with self.store.lock:
            for (b, name) in sorted(self.store.objects):
                if b != bucket or not name.startswith(prefix):
                    continue
                rest = name[len(prefix):]
                if delimiter and delimiter in rest:
                    prefixes.add(prefix + rest.split(delimiter, 1)[0] + delimiter)
                else:
                    items.append(self.store.resource(b, name))
        self._reply(200, json_body={"kind": "storage#objects", "items": items, "prefixes": sorted(prefixes)})

    def do_POST(self):  # noqa: N802
        path, query = self._route()
        found = _RESUMABLE.match(path)
        if found:
            self._chunk(found[1])
            return
        found = _BUCKET_OBJECTS.match(path)
        if not (found and path.startswith("/upload/")):
            self._reply(501, b"not served by the stand-in: POST " + self.path.encode())
            return
        bucket, body = unquote(found[1]), self._body()
        if query.get("uploadType") == "multipart":
            metadata, data = _multipart(self.headers.get("Content-Type", ""), body)
            self._reply(200, json_body=self.store.put(bucket, metadata["name"], data))
        elif query.get("uploadType") == "resumable":
            name = query.get("name") or json.loads(body or b"{}")["name"]
            upload = uuid.uuid4().hex
            with self.store.lock:
                self.store.uploads[upload] = (bucket, name, bytearray())
            host, port = self.server.server_address[:2]
            self._reply(200, headers={"Location": f"http://{host}:{port}/resumable/{upload}"})
        else:
            self._reply(501, b"not served by the stand-in: uploadType " + str(query.get("uploadType")).encode())

    do_PUT = do_POST  # noqa: N815 - a resumable upload's chunks may come by PUT

    def _chunk(self, upload: str):
        body = self._body()
        with self.store.lock:
            bucket, name, data = self.store.uploads[upload]
            data.extend(body)
        total = re.search(r"/(\d+|\*)$", self.headers.get("Content-Range", "bytes */*"))
        if total and total[1] != "*" and int(total[1]) == len(data):
            with self.store.lock:
                del self.store.uploads[upload]
            self._reply(200, json_body=self.store.put(bucket, name, bytes(data)))
        else:
            self._reply(308, headers={"Range": f"bytes=0-{len(data) - 1}"})

    def do_DELETE(self):  # noqa: N802
        path, _ = self._route()
        found = _OBJECT.match(path)
        if not found:
            self._reply(501, b"not served by the stand-in: DELETE " + self.path.encode())
            return
        key = (unquote(found[1]), unquote(found[2]))
        with self.store.lock:
            existed = self.store.objects.pop(key, None) is not None
        if existed:
            self._reply(204)
        else:
            self._reply(404, json_body={"error": {"code": 404, "message": "not found"}})


def _multipart(content_type: str, body: bytes) -> tuple[dict, bytes]:
    """The JSON metadata and the bytes of a ``multipart/related`` upload (its lines end in CRLF, or
    in LF as gcsfs writes them)."""
    boundary = b"--" + re.search(r'boundary="?([^";]+)"?', content_type)[1].encode()
    metadata_part, data_part = body.split(boundary)[1:3]
    return json.loads(_part_body(metadata_part)), _part_body(data_part)


def _part_body(part: bytes) -> bytes:
    """What follows a part's headers, without the line end before the next boundary."""
    newline = b"\r\n" if part.startswith(b"\r\n") else b"\n"
    body = part.split(newline * 2, 1)[1]
    return body[: -len(newline)] if body.endswith(newline) else body


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """A client that hangs up mid-reply (gcsfs closing its session) is not an error of the stand-in."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def serve() -> Iterator[tuple[str, FakeGcs]]:
    """The stand-in, listening on 127.0.0.1: (its address for STORAGE_EMULATOR_HOST, its store)."""
    store = FakeGcs()
    handler = type("Handler", (_Handler,), {"store": store})
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", store
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
