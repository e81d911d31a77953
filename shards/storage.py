"""Paths on any fsspec filesystem (local, gs://, s3://, memory://), as URLs with their protocol.

Jobs pass URLs, not filesystem objects, between steps: a URL pickles to a remote worker, and each
process opens its own filesystem from it.
"""

from __future__ import annotations

import os
import posixpath
import uuid

import fsspec
from fsspec.implementations.local import LocalFileSystem


def normalize(url: str) -> str:
    """An absolute local path for a local path, the URL unchanged for any other protocol."""
    if "://" in url:
        return url.rstrip("/")
    return os.path.abspath(os.path.expanduser(url))


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem of ``url`` and the path inside it."""
    return fsspec.core.url_to_fs(url)


def join(url: str, *parts: str) -> str:
    return posixpath.join(url, *parts) if "://" in url else os.path.join(url, *parts)


def unstrip(fs: fsspec.AbstractFileSystem, path: str, like: str) -> str:
    """Give a path that ``fs`` returned (from glob, find) the protocol that ``like`` had."""
    if "://" not in like:
        return path
    protocol = like.split("://", 1)[0]
    return f"{protocol}://{path.lstrip('/')}" if protocol != "memory" else f"memory://{path}"


def renames_atomically(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether a rename on ``fs`` is atomic (a local disk). Object stores have no rename: there a
    "move" is a copy and a delete, and an upload is what is all-or-nothing."""
    return isinstance(fs, LocalFileSystem)


def write_atomic(url: str, data: bytes, scratch: str | None = None) -> None:
    """Write ``data`` to ``url`` so a reader sees the old content or the new, never a part.

    Local files are written to a temporary name and renamed over the target: beside it, or in the
    directory ``scratch`` (a URL on the same filesystem) so that a crash leaves nothing next to
    the target. On object stores a single upload is already all-or-nothing, so the object is
    written in place.
    """
    fs, path = filesystem(url)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    if not renames_atomically(fs):
        fs.pipe_file(path, data)
        return
    if scratch is not None:
        scratch_dir = filesystem(scratch)[1]
        fs.makedirs(scratch_dir, exist_ok=True)
        tmp = posixpath.join(scratch_dir, f"{posixpath.basename(path)}.partial-{uuid.uuid4().hex[:12]}")
    else:
        tmp = f"{path}.partial-{os.getpid()}"
    try:
        with fs.open(tmp, "wb") as f:
            f.write(data)
        fs.mv(tmp, path)
    except BaseException:
        if fs.exists(tmp):
            fs.rm_file(tmp)
        raise
