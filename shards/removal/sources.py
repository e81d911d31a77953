"""The removal requests a bucketed run honours: its --removal-list, and those the output accepted.

A removal request, once accepted, stays honoured by every later run into the same output: the ids
the tree's removals.txt lists as taken out (read as the log it is, strictly), and those of a
removal that was interrupted (its journal, shards' temporary directory), which this run finishes
and records in removals.txt. A run that would read ids from another field than the one they are
values of is refused: the removed documents would come back.

The bucketed job's build reads them once (RemovalSources.read), before the output is prepared
(the journal is kept, and the ids are part of the work's description), and stages them after
(RemovalSources.stage), when the output is claimed and may be written. Nothing here imports Beam.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os

from shards import storage, tree
from shards.removal.audit import scan_tree_log
from shards.removal.journal import JOURNAL_DIR, RemovalPlan, load_journal
from shards.removal.lists import REMOVALS_NAME, check_id_field, read_removal_list, read_removal_source, tree_id_field

log = logging.getLogger("pipelines.bucketed")


@dataclasses.dataclass(frozen=True)
class RemovalSources:
    output: str
    lists: tuple[str, ...]  # --removal-list, normalized
    removals_txt: str | None  # the output itself when it has a removals.txt: the tree is its own list
    pending: RemovalPlan | None  # the journal of a removal that was interrupted

    @classmethod
    def read(cls, output: str, removal_list: str | None, id_field: str) -> RemovalSources:
        """The sources a run into ``output`` given ``removal_list`` reads ids from; a ValueError
        naming the source whose ids are values of another field than the run's ``id_field``."""
        pending = load_journal(output) if tree.read_record(output) is not None else None
        # Strictly, streamed: only its id field is needed here. A missing or cut log stops the run,
        # but one given a removal list, which records that list's ids again.
        tree_log = scan_tree_log(output, repairing=storage.normalize(removal_list) if removal_list
                                 else None)
        if tree_log is not None:
            check_id_field(tree_log.id_field or tree_id_field(_stats_text(output)),
                           storage.join(output, REMOVALS_NAME), id_field)
        if pending is not None:
            check_id_field(tree_id_field(pending.stats_before), f"the unfinished removal {pending.run} in {output}",
                           id_field)
        lists = (storage.normalize(removal_list),) if removal_list else ()
        for url in lists:
            _, list_field = read_removal_source(url)
            check_id_field(list_field, f"--removal-list {url}", id_field)
        return cls(output, lists, output if tree_log is not None else None, pending)

    @property
    def keep(self) -> tuple[str, ...]:
        """The temporary entries prepare_output must leave: a pending removal's journal."""
        return (JOURNAL_DIR,) if self.pending else ()

    def ids(self) -> set[str]:
        """The ids the run leaves out: those of the removal lists (and removals.txt), and of a pending removal."""
        sources = list(self.lists) + ([self.removals_txt] if self.removals_txt else [])
        ids = {i for url in sources for i in read_removal_list(url)}
        if self.pending is not None:
            ids.update(i for _, i, _ in self.pending.iter_removed_rows())
        return ids

    def fingerprint(self) -> str:
        """The ids, as the work's description records them: a run with other ids resumes nothing."""
        return hashlib.sha256("\n".join(sorted(self.ids())).encode()).hexdigest()[:16]

    def stage(self, run_id: str, scratch: str | None) -> tuple[str, ...]:
        """The sources DropRemovedFn reads. Called once the output is claimed: a pending removal's
        ids are written into the run's temporary directory, or into ``scratch`` for a dry run,
        which writes nothing into the output."""
        sources = list(self.lists)
        if self.removals_txt:
            sources.append(self.removals_txt)
            log.warning("%s has a %s: the documents it lists stay out", self.output, REMOVALS_NAME)
        if self.pending is not None:
            sources.append(self._write_pending_list(run_id, scratch))
            log.warning("%s has an unfinished removal (run %s, %d documents): they stay out, and this run "
                        "records them in %s", self.output, self.pending.run, self.pending.removed_documents,
                        REMOVALS_NAME)
        return tuple(sources)

    def _write_pending_list(self, run_id: str, scratch: str | None) -> str:
        ids = "".join(f"{i}\n" for _, i, _ in self.pending.iter_removed_rows()).encode()
        if scratch is not None:
            pending_list = os.path.join(scratch, tree.Tree.PENDING_REMOVAL_LIST)
            storage.write_atomic(pending_list, ids)
            return pending_list
        name = tree.Tree.temp_name(run_id, tree.Tree.PENDING_REMOVAL_LIST)
        tree.Tree(self.output).write(name, ids)
        return storage.join(self.output, name)


def _stats_text(output: str) -> str | None:
    return tree.OutputTree.open(output).stats_text if tree.read_record(output) is not None else None
