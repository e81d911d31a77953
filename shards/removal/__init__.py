"""Removal, without Beam: take flagged documents out of the shards that hold them, and nothing else.

The manifest says which files hold a flagged id; only those files are rewritten, streaming, with
the flagged documents left out; every other file keeps its bytes. A removal is journalled so that
a crash at any point can be finished by running the same command again:

    plan      the launcher streams the manifest and writes, under OUTPUT/.pretokenize-tmp/removal/,
              each affected file's rows (which to drop) to files/NNNNNN.json as soon as they are
              read, then plan.json: the run id, the stats before, each affected file's counts
              before and after (its commit point; the plan is never held whole, nor carried in
              the job graph: the job gets the files' numbers, workers read the rows); then it
              deletes the saved work of interrupted runs and dataset_stats.txt, so the tree
              reads as unfinished until the removal is done
    rewrite   each affected file's new copy is written in the journal's directory and renamed
              over the old one (or the file is deleted when nothing is left); a file whose size
              already equals its "after" count was done by an earlier attempt and is skipped
    finish    the manifest without the removed rows replaces the old one (streamed: one affected
              file's rows read from the plan at a time, as the manifest reaches it); the ownership record
              drops the files left empty; removals.txt gets one line per removed document
              (once per run id); dataset_stats.json and the README.md card are rewritten from
              the new counts; dataset_stats.txt is written, the commit point; the journal
              (with any partial rewrite, which lives there, never beside a shard) is deleted

A bucketed re-run into a tree with a pending journal keeps the journal's documents out and
writes its audit lines when it publishes (transforms/bucketed/format.py): a request is never dropped.

A run that finds a journal resumes it before anything else.

One module a concern, each importing only those above it in this list:

    lists.py     removal lists and the audit log's format, read strictly; a --removal-list's sources
    idmatch.py   a list of any length matched against the manifest and the log in bounded memory
    journal.py   the plan made, journalled, read back and checked before any byte changes
    audit.py     removals.txt checked, counted and appended to
    rewrite.py   one shard file rewritten; the removal finished
    sources.py   the removal requests a bucketed run honours (its lists, removals.txt, a journal)

Its Beam steps (DropRemoved, RemoveDocuments) are transforms/removal.py; its command is
pipelines/remove.py.
"""
