"""A Hugging Face hub on this machine, for hf:// tests without a network: one dataset repo whose
files a test sets, served over the part of the hub's HTTP API that huggingface_hub's HfFileSystem
uses to list, describe and read files (repo info, tree listings, paths-info, resolve with ranges).

    with FakeHub("org/mini") as hub:
        hub.files["data/a.jsonl"] = b'{"id": "a", "text": "hello"}\\n'
        hub.endpoint   # http://127.0.0.1:PORT, for HF_ENDPOINT or HfFileSystem(endpoint=...)

A file's ``oid`` is its git blob id (sha1 of ``blob N\\0`` + content), as the hub computes it, so
a file rewritten with other bytes of the same size has another version.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
from urllib.parse import parse_qs, unquote, urlparse


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    def __init__(self, repo: str):
        self.repo = repo
        self.files: dict[str, bytes] = {}
        self.commit = "c" * 40
        # Listings keep working but every download is refused (403): a token that lost its access
        # between a job's launch and its workers' reads.
        self.refuse_downloads = False
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def file_entry(self, path: str) -> dict:
        data = self.files[path]
        return {"type": "file", "path": path, "size": len(data), "oid": blob_id(data)}

    def tree(self, prefix: str, recursive: bool) -> list[dict]:
        """The entries under ``prefix``, as the hub's tree endpoint lists them."""
        out, dirs = [], set()
        for path in sorted(self.files):
            if prefix and not path.startswith(prefix + "/"):
                continue
            parts = path.split("/")
            depth = len(prefix.split("/")) if prefix else 0
            for i in range(depth + 1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    out.append({"type": "directory", "path": d, "oid": "d" * 40, "size": 0})
                if not recursive:
                    break
            if recursive or len(parts) == depth + 1:
                out.append(self.file_entry(path))
        return out

    def _handler(self):
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _send(self, status: int, body: bytes, headers: dict | None = None) -> None:
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **(headers or {})}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _json(self, value) -> None:
                self._send(200, json.dumps(value).encode())

            def do_GET(self):  # noqa: N802 - http.server's name
                url = urlparse(self.path)
                path = unquote(url.path)
                api = f"/api/datasets/{hub.repo}"
                if re.fullmatch(rf"{re.escape(api)}(/revision/[^/]+)?", path):
                    return self._json({"id": hub.repo, "sha": hub.commit, "private": False,
                                       "siblings": [{"rfilename": f} for f in sorted(hub.files)]})
                m = re.fullmatch(rf"{re.escape(api)}/tree/[^/]+(?:/(.*))?", path)
                if m:
                    recursive = parse_qs(url.query).get("recursive", ["false"])[0].lower() == "true"
                    return self._json(hub.tree((m.group(1) or "").strip("/"), recursive))
                m = re.fullmatch(rf"/datasets/{re.escape(hub.repo)}/resolve/[^/]+/(.*)", path)
                if m and hub.refuse_downloads:
                    return self._send(403, b'{"error": "Access to this resource is forbidden"}')
                if m and m.group(1) in hub.files:
                    return self._file(hub.files[m.group(1)])
                self._send(404, b'{"error": "Entry not found"}', {"X-Error-Code": "EntryNotFound"})

            do_HEAD = do_GET  # noqa: N815

            def _file(self, data: bytes) -> None:
                headers = {"Content-Type": "application/octet-stream", "ETag": f'"{blob_id(data)}"',
                           "X-Repo-Commit": hub.commit, "Accept-Ranges": "bytes"}
                byte_range = self.headers.get("Range")
                if not byte_range:
                    return self._send(200, data, headers)
                first, _, last = byte_range.split("=", 1)[1].partition("-")
                start, end = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                self._send(206, data[start:end + 1], headers)

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                path = unquote(urlparse(self.path).path)
                if not re.fullmatch(rf"/api/datasets/{re.escape(hub.repo)}/paths-info/[^/]+", path):
                    return self._send(404, b'{"error": "not found"}')
                try:
                    wanted = json.loads(body)["paths"]
                except (ValueError, KeyError):
                    wanted = parse_qs(body).get("paths", [])
                out = []
                for p in wanted:
                    if p in hub.files:
                        out.append(hub.file_entry(p))
                    elif any(f.startswith(p.rstrip("/") + "/") for f in hub.files):
                        out.append({"type": "directory", "path": p, "oid": "d" * 40, "size": 0})
                self._json(out)

            def log_message(self, *args):
                pass

        return Handler
