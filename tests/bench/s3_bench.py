"""The bucketed job against S3 (issue 26): requests by stage per kept document, and the cost of latency.

    .venv/bin/python tests/bench/s3_bench.py                       # 100k short documents and the sample
    .venv/bin/python tests/bench/s3_bench.py --short 20000 --repeats 1

moto's S3 server on 127.0.0.1 behind ``s3_proxy.CountingProxy``, which counts every request by what
it touches (spill tokens and references: the write path; unit markers, staged shards, the input, the
tree's own files) and can add a fixed latency to each. Input and output are on S3, as on Dataflow
with GCS, and the job runs in this process on the FnApiRunner (the counts do not depend on the
runner; a request the job makes is a request whoever makes it).

Prints, for each input: a table of requests by kind and method, per kept document; the write path's
GETs per kept document; the total per kept document. Then the sample's wall time with 0 and
``--latency-ms`` added to every request (best of ``--repeats``), and their ratio. Request counts
are exact; times depend on the machine's load (the load average is printed with them).
"""

from __future__ import annotations

import argparse
import collections
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "bench"))

import scale_corpus  # noqa: E402
from s3_proxy import CountingProxy  # noqa: E402

SAMPLE = REPO / "tests" / "data" / "finepdfs_sample.parquet"
WRITE_PATH = ("spill tokens", "spill refs")
METHODS = ("GET", "PUT", "POST", "HEAD", "LIST", "COPY", "DELETE")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen, str]:
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
            return server, endpoint
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(f"moto's S3 server did not start on {endpoint}") from None
            time.sleep(0.2)


def point_s3_at(endpoint: str) -> None:
    import fsspec
    import s3fs

    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                       "FSSPEC_S3_ENDPOINT_URL": endpoint})
    fsspec.config.conf["s3"] = {"endpoint_url": endpoint}
    s3fs.S3FileSystem.clear_instance_cache()


def run_job(input_url: str, output_url: str, flags: list[str]):
    from pipelines import bucketed

    return bucketed.run(["--input", input_url, "--output", output_url, "--runner=FnApiRunner", *flags])


def table(counts: collections.Counter, kept: int) -> list[str]:
    kinds = sorted({k for k, _ in counts})
    lines = ["| what | " + " | ".join(METHODS) + " | all | per kept document |",
             "|---|" + "---:|" * (len(METHODS) + 2)]
    for kind in kinds:
        row = [counts.get((kind, m), 0) for m in METHODS]
        lines.append(f"| {kind} | " + " | ".join(f"{n:,}" for n in row) + f" | {sum(row):,} | {sum(row) / kept:.4f} |")
    total = sum(counts.values())
    lines.append("| **total** | " + " | ".join(f"{sum(counts.get((k, m), 0) for k in kinds):,}" for m in METHODS)
                 + f" | {total:,} | {total / kept:.4f} |")
    return lines


def measure(proxy: CountingProxy, fs, bucket: str, name: str, files: list[Path], flags: list[str]) -> dict:
    for f in files:
        fs.put(str(f), f"{bucket}/{name}/in/{f.name}")
    proxy.reset()
    out = f"s3://{bucket}/{name}/out-{uuid.uuid4().hex[:6]}"
    start = time.perf_counter()
    stats = run_job(f"s3://{bucket}/{name}/in/*.parquet", out, flags)
    seconds = time.perf_counter() - start
    counts = proxy.counts()
    peaks = proxy.peaks()
    kept = stats.kept_documents
    write_gets = sum(counts.get((k, "GET"), 0) for k in WRITE_PATH)
    return {"name": name, "kept": kept, "counts": counts, "seconds": seconds, "write_gets": write_gets,
            "total": sum(counts.values()), "peaks": peaks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=100_000, help="short documents of the scale corpus")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of the sample at each latency")
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "pretokenize-bench"))
    args = parser.parse_args(argv)

    server, moto = start_moto()
    proxy = CountingProxy(moto)
    proxy.start()
    try:
        point_s3_at(proxy.url)
        import fsspec

        fs = fsspec.filesystem("s3")
        bucket = f"bench-{uuid.uuid4().hex[:10]}"
        fs.mkdir(bucket)
        results = []
        if args.short:
            data, _ = scale_corpus.ensure(Path(args.cache), args.short)
            results.append(measure(proxy, fs, bucket, "short", sorted(data.glob("*.parquet")), []))
        results.append(measure(proxy, fs, bucket, "sample", [SAMPLE], []))
        for r in results:
            print(f"\n### {r['name']}: {r['kept']:,} documents kept, {r['total']:,} requests\n")
            print("\n".join(table(r["counts"], r["kept"])))
            print(f"\nwrite path: {r['write_gets']:,} GETs, {r['write_gets'] / r['kept']:.4f} a kept document; "
                  f"total {r['total'] / r['kept']:.4f} a kept document")
            print("most in flight at once: " + ", ".join(f"{m} {n}" for m, n in sorted(r["peaks"].items())))
        times = {}
        for latency in (0.0, args.latency_ms / 1000):
            proxy.latency = latency
            best = min(measure(proxy, fs, bucket, f"sample-{int(latency * 1000)}ms-{k}", [SAMPLE], [])["seconds"]
                       for k in range(args.repeats))
            times[latency] = best
            print(f"sample with {latency * 1000:.0f} ms added to each request: {best:.2f} s "
                  f"(best of {args.repeats}; load average {os.getloadavg()[0]:.2f})")
        ratio = times[args.latency_ms / 1000] / times[0.0]
        print(f"ratio: {ratio:.2f}x")
    finally:
        proxy.stop()
        server.terminate()
        server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
