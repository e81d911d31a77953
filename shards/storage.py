"""Paths on any fsspec filesystem (local, gs://, s3://, hf://, memory://), as URLs with their protocol.

Jobs pass URLs, not filesystem objects, between steps: a URL pickles to a remote worker, and each
process opens its own filesystem from it.

Also here, for every filesystem alike: what version of a file its listing gives (``file_version``:
a Hugging Face hub file's sha256 or git blob id, an object's generation or ETag, a local mtime),
and the one-line error for a store that cannot be reached or refuses the credentials
(``reaching``: ``cannot reach s3://bucket/x.parquet: connection failed: ...``), instead of the
client library's pages of traceback.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import posixpath
import stat
import uuid
from collections.abc import Iterator

import fsspec
import fsspec.asyn
from fsspec.implementations.local import LocalFileSystem


def normalize(url: str) -> str:
    """An absolute local path for a local path, the URL unchanged for any other protocol."""
    if "://" in url:
        return url.rstrip("/")
    return os.path.abspath(os.path.expanduser(url))


def resolved(url: str) -> str:
    """``normalize(url)`` with, for a local path (``file://`` too), every link on it resolved; the
    URL unchanged for any other protocol. Two spellings of one local directory resolve alike."""
    if url.startswith("file://"):
        url = url[len("file://"):]
    if "://" in url:
        return url.rstrip("/")
    return os.path.realpath(os.path.expanduser(url))


# The package each protocol's filesystem needs, and the extra of this project that installs it.
# Requests a reader of spill files keeps in flight on an object store (the client's pool is sized to match).
DEFAULT_CONNECTIONS = 32
_EXTRAS = {"hf": ("huggingface_hub", "hf"), "gs": ("gcsfs", "gcp"), "gcs": ("gcsfs", "gcp"), "s3": ("s3fs", "aws")}


def filesystem(url: str, connections: int | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem of ``url`` and the path inside it; an ImportError naming the extra to
    install when the protocol's package is missing. ``connections``: requests a caller keeps in
    flight at once (SpillReader), so the client's connection pool is made that large (s3fs's is
    botocore's ``max_pool_connections``, 10 by default; gcsfs's aiohttp pool allows 100 already)."""
    try:
        return fsspec.core.url_to_fs(url, **_pool_options(url, connections))
    except ImportError:
        protocol = url.split("://", 1)[0] if "://" in url else ""
        if protocol not in _EXTRAS:
            raise
        package, extra = _EXTRAS[protocol]
        raise ImportError(f"{protocol}:// paths need {package}: pip install 'beam-pretokenize[{extra}]' "
                          f"(for {url})") from None


def _pool_options(url: str, connections: int | None) -> dict:
    if not connections or not url.startswith("s3://"):
        return {}
    # fsspec's configuration (fsspec.config.conf, FSSPEC_S3_* variables) is merged one level deep:
    # its config_kwargs are kept, the pool size added.
    config = dict(fsspec.config.conf.get("s3", {}).get("config_kwargs") or {})
    config["max_pool_connections"] = max(connections, int(config.get("max_pool_connections") or 0))
    return {"config_kwargs": config}


# Where a filesystem's info() gives a file's version, in the order asked: an object store's
# (ETag on s3, generation and md5Hash on gs), then times (a local file's mtime).
_VERSION_KEYS = ("ETag", "etag", "generation", "md5Hash", "mtime", "LastModified", "updated", "created")


def file_version(info: dict) -> str:
    """The version a filesystem's info() gives a file: on the Hugging Face hub its content's sha256
    (an LFS file) or its git blob id, else its xet hash; elsewhere the first of _VERSION_KEYS.
    Empty when the filesystem gives none (then only the size tells a change)."""
    lfs = info.get("lfs")
    if isinstance(lfs, dict) and lfs.get("sha256"):
        return f"sha256:{lfs['sha256']}"
    for key in ("blob_id", "xet_hash"):
        if info.get(key):
            return f"{key}:{info[key]}"
    return next((str(info[k]) for k in _VERSION_KEYS if info.get(k) is not None), "")


class ChangedError(OSError):
    """A file is no longer the version a reader opened (another one was written at its name)."""


def conditional_reads(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether read_range asks the store itself to refuse another version (s3fs: If-Match); elsewhere
    the version is the one ``fs.info`` gives, asked before each read."""
    return hasattr(fs, "_call_s3") and hasattr(fs, "split_path")


def read_range(fs: fsspec.AbstractFileSystem, path: str, start: int, end: int, version: str, size: int) -> bytes:
    """Bytes [start, end) of the object at ``path``, only from the version a reader opened
    (``version``: file_version of its info then; ``size``): ChangedError otherwise. On S3 the read
    is conditional (If-Match the ETag: the store refuses another version's bytes); elsewhere the
    version is asked just before the read."""
    if version and conditional_reads(fs):
        return _read_s3_range(fs, path, start, end, version)
    fs.invalidate_cache(path)
    info = fs.info(path)
    if file_version(info) != version or int(info["size"]) != size:
        raise ChangedError(f"{path}: version {file_version(info)!r}, {info['size']} bytes; opened as {version!r}, "
                           f"{size} bytes")
    return fs.cat_file(path, start=start, end=end)


def _read_s3_range(fs, path: str, start: int, end: int, etag: str) -> bytes:
    bucket, key, _ = fs.split_path(path)

    async def get() -> bytes:
        response = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}",
                                     IfMatch=etag)
        try:
            return await response["Body"].read()
        finally:
            response["Body"].close()

    try:
        return fsspec.asyn.sync(fs.loop, get)
    except Exception as e:
        if _precondition_failed(e):
            raise ChangedError(f"{path}: its ETag is no longer {etag}") from None
        raise


def _precondition_failed(error: BaseException | None) -> bool:
    """Whether the store answered 412 Precondition Failed (s3fs gives an OSError caused by botocore's)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        response = getattr(error, "response", None)
        if isinstance(response, dict) and (response.get("Error", {}).get("Code") in ("PreconditionFailed", "412") or
                                           response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412):
            return True
        error = error.__cause__ or error.__context__
    return False


class Unreachable(OSError):
    """A store that could not be reached or refused the credentials, said in one line that names
    the URL: ``cannot reach URL: connection failed: DETAIL``."""

    PREFIX = "cannot reach "


# Exception class names (of any class in an error's MRO) that mean the store was not reached, or
# refused who was asking. Names, not classes: the client libraries (botocore, aiohttp, httpx,
# requests, google-auth, huggingface_hub) are optional, and each has its own.
_CONNECTION = {
    "ConnectionError", "TimeoutError", "gaierror", "EndpointConnectionError", "ConnectTimeoutError",
    "ReadTimeoutError", "ClientConnectorError", "ClientConnectionError", "ServerTimeoutError", "ConnectError",
    "ConnectTimeout", "ReadTimeout", "TimeoutException", "NetworkError", "NewConnectionError", "MaxRetryError",
    "TransportError", "OfflineModeIsEnabled",
}
_CREDENTIALS = {
    "NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "DefaultCredentialsError",
    "RefreshError", "GatedRepoError", "RepositoryNotFoundError",
}
_DENIED_STATUS = {401, 403}
# A body cut short, a connection dropped mid-answer (aiohttp, botocore, urllib3, http.client).
_CONNECTION |= {"ClientPayloadError", "ServerDisconnectedError", "IncompleteReadError", "ResponseStreamingError",
                "IncompleteRead", "ProtocolError", "RemoteDisconnected", "ContentLengthError"}


def _status(error: BaseException) -> int | None:
    """The HTTP status an error carries (gcsfs HttpError.code, huggingface_hub's response)."""
    response = getattr(error, "response", None)
    code = getattr(response, "status_code", None) or getattr(error, "code", None)
    return code if isinstance(code, int) else None


def _failed_status(error: BaseException) -> str | None:
    """What a store that answered with a failure said (an HTTP 5xx or 429; S3's SlowDown): "HTTP 503
    SlowDown (Please reduce your request rate.) to PutObject"; None for any other error."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):  # botocore's ClientError (s3fs raises an OSError from it)
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code, message = response.get("Error", {}).get("Code", ""), response.get("Error", {}).get("Message", "")
        operation = getattr(error, "operation_name", "")
    else:
        status, code, message, operation = _status(error), "", one_line(error), ""
    if not isinstance(status, int) or not (status >= 500 or status == 429 or code == "SlowDown"):
        return None
    said = " ".join(part for part in (f"HTTP {status}", code, f"({message})" if message else "") if part)
    return f"{said} to {operation}" if operation else said


def one_line(error: BaseException) -> str:
    """An error's text on one line, at most 240 characters."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__
    return text if len(text) <= 240 else text[:237] + "..."


def _refused(error: BaseException, remote: bool) -> bool:
    if {cls.__name__ for cls in type(error).__mro__} & _CREDENTIALS or _status(error) in _DENIED_STATUS:
        return True
    if not remote or not isinstance(error, OSError):
        return False
    # s3fs turns AccessDenied into a PermissionError; gcsfs raises a 403 as OSError("Forbidden: ...").
    return (isinstance(error, PermissionError) and error.errno in (None, errno.EACCES, errno.EPERM)) or (
        error.errno is None and str(error).startswith("Forbidden"))


def unreachable_problem(error: BaseException, remote: bool = True) -> str | None:
    """``connection failed: ...``, ``access refused: ...`` or ``the store failed: HTTP 503 ...`` when
    ``error`` (or one it was raised from) says the store was not reached, refused the credentials or
    answered with a failure (a 5xx, a 429: after the client's retries); None for any other error.
    A PermissionError counts only for a ``remote`` store (a local one is a file's mode)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if _refused(error, remote):
            return f"access refused (check the credentials): {one_line(error)}"
        if {cls.__name__ for cls in type(error).__mro__} & _CONNECTION:
            return f"connection failed: {one_line(error)}"
        failed = _failed_status(error)
        if failed is not None:
            return f"the store failed: {failed}"
        error = error.__cause__ or error.__context__
    return None


@contextlib.contextmanager
def reaching(url: str) -> Iterator[None]:
    """Errors inside that say the store of ``url`` was not reached, or refused the credentials,
    become one Unreachable naming ``url``; every other error passes as it is."""
    try:
        yield
    except Unreachable:
        raise
    except Exception as e:
        problem = unreachable_problem(e, remote="://" in url and not url.startswith("file://"))
        if problem is None:
            raise
        raise Unreachable(f"{Unreachable.PREFIX}{url}: {problem}") from e


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


# Object stores, where a "directory" is a prefix of names: nothing to create before a write, and
# asking to (fsspec's makedirs) costs a request to check that the bucket exists.
_FLAT_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs"})


def has_directories(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether ``fs`` has directories to create before a file is written in them (not an object store)."""
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    return not protocols & _FLAT_PROTOCOLS


class NotRegularFileError(ValueError):
    """A local path the tool reads is not a regular file (a directory, a FIFO, a socket, a device):
    the tool writes none there, and opening a FIFO could wait for a writer forever."""


def open_read(fs: fsspec.AbstractFileSystem, path: str, mode: str = "rb", **kwargs):
    """``fs.open(path, mode)`` for reading; on a local disk, a path that is not a regular file
    (a directory, a FIFO, a socket, a device) raises NotRegularFileError, naming it, without waiting: it is
    opened non-blocking and checked before a byte is read (a link is followed to what it names)."""
    if not isinstance(fs, LocalFileSystem):
        return fs.open(path, mode, **kwargs)

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st_mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(st_mode):
            raise NotRegularFileError(f"{path} is {_kind_of(st_mode)}, not a regular file, where pretokenize reads one "
                                      "it wrote: move it away")
        os.set_blocking(fd, True)
        raw = io.FileIO(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise
    buffered = io.BufferedReader(raw, buffer_size=kwargs.pop("block_size", io.DEFAULT_BUFFER_SIZE))
    if "b" in mode:
        return buffered
    return io.TextIOWrapper(buffered, encoding=kwargs.pop("encoding", "utf-8"), errors=kwargs.pop("errors", None),
                            newline=kwargs.pop("newline", None))


def _kind_of(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return kind
    return "a special file"


def read_bytes(fs: fsspec.AbstractFileSystem, path: str) -> bytes:
    """The whole of ``path`` (``fs.cat_file``), a non-regular local file refused as open_read does."""
    if not isinstance(fs, LocalFileSystem):
        return fs.cat_file(path)
    with open_read(fs, path) as f:
        return f.read()


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
    with moved_into_place(fs, tmp, path):
        with fs.open(tmp, "wb") as f:
            f.write(data)


@contextlib.contextmanager
def moved_into_place(fs: fsspec.AbstractFileSystem, tmp: str, path: str) -> Iterator[None]:
    """What the block writes to ``tmp`` is moved to ``path`` once it ends; if it fails (or is
    interrupted), ``tmp`` is removed and ``path`` left as it was."""
    try:
        yield
        fs.mv(tmp, path)
    except BaseException:
        if fs.exists(tmp):
            fs.rm_file(tmp)
        raise
