"""Writes the thin launcher jar of an engine's job server: a manifest whose Class-Path lists the
jars of ``lib/`` beside it, and the compiled deploy/engines/HostBoundJobServer.java, its Main-Class,
which starts the driver the manifest names (Job-Server-Driver) with its servers bound to --job-host.

`make engines` runs it once the Maven closure is in ``DIR/lib`` and the class is compiled:

    python deploy/engine_launcher.py DIR/job-server.jar org.apache.beam.runners.flink.FlinkJobServerDriver DIR/classes

Beam's FlinkRunner and SparkRunner start a job server as ``java -jar JAR ...``; this jar lets them
start the closure `make engines` assembled (``java -cp JAR DRIVER`` starts the driver itself). The
jar is written beside its final name and renamed into place, so a launcher that exists is complete.
Standard library only: it runs before any virtualenv exists.
"""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path
from urllib.parse import quote

MANIFEST_WIDTH = 72  # the jar format's limit on a manifest line, in bytes, newline excluded
MAIN_CLASS = "beam_pretokenize.engines.HostBoundJobServer"
DRIVER_ATTRIBUTE = "Job-Server-Driver"  # HostBoundJobServer.DRIVER_ATTRIBUTE
FLINK_CONF_ATTRIBUTE = "Flink-Conf-Dir"  # HostBoundJobServer.FLINK_CONF_ATTRIBUTE
FLINK_CONF = "conf"  # the directory beside the launcher that holds flink-conf.yaml, when it exists


def manifest(driver: str, jars: list[str], flink_conf: bool = False) -> str:
    """The manifest text: Main-Class, the ``driver`` it starts, the Flink configuration directory
    beside it (``flink_conf``), and a Class-Path of ``jars`` (paths relative to the jar), folded into
    continuation lines (a space, then at most 71 more bytes) as the format requires."""
    class_path = " ".join(quote(jar) for jar in jars)
    lines = ["Manifest-Version: 1.0", f"Main-Class: {MAIN_CLASS}", f"{DRIVER_ATTRIBUTE}: {driver}",
             "Created-By: beam-pretokenize"]
    if flink_conf:
        lines.append(f"{FLINK_CONF_ATTRIBUTE}: {FLINK_CONF}")
    lines += _folded(f"Class-Path: {class_path}")
    return "\r\n".join(lines) + "\r\n\r\n"


def _folded(line: str) -> list[str]:
    data = line.encode("ascii")  # quote() leaves only ASCII
    out = [data[:MANIFEST_WIDTH]]
    rest = data[MANIFEST_WIDTH:]
    while rest:
        out.append(b" " + rest[: MANIFEST_WIDTH - 1])
        rest = rest[MANIFEST_WIDTH - 1:]
    return [chunk.decode("ascii") for chunk in out]


def write_launcher(jar: Path, driver: str, classes: Path) -> int:
    """Write ``jar``: the manifest naming every ``*.jar`` in ``lib/`` beside it, and the compiled
    HostBoundJobServer classes found under ``classes``; returns how many jars it names. A ``conf/``
    beside it (embedded Flink's configuration) is named in the manifest."""
    lib = jar.parent / "lib"
    jars = sorted(f"lib/{p.name}" for p in lib.glob("*.jar") if p.is_file() and not p.is_symlink())
    compiled = sorted(p for p in classes.rglob("*.class") if p.is_file() and not p.is_symlink())
    if not jars or not compiled:
        raise SystemExit(f"{jar}: no jars in {lib} or no compiled classes in {classes}")
    partial = jar.with_name(jar.name + ".partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("META-INF/MANIFEST.MF", manifest(driver, jars, (jar.parent / FLINK_CONF).is_dir()))
        for path in compiled:
            z.write(path, path.relative_to(classes).as_posix())
    os.replace(partial, jar)
    return len(jars)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    jar, driver, classes = Path(argv[0]), argv[1], Path(argv[2])
    print(f"{jar}: launcher of {driver}, {write_launcher(jar, driver, classes)} jars in lib/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
