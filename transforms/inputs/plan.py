"""The input planned into units of work at launch, before Beam is imported (a job's bars and ETA
appear once it is planned: pipelines/job.py). Imports no Beam, and Arrow only for a parquet file
(transforms.inputs.registry imports a format when a file of its kind is planned).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from shards import storage
from transforms.core.records import BadInputError
from transforms.inputs.discover import expand_pattern
from transforms.inputs.fields import ReadConfig
from transforms.inputs.registry import format_for, unknown_type
from transforms.inputs.units import InputUnit


def plan_file(path: str, config: ReadConfig) -> list[InputUnit]:
    """The units of work of one input file, planned by its format."""
    fmt = format_for(path, config)
    if fmt is None:
        raise BadInputError(path, unknown_type())
    fs, fs_path = storage.filesystem(path)
    return fmt.plan(path, fs.info(fs_path), config)


def plan_input(config: ReadConfig, threads: int = 16) -> list[InputUnit]:
    """Expand the glob and check every file; the units of work, in a deterministic order. A store
    that cannot be reached (or refuses the credentials) is one storage.Unreachable naming the URL."""
    with storage.reaching(config.pattern):
        paths = expand_pattern(config.pattern)

    def plan(path: str) -> list[InputUnit]:
        with storage.reaching(path):
            return plan_file(path, config)

    with ThreadPoolExecutor(max_workers=min(threads, len(paths))) as pool:
        planned = list(pool.map(plan, paths))
    return [u for units in planned for u in units]
