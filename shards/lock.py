"""One writer at a time: the lock a command holds on a tree while it changes it.

Every command that changes a tree (bucketed, scaffold, remove, export, stats, train-bpe) is a
lock *scope*, and takes the tree's lock at the one place it passes before it changes anything:

    @lock.command("remove")              # on the command's run(argv): the lock's lifetime
    def run(argv): ...
        lock.take(output)                # refused (TreeLocked, one line) while another writer holds it

The lock is a small JSON file, ``.pretokenize-lock``, at the tree's root:

    {"host": ..., "boot_id": ..., "pid": ..., "command": "pretokenize remove --output ...",
     "started": "2026-12-01T09:30:00Z", "expires": "...", "lease_seconds": 90, "token": "<random>",
     "pid_started": "<the process's start time, /proc/PID/stat field 22>", "pid_ns": "pid:[...]"}

What holds, in order:

    1. it is created only if no lock exists, by the store itself: an exclusive create
       (``O_CREAT|O_EXCL``) on a local disk, a PutObject with ``If-None-Match: *`` on S3, an upload
       with ``ifGenerationMatch=0`` on GCS. Of two commands started together exactly one creates it;
       the other reads who holds it and is refused in one line naming the holder, having changed
       nothing. Another store (memory://, ...) has no such request: there the lock is a check then
       a write, which a writer started at the same instant can pass too
    2. while the command runs, a heartbeat thread renews the lease (every quarter of it): the
       file's modification time on a local disk; on S3 a rewrite conditional on its ETag
       (``If-Match``), so a renewal never overwrites a lock another command has taken since
    3. a holder that is gone frees the lock to the next command, which says so in one line: on the
       same host (same host name, boot id and PID namespace: another container of the host is
       another host here, its pids are not ours to ask), a pid that no longer runs, or that is now another
       process (its start time differs); from another host, a lease not renewed in time (clocks
       must agree to within the lease); or ``--break-lock``, explicitly. On the same host a
       running holder keeps its lock whatever its lease: stopped (Ctrl-Z, a paused VM), it has not
       renewed, and is not gone
    4. a lock is removed only if it is still the one judged (its content or ETag): a local file is
       first renamed aside, read, then deleted (or put back, if it was another's); on S3 the
       DeleteObject is conditional on the ETag (``If-Match``); GCS deletes after reading it again
    5. it is freed when the scope ends, on every exit path (success, error, Ctrl-C); a kill -9
       leaves it to rule 3
    6. a holder that finds its lock taken (broken, or its lease run out while it could not renew)
       stops before its next write in the tree: ``guard`` is asked before every write (shards.tree,
       the spill writer) and renews at once when the heartbeat has been silent for longer than it
       should (the process was stopped); a command (``command``) then says so in one line and
       ends its process at once (exit 2), touching nothing more: the tree is the new holder's

Outside a scope (a test that builds a job itself), ``take`` only checks that no other command
holds the tree, and holds nothing. Readers and ``verify`` take no lock; ``holder`` says who, if
anyone, holds a tree. Nothing here imports Beam.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime
import functools
import json
import logging
import os
import posixpath
import shlex
import socket
import stat
import sys
import threading
import time
import uuid

from shards import layout, storage

LOCK_NAME = ".pretokenize-lock"
LEASE_SECONDS = 90.0  # a holder that has not renewed its lease for this long is taken to be gone
# The lease a command takes, in seconds, instead of LEASE_SECONDS (tests set it short).
LEASE_ENV = "PRETOKENIZE_LOCK_LEASE_SECONDS"
BREAK_FLAG = "--break-lock"
BREAK_HELP = ("take the tree's lock from the command that holds it (only one that is dead: a live one's work would "
              "be corrupted); a dead holder on this host, or one whose lease expired, needs no flag")

log = logging.getLogger("pretokenize.lock")


def is_lock_name(name: str) -> bool:
    """The lock's name, or a name it has for an instant while it is removed (``_LocalStore.remove``)."""
    return name == LOCK_NAME or name.startswith(LOCK_NAME + ".")


class TreeLocked(ValueError):
    """Another command holds the tree's lock: said in one line naming it; nothing was changed."""


class LockLost(RuntimeError):
    """This command's lock was taken by another while it ran: it writes nothing more in the tree."""


def default_lease() -> float:
    """The lease a command takes: $PRETOKENIZE_LOCK_LEASE_SECONDS, else LEASE_SECONDS."""
    text = os.environ.get(LEASE_ENV, "").strip()
    try:
        value = float(text) if text else LEASE_SECONDS
    except ValueError:
        raise ValueError(f"{LEASE_ENV}={text!r} is not a number of seconds") from None
    if not value > 0:
        raise ValueError(f"{LEASE_ENV}={text!r} is not a positive number of seconds")
    return value


def _utc(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_utc(text: str) -> float:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()


def _pid_started(pid: int) -> str:
    """When process ``pid`` started (field 22 of /proc/PID/stat, clock ticks since boot): with the
    pid, it names one process, not whichever later reuses the number. Empty where /proc has none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[19].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return ""


def _pid_namespace() -> str:
    """This process's PID namespace ("pid:[4026531836]"): a pid names a process only inside it (two
    containers of one host share its boot id, and with --network host its name too). Empty where
    /proc has none."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _awake_clock() -> float:
    """Seconds on a clock that goes on while the machine sleeps (CLOCK_BOOTTIME; time.monotonic
    stops during a suspend): a laptop woken after its lease expired knows its lock may be gone."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):  # no such clock (not Linux)
        return time.monotonic()


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a lock, as its file says."""

    host: str
    boot_id: str
    pid: int
    command: str
    started: str  # UTC, ISO 8601
    expires: str  # UTC, ISO 8601: the lease, as last written
    lease_seconds: float
    token: str
    pid_started: str = ""  # _pid_started(pid) when taken (a lock written before it was recorded: empty)
    pid_ns: str = ""  # _pid_namespace() of the holder (a lock written before it was recorded: empty)

    @classmethod
    def new(cls, command: str, lease_seconds: float = LEASE_SECONDS) -> Holder:
        now = time.time()
        return cls(socket.gethostname(), _boot_id(), os.getpid(), command, _utc(now), _utc(now + lease_seconds),
                   lease_seconds, uuid.uuid4().hex, _pid_started(os.getpid()), _pid_namespace())

    def to_json(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes) -> Holder:
        """The holder a lock file names; ValueError when it is not a lock this tool wrote."""
        try:
            d = json.loads(data.decode("utf-8"))
            holder = cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)
                            if f.default is dataclasses.MISSING or f.name in d})
            ok = (isinstance(holder.pid, int) and isinstance(holder.lease_seconds, (int, float))
                  and isinstance(holder.pid_started, str) and isinstance(holder.pid_ns, str))
            _parse_utc(holder.started), _parse_utc(holder.expires)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a lock this tool wrote ({type(e).__name__}: {e})") from None
        if not ok:
            raise ValueError("not a lock this tool wrote (a field of the wrong type)")
        return holder

    def renewed(self) -> Holder:
        return dataclasses.replace(self, expires=_utc(time.time() + self.lease_seconds))

    def describe(self) -> str:
        return f"`{self.command}` (host {self.host}, pid {self.pid}, started {self.started})"

    def on_this_host(self) -> bool:
        """Whether its pid can be asked here: the same host, boot and PID namespace (a holder in
        another container of this host is judged by its lease, as one from another host)."""
        boot, ns = _boot_id(), _pid_namespace()
        return (self.host == socket.gethostname() and (not boot or not self.boot_id or self.boot_id == boot)
                and (not ns or not self.pid_ns or self.pid_ns == ns))


def _pid_runs(pid: int, started: str = "") -> bool:
    """Whether process ``pid`` runs on this host (a zombie, killed but not yet reaped, does not),
    and is the one that started at ``started`` (when given: a pid reused since is another process)."""
    if started and _pid_started(pid) not in ("", started):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return True


@dataclasses.dataclass(frozen=True)
class Found:
    """A lock as read: its holder (None when its file does not parse), the problem if so, and
    what identifies this version of it to the store (its bytes, an ETag, a generation)."""

    holder: Holder | None
    problem: str
    version: object
    modified: float | None  # the store's modification time, when it gives one

    def expiry(self) -> float:
        t = _parse_utc(self.holder.expires)
        if self.modified is not None:  # a local lock is renewed by its mtime
            t = max(t, self.modified + self.holder.lease_seconds)
        return t


def why_free(found: Found, break_lock: bool, now: float | None = None) -> str | None:
    """Why the lock ``found`` may be taken from its holder (a sentence), or None: it is held."""
    now = time.time() if now is None else now
    if found.holder is None:
        return f"broke a lock file that is {found.problem}" if break_lock else None
    h = found.holder
    if break_lock:
        return f"broke the lock held by {h.describe()}"
    if h.on_this_host():
        if not _pid_runs(h.pid, h.pid_started):
            return f"freed the lock of {h.describe()}: that process is no longer running on this host"
        if h.pid_started:
            return None  # that very process runs: stopped or slow, it keeps its lock whatever its lease
        # A lock written before start times were recorded: the pid may be another process's since.
    if now > found.expiry():
        return f"took over the lock of {h.describe()}: its lease expired at {_utc(found.expiry())} unrenewed"
    return None


# ---------------------------------------------------------------------------------------------
# Stores: create if absent, read, renew, remove if unchanged.


class _LocalStore:
    """A lock file on a local disk."""

    def __init__(self, root: str):
        self.root = root
        self.path = os.path.join(root, LOCK_NAME)

    def create(self, data: bytes) -> object:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # FileExistsError: held
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return data

    def _read_fd(self, fd: int) -> bytes:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)

    def read(self) -> tuple[bytes, object, float | None] | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError:  # a symlink (ELOOP) at the lock's name: not ours
            return b"not a file (a symbolic link)", None, None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # a directory, a fifo: not ours, and never read
                return b"not a file (a directory)" if stat.S_ISDIR(st.st_mode) else b"not a file", None, None
            data = self._read_fd(fd)
            return data, data, st.st_mtime
        finally:
            os.close(fd)

    def renew(self, data: bytes, version: object) -> object | None:
        """Touch the lock if it is still ``version``; None when it is not (it was taken)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            if self._read_fd(fd) != version:
                return None
            os.utime(fd)  # this very file: had it been replaced since, the old one is touched, not the new
        finally:
            os.close(fd)
        return version

    def remove(self, version: object) -> bool:
        """Delete the lock if it is ``version``: renamed aside first, so that it is the file judged
        that goes; put back (never over another) if it is not."""
        if os.path.isdir(self.path) and not os.path.islink(self.path):
            return False  # a directory at the lock's name is not a lock: never removed
        aside = f"{self.path}.{uuid.uuid4().hex[:12]}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        try:
            try:
                fd = os.open(aside, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:  # a symlink: judged as "not a file" (version None); the link goes, never its target
                mine = version is None
            else:
                try:
                    mine = self._read_fd(fd) == version
                finally:
                    os.close(fd)
            if not mine:
                with contextlib.suppress(FileExistsError):
                    os.link(aside, self.path)
            return mine
        finally:
            os.unlink(aside)


class _S3Store:
    """A lock object on S3: created with If-None-Match: *, renewed and deleted with If-Match: ETag."""

    def __init__(self, url: str):
        self.fs, path = storage.filesystem(url)
        self.path = posixpath.join(path.rstrip("/"), LOCK_NAME)
        self.bucket, self.key, _ = self.fs.split_path(self.path)

    def create(self, data: bytes) -> object:
        out = self.fs.pipe_file(self.path, data, mode="create")  # s3fs: FileExistsError on 412
        return out["ETag"]

    def read(self) -> tuple[bytes, object, float | None] | None:
        # The ETag first, then the content: acting on a content newer than the ETag is refused by
        # the server (If-Match), never done to a lock that was not judged.
        try:
            info = self.fs.info(self.path, refresh=True)
            data = storage.read_bytes(self.fs, self.path)
        except FileNotFoundError:
            return None
        return data, info["ETag"], None

    def renew(self, data: bytes, version: object) -> object | None:
        try:
            out = self.fs.pipe_file(self.path, data, IfMatch=version)
        except OSError as e:
            if storage.unreachable_problem(e) is not None:
                raise  # the store failed: not an answer about the lock (the heartbeat tries again)
            return None  # 412 (another's ETag), or gone
        return out["ETag"]

    def remove(self, version: object) -> bool:
        try:
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key, IfMatch=version)
        except OSError as e:
            if storage.unreachable_problem(e) is not None:
                raise  # not freed: the command says so in its line (scope)
            return False
        finally:
            self.fs.invalidate_cache(self.path)
        return True


class _OtherStore:
    """Any other fsspec store: a create with ``mode="create"`` where the filesystem has one (gcsfs:
    ``ifGenerationMatch=0``), else a check then a write; renewal and removal re-read, then write."""

    def __init__(self, url: str, exclusive: bool):
        self.fs, path = storage.filesystem(url)
        self.path = posixpath.join(path.rstrip("/"), LOCK_NAME)
        self.exclusive = exclusive

    def create(self, data: bytes) -> object:
        if self.exclusive:
            self.fs.pipe_file(self.path, data, mode="create")  # gcsfs: FileExistsError on 412
        else:
            if self.fs.exists(self.path):
                raise FileExistsError(self.path)
            self.fs.pipe_file(self.path, data)
        return data

    def read(self) -> tuple[bytes, object, float | None] | None:
        try:
            self.fs.invalidate_cache(self.path)
            data = storage.read_bytes(self.fs, self.path)
        except FileNotFoundError:
            return None
        return data, data, None

    def renew(self, data: bytes, version: object) -> object | None:
        now = self.read()
        if now is None or now[1] != version:
            return None
        self.fs.pipe_file(self.path, data)
        return data

    def remove(self, version: object) -> bool:
        now = self.read()
        if now is None or now[1] != version:
            return False
        self.fs.rm_file(self.path)
        return True


def _store(url: str):
    fs, root = storage.filesystem(url)
    if storage.renames_atomically(fs):
        return _LocalStore(root.rstrip("/") or "/")
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    if protocols & {"s3", "s3a"}:
        return _S3Store(url)
    return _OtherStore(url, exclusive=bool(protocols & {"gs", "gcs"}))


def _read(store) -> Found | None:
    got = store.read()
    if got is None:
        return None
    data, version, modified = got
    if version is None:  # not a regular file: what it is, said
        return Found(None, data.decode(), None, modified)
    try:
        return Found(Holder.from_json(data), "", version, modified)
    except ValueError as e:
        return Found(None, str(e), version, modified)


def holder(url: str) -> Found | None:
    """The lock on the tree at ``url`` as it is now (None: no command holds it). For readers."""
    with storage.reaching(url):
        return _read(_store(storage.normalize(url)))


def is_tools_lock(url: str) -> bool:
    """Whether the tree at ``url`` has a lock this tool wrote (a file that parses as a holder)."""
    found = holder(url)
    return found is not None and found.holder is not None


def _has_record(url: str) -> bool:
    fs, root = storage.filesystem(url)
    return fs.exists(posixpath.join(root.rstrip("/") or "/", layout.RECORD_NAME))


def held_line(url: str) -> str | None:
    """What ``verify`` says when a lock is on the tree: one line, or None."""
    found = holder(url)
    if found is None:
        return None
    if found.holder is None:
        return f"{url} has a {LOCK_NAME} that is {found.problem}"
    gone = why_free(found, break_lock=False)
    state = ("left by a writer that is gone" if gone
             else "a writer is changing it now, so what is checked may be half done")
    return f"{url} is locked by {found.holder.describe()}: {state}"


# ---------------------------------------------------------------------------------------------
# The lock a command holds.


# The locks this process holds, by tree URL: what ``guard`` asks (Beam's in-process workers are
# threads of the command's process, outside the scope's context).
_HELD: dict[str, Lock] = {}
_HELD_GUARD = threading.Lock()
_STOPPING = threading.Lock()  # taken, never released, by the thread that ends the process (Lock)


class Lock:
    """A lock this process holds, renewed by a heartbeat thread until ``release``. ``stop_process``
    (a command's lock): losing it ends the process at once, in one line (rule 6)."""

    def __init__(self, url: str, store, holder_: Holder, version: object, made_root: str | None,
                 stop_process: bool = False):
        self.url, self.store, self.holder, self.version = url, store, holder_, version
        self.made_root = made_root
        self.stop_process = stop_process
        self.lost = False
        self._confirmed = _awake_clock()  # when the store last said the lock is this one
        self._stop = threading.Event()
        self._guard = threading.Lock()
        with _HELD_GUARD:
            _HELD[url] = self
        self._thread = threading.Thread(target=self._beat, name=f"pretokenize-lock {url}", daemon=True)
        self._thread.start()

    def renew(self) -> bool:
        """Renew the lease; False (and ``lost``) when the lock is no longer this one."""
        with self._guard:
            if self.lost:
                return False
            renewed = self.holder.renewed()
            version = self.store.renew(renewed.to_json(), self.version)
            if version is None:
                self.lost = True
                if not self.stop_process:  # a command says it in its one line (_lost_line_and_stop)
                    log.warning("the lock of %s was taken by another command while this one ran", self.url)
                return False
            if not isinstance(self.store, _LocalStore):  # a local lock renews its mtime, not its content
                self.holder = renewed
            self.version = version
            self._confirmed = _awake_clock()
            return True

    def check(self) -> None:
        """Before a write: LockLost (or, for a command, the end of the process) when the lock was
        taken. Renewed here first when the heartbeat has been silent for longer than a quarter of
        the lease and more (the process was stopped, or the store did not answer)."""
        if not self.lost and _awake_clock() - self._confirmed > self.holder.lease_seconds / 3:
            try:
                self.renew()
            except Exception as e:  # noqa: BLE001 - unreachable for a moment: the heartbeat says so; the lease has margin
                log.warning("could not renew the lock of %s: %s", self.url, storage.unreachable_problem(e) or e)
        if self.lost:
            self._lost_line_and_stop()

    def _lost_line_and_stop(self):
        if self.stop_process:
            _STOPPING.acquire()  # one thread says it and ends the process; any other waits for that
        found = None
        with contextlib.suppress(Exception):
            found = _read(self.store)
        by = (f" by {found.holder.describe()}" if found is not None and found.holder is not None
              else " by another command")
        line = (f"{self.url}: this command's lock was taken{by} while it ran (it was stopped, or could not renew "
                "its lease): it stops here and writes nothing more there; the tree is the other command's now")
        if self.stop_process:
            print(f"pretokenize: {line}", file=sys.stderr, flush=True)
            os._exit(2)  # no cleanup: every file there is the new holder's to keep or delete
        raise LockLost(line)

    def _beat(self) -> None:
        while not self._stop.wait(self.holder.lease_seconds / 4):
            try:
                if not self.renew():
                    if self.stop_process:
                        self._lost_line_and_stop()
                    return
            except Exception as e:  # noqa: BLE001 - a store unreachable for a moment: the lease has margin
                log.warning("could not renew the lock of %s: %s", self.url, storage.unreachable_problem(e) or e)

    def release(self) -> str | None:
        """Stop renewing and free the lock; None once freed (or not this command's any more), else
        why the store could not be asked to (the next command frees it once this process has
        ended; from another host, once its lease has expired)."""
        self._stop.set()
        self._thread.join()
        with _HELD_GUARD:
            if _HELD.get(self.url) is self:
                del _HELD[self.url]
        problem = None
        with self._guard:
            if not self.lost:
                try:
                    self.store.remove(self.version)
                except Exception as e:  # noqa: BLE001 - the command's own outcome must not be lost to this
                    problem = storage.unreachable_problem(e) or storage.one_line(e)
        if self.made_root is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self.made_root)  # only if it is still empty
        return problem


def guard(url: str) -> None:
    """Before a write in the tree at ``url``: when this process holds its lock and it was taken
    since, LockLost (a command: one line, and the process ends). Nothing when it holds none."""
    held = _HELD.get(url) if _HELD else None
    if held is None and _HELD:
        held = _HELD.get(storage.normalize(url))
    if held is not None:
        held.check()


def _acquire(url: str, command: str, break_lock: bool, make_root: bool, lease_seconds: float,
             stop_process: bool) -> Lock:
    store = _store(url)
    made_root = None
    if isinstance(store, _LocalStore) and make_root and not os.path.isdir(store.root):
        os.makedirs(store.root)
        made_root = store.root
    me = Holder.new(command, lease_seconds)
    data = me.to_json()
    for _ in range(5):
        try:
            version = store.create(data)
        except FileExistsError:
            found = _read(store)
            if found is None:
                continue  # freed meanwhile
            why = why_free(found, break_lock)
            if why is not None and found.holder is None and not _has_record(url):
                # A file of the lock's name that is no lock, where the tool has no tree: the user's.
                raise TreeLocked(f"{storage.join(url, LOCK_NAME)} is {found.problem}, and {url} is not a pretokenize "
                                 f"tree: {BREAK_FLAG} removes only a lock in the tool's own tree; move it away by "
                                 "hand") from None
            if why is None:
                if made_root is not None:
                    with contextlib.suppress(OSError):
                        os.rmdir(made_root)
                raise TreeLocked(_refusal(url, found)) from None
            if store.remove(found.version):
                print(f"pretokenize: {url}: {why}", file=sys.stderr, flush=True)
            elif isinstance(store, _LocalStore) and os.path.isdir(store.path) and not os.path.islink(store.path):
                raise TreeLocked(f"{storage.join(url, LOCK_NAME)} is {found.problem}: the tool removes no directory; "
                                 "move it away by hand") from None
            continue
        return Lock(url, store, me, version, made_root, stop_process)
    raise TreeLocked(f"{url}: could not take its lock ({LOCK_NAME}): other commands keep taking it")


def _refusal(url: str, found: Found) -> str:
    if found.holder is None:
        return (f"{storage.join(url, LOCK_NAME)} is {found.problem}; if no pretokenize command is changing {url}, "
                f"{BREAK_FLAG} removes it")
    return (f"{url} is locked by another command, {found.holder.describe()}: nothing was changed; run this once it "
            f"has finished ({BREAK_FLAG} takes the lock of a command that is dead)")


@dataclasses.dataclass
class _Scope:
    command: str
    break_lock: bool
    stop_process: bool = False  # a command's: losing a lock ends the process (Lock)
    held: dict = dataclasses.field(default_factory=dict)


_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("pretokenize_lock_scope", default=None)


def wants_break(argv: list[str]) -> bool:
    return any(a in (BREAK_FLAG, "--break_lock") for a in argv)


@contextlib.contextmanager
def scope(command_line: str, break_lock: bool = False, stop_process: bool = False):
    """Locks taken inside (``take``) are held until it ends, however it ends. A lock that could not
    be freed is said once: on an error, in its one line (``unfreed_note``), else in a warning."""
    current = _Scope(command_line, break_lock, stop_process)
    token = _SCOPE.set(current)
    error = None
    try:
        yield current
    except BaseException as e:
        error = e
        raise
    finally:
        _SCOPE.reset(token)
        for lock in reversed(list(current.held.values())):
            problem = lock.release()
            if problem is None:
                continue
            later = ("the next command frees it once this process has ended (from another host, once its lease has "
                     "expired)")
            if error is not None:
                note = f"; its lock {storage.join(lock.url, LOCK_NAME)} could not be freed ({problem}): {later}"
                error.pretokenize_lock_note = getattr(error, "pretokenize_lock_note", "") + note
            else:
                log.warning("could not free the lock of %s (%s): %s", lock.url, problem, later)


def unfreed_note(error: BaseException) -> str:
    """What ``scope`` noted on ``error`` of a lock it could not free ("" when none): the CLI ends
    its one line with it."""
    return getattr(error, "pretokenize_lock_note", "")


def command(job: str):
    """Decorates a writing command's ``run(argv)``: its run is the scope of the locks it takes.
    ``--break-lock`` on its command line breaks a lock that is held."""

    def decorate(run):
        @functools.wraps(run)
        def wrapper(argv: list[str] | None = None, *args, **kwargs):
            argv = list(argv or [])
            with scope(shlex.join(["pretokenize", job, *argv]), wants_break(argv), stop_process=True):
                return run(argv, *args, **kwargs)

        return wrapper

    return decorate


def take(url: str, make_root: bool = False, lease_seconds: float | None = None) -> Lock | None:
    """Take the lock of the tree at ``url`` for the current scope (held until it ends; taken once
    per tree). TreeLocked, one line naming the holder, when another command holds it. Outside a
    scope, only that check. ``make_root``: create a missing local directory (an empty output).
    ``lease_seconds``: the lease, $PRETOKENIZE_LOCK_LEASE_SECONDS (or 90 s) when not given."""
    url = storage.normalize(url)
    current = _SCOPE.get()
    with storage.reaching(url):
        if current is None:
            found = _read(_store(url))
            if found is not None and why_free(found, False) is None:
                raise TreeLocked(_refusal(url, found))
            return None
        if url not in current.held:
            lease = lease_seconds if lease_seconds is not None else default_lease()
            current.held[url] = _acquire(url, current.command, current.break_lock, make_root, lease,
                                         current.stop_process)
            for tidy in _ON_TAKEN:
                tidy(url)
        return current.held[url]


# What a command does first once it holds a tree's lock: nothing another command uses is then in
# the tree's temporary directory (shards.tree registers its tidying: a killed removal's id match).
_ON_TAKEN: list = []


def when_taken(tidy) -> None:
    """``tidy(url)`` runs each time a command takes the lock of the tree at ``url``."""
    if tidy not in _ON_TAKEN:
        _ON_TAKEN.append(tidy)
