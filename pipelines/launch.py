"""The output of a writing job at launch and after a failure: a run's id, the output checked and
claimed, what runs that died before publishing left removed (but the work this run resumes from),
and a failed run's temporary files deleted.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import time
import uuid
from typing import TYPE_CHECKING

from pipelines.errors import RunStopped, no_space_message
from pipelines.run_mode import RUN, RunMode
from shards import lock, storage, tree
from transforms.core.records import UsageError

if TYPE_CHECKING:
    from transforms.run import resume

log = logging.getLogger("pipelines")


def new_run_id() -> str:
    """Names the run's temporary directory; never part of the output's bytes."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def prepare_output(output: str, kind: str, inputs: list[str] = (), keep: tuple[str, ...] = (),
                   work: resume.WorkDescription | None = None, restart: bool = False,
                   mode: RunMode = RUN) -> resume.SavedWork | None:
    """Check the output at launch, claim it, and remove what runs that died before publishing left,
    but the work this run can resume from; returns that work (None without a ``work`` description).

    The output must be empty, missing, or a tree of ``kind`` this tool wrote (shards.tree: a run
    into anything else is refused, naming a file that is not ours), and no input file may lie
    inside it. Leftovers are the entries of the tree's temporary directory, but those named in
    ``keep`` (a pending removal's journal) and the saved work made for the same description
    (transforms.run.resume), unless ``restart``. Saved work made for another description is
    removed with a one-line warning saying what changed. Before anything changes, the output's
    lock is taken (shards.lock): a second command writing into it is refused, naming the first. A
    dry run (``mode``) takes no lock and changes nothing.
    """
    from transforms.run import resume

    for path in inputs:
        if tree.inside(path, output):
            raise UsageError(f"--input {path} is inside --output {output}; write the output elsewhere")
    out = tree.Tree(output)
    leftovers = _claim(out, output, kind, mode.dry_run)
    saved = resume.SavedWork(output, work) if work is not None else None
    if saved is not None:
        try:
            out.check_no_links(out.temp_name(saved.dir_name), "saved work")
        except tree.UnsafePathError as e:
            raise UsageError(str(e)) from None
    if mode.dry_run:
        # The job is only translated: the output is checked, and nothing in it changes (an earlier
        # run's leftovers, or a real run going on into it, are left alone).
        if saved is not None:
            saved.done = set() if restart else saved.done_units()
        return saved
    for name in leftovers:
        leftover = out.url_of(out.temp_name(name), "temporary entry")
        if name in keep or (saved is not None and name == saved.dir_name and not restart):
            continue
        _remove_leftover(out, name, leftover, saved, work)
    _begin(out, output, saved)
    if saved is not None and saved.done:
        log.warning("resuming: %d of %d input units were finished by an earlier run and are not redone "
                    "(--restart redoes them)", len(saved.done), len(work.inputs))
    return saved


def _claim(out: tree.Tree, output: str, kind: str, dry_run: bool) -> list[str]:
    """Claim the tree at ``output`` for ``kind`` and take its lock (neither for a dry run); check
    every name the run may write or delete; return the entries of its temporary directory."""
    try:
        tree.claim(output, kind, write=False)  # refused before the lock is put into someone else's directory
        if not dry_run:
            lock.take(output, make_root=True)
        record = tree.claim(output, kind, write=not dry_run)
        # Before anything changes: every name the run may write or delete is inside the tree and
        # reached through no link (shards.tree.Tree), the temporary directory included.
        out.check_writable(record.files + record.derived, "recorded file")
        out.check_writable(sorted(tree.fixed_names() - {lock.LOCK_NAME}), "fixed file")  # the lock: shards.lock
        out.check_data_dirs(kind)
        return out.temp_entries()
    except (tree.NotOurTreeError, tree.UnsafePathError, storage.Unreachable) as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"--output {output} cannot be written: {e}") from None


def _remove_leftover(out: tree.Tree, name: str, leftover: str, saved: resume.SavedWork | None,
                     work: resume.WorkDescription | None) -> None:
    """Remove the temporary entry ``name`` (at ``leftover``), with a warning saying why it goes."""
    from transforms.run import resume

    if not name.startswith(resume.WORK_PREFIX):
        log.warning("removing %s, left by an interrupted run", leftover)
    elif saved is not None and name == saved.dir_name:
        log.warning("starting afresh (--restart): removing the work an earlier run saved in %s", leftover)
    else:
        old = resume.read_description(leftover)
        why = (work.difference(old) if work is not None and old is not None else "") or "its settings differ"
        log.warning("starting afresh: %s since the earlier run; removing the work it saved in %s", why, leftover)
    out.remove_dir(out.temp_name(name), "temporary entry")


def _begin(out: tree.Tree, output: str, saved: resume.SavedWork | None) -> None:
    """Make the temporary directory, and begin the saved work (the units it has done read)."""
    try:
        out.makedirs(out.TEMP_DIR, "temporary directory")
        if saved is not None:
            saved.done = saved.done_units()
            saved.begin()
    except OSError as e:
        full = no_space_message(e)
        if saved is not None and not saved.done:
            with contextlib.suppress(OSError):
                out.remove_dir(out.temp_name(saved.dir_name), "saved work")
        if full is not None:
            raise RunStopped(f"{full} ({output}); nothing was published and the previous output is intact") from None
        raise UsageError(f"--output {output} cannot be written: {e}") from None


def abandon_run(output: str, run_id: str) -> tuple[bool, int]:
    """Delete a failed run's temporary directory; whether it had begun publishing (then the tree
    is unfinished, no longer the previous output), and how many finished input units its saved
    work keeps for a re-run to resume from (saved work with none is deleted too, and in saved work
    kept, every spill file no finished unit points into)."""
    from transforms.run import resume

    out = tree.Tree(output)
    run_dir = out.writable(out.temp_name(run_id), "temporary entry")
    published = out.fs.exists(posixpath.join(run_dir, out.PUBLISHING_MARK))
    out.remove_dir(out.temp_name(run_id), "temporary entry")
    kept = 0
    for name in out.temp_entries():
        if not name.startswith(resume.WORK_PREFIX):
            continue
        work_url = out.url_of(out.temp_name(name), "saved work")
        done = len(resume.done_units(work_url))
        if done:
            kept += done
            # Only the finished units' work is kept: the spill files of the others go (the run's
            # unit that failed, a full disk's half-written file).
            unfinished = resume.unfinished_files(work_url)
            root = storage.filesystem(out.url)[1].rstrip("/") + "/"
            out.remove_files([path[len(root):] for path in unfinished if path.startswith(root)])
        else:
            out.remove_dir(out.temp_name(name), "saved work")
    out.remove_temp_if_empty()
    return published, kept


def kept_work_note(kept: int) -> str:
    if not kept:
        return "the run's temporary files were deleted"
    return (f"the work of {kept} finished input unit{'s' if kept != 1 else ''} is kept: the same command resumes "
            "from it (--restart discards it)")
