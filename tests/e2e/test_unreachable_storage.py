"""A store that cannot be reached, or that refuses the credentials, is one line naming the URL and
exit 2, for hf://, s3:// and gs:// alike (it used to be 64-101 lines of the client's traceback).

Each case runs the console script in a fresh process, as a user would, with the client pointed at
an endpoint on this machine: a closed port (the connection fails), or a server that answers every
request with 401 or 403 (the credentials are refused). gs:// with a credentials file that cannot be
refreshed needs Google's token endpoint: without a network it is a connection failure, with one a
refusal; either way one line.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading

import pytest
from conftest import REPO

from shards import storage

DENIED_JSON = b'{"error": {"code": 403, "message": "caller does not have storage.objects.list access"}}'
DENIED_XML = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidAccessKeyId</Code>'
              b"<Message>The AWS Access Key Id you provided does not exist in our records.</Message></Error>")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def refusing_server():
    """A local endpoint that answers every request with ``status`` and ``body``: (port, set(status, body))."""
    answer = {"status": 403, "body": DENIED_JSON, "type": "application/json"}

    class Refuse(http.server.BaseHTTPRequestHandler):
        def _refuse(self):
            self.send_response(answer["status"])
            self.send_header("Content-Type", answer["type"])
            self.send_header("Content-Length", str(len(answer["body"])))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(answer["body"])

        do_GET = do_HEAD = do_POST = do_PUT = _refuse

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], answer
    server.shutdown()
    server.server_close()


def run_cli_process(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("AWS_", "FSSPEC_", "HF_", "GOOGLE_", "STORAGE_EMULATOR"))}
    clean.update(PYTHONPATH=str(REPO), HF_HUB_DISABLE_TELEMETRY="1", **env)
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], env=clean, capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def s3_env(port: int) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "FSSPEC_S3": f'{{"endpoint_url": "http://127.0.0.1:{port}"}}'}


def scaffold_input(url: str, tmp_path) -> list[str]:
    # The scaffold job loads no tokenizer before it plans the input: nothing else is logged first.
    return ["scaffold", "--annotate", "--input", url, "--output", str(tmp_path / "out")]


def assert_one_line(result: subprocess.CompletedProcess, url: str, problem: str, tmp_path) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"pretokenize scaffold: cannot reach {url}: {problem}"), lines[0]
    assert lines[0].endswith("; nothing was published")
    assert not (tmp_path / "out").exists()


def test_s3_endpoint_on_a_closed_port(tmp_path):
    url = "s3://corpus/docs/*.jsonl"
    result = run_cli_process(scaffold_input(url, tmp_path), s3_env(closed_port()))
    assert_one_line(result, url, "connection failed: Could not connect to the endpoint URL", tmp_path)


def test_hf_endpoint_on_a_closed_port(tmp_path):
    url = "hf://datasets/someone/corpus/data/train.jsonl"
    result = run_cli_process(scaffold_input(url, tmp_path), {"HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}"})
    assert_one_line(result, url, "connection failed: ", tmp_path)


def needs_gcsfs() -> None:
    """gs:// needs the gcp extra (gcsfs), which `make test` does not install; .ci/run does."""
    try:
        import gcsfs  # noqa: F401
    except ImportError as e:
        pytest.skip(f"the gcp extra is not installed (make venv-cloud): {e}")


def test_gs_with_credentials_that_cannot_be_refreshed(tmp_path):
    needs_gcsfs()
    creds = tmp_path / "creds.json"
    creds.write_text('{"type": "authorized_user", "client_id": "x", "client_secret": "y", "refresh_token": "z"}')
    url = "gs://corpus/docs/train.jsonl"
    result = run_cli_process(scaffold_input(url, tmp_path), {"FSSPEC_GCS_TOKEN": str(creds)})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"pretokenize scaffold: cannot reach {url}: "), lines[0]
    assert "connection failed: " in lines[0] or "access refused" in lines[0]


@pytest.mark.parametrize("protocol", ["s3", "gs", "hf"])
def test_refused_credentials(tmp_path, refusing_server, protocol):
    if protocol == "gs":
        needs_gcsfs()
    port, answer = refusing_server
    url, env, detail = {
        "s3": ("s3://corpus/docs/train.jsonl", s3_env(port), "The AWS Access Key Id you provided does not exist"),
        "gs": ("gs://corpus/docs/train.jsonl", {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"},
               "Forbidden: "),
        "hf": ("hf://datasets/someone/corpus/train.jsonl", {"HF_ENDPOINT": f"http://127.0.0.1:{port}"}, "401"),
    }[protocol]
    if protocol == "s3":
        answer.update(body=DENIED_XML, type="application/xml")
    if protocol == "hf":
        answer.update(status=401, body=b'{"error": "Invalid credentials in Authorization header"}')
    result = run_cli_process(scaffold_input(url, tmp_path), env)
    assert_one_line(result, url, "access refused (check the credentials): ", tmp_path)
    assert detail in result.stderr


def test_an_unreachable_output_is_one_line_too(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "uma palavra"}\n')
    url = "s3://corpus/out"
    result = run_cli_process(["scaffold", "--annotate", "--input", str(src), "--output", url], s3_env(closed_port()))
    assert result.returncode == 2, result.stderr
    # Besides the INFO line that says how the input was planned, the one line of the failure.
    said = [line for line in result.stderr.strip().splitlines() if " INFO " not in line]
    assert said == [said[0]] and said[0].startswith(f"pretokenize scaffold: cannot reach {url}: connection failed")


# --- which errors are a store out of reach --------------------------------------------------------

def test_only_connection_and_credentials_errors_become_unreachable():
    with pytest.raises(storage.Unreachable, match=r"^cannot reach s3://b/k: connection failed: \[Errno 111\] no"):
        with storage.reaching("s3://b/k"):
            raise ConnectionRefusedError(111, "no")
    with pytest.raises(storage.Unreachable, match="access refused"):
        with storage.reaching("s3://b/k"):
            raise PermissionError("Access Denied")
    # A missing file, or a local file's mode, is not a store out of reach: the error passes as it is.
    with pytest.raises(FileNotFoundError):
        with storage.reaching("s3://b/k"):
            raise FileNotFoundError("b/k")
    with pytest.raises(PermissionError):
        with storage.reaching("/data/k"):
            raise PermissionError(13, "Permission denied")


def test_a_hub_file_is_versioned_by_its_sha_not_its_size():
    """The version of a file as HfFileSystem's listing holds it (built by huggingface_hub's own code
    from the hub's API answer): an LFS file's content sha256, else the git blob id."""
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.hf_file_system import _cache_info_from_path_info

    sha = "a" * 64
    lfs = _cache_info_from_path_info(RepoFile(path="data/a.parquet", size=100, oid="1" * 40,
                                              lfs={"size": 100, "oid": sha, "pointerSize": 130}), "x/a.parquet")
    plain = _cache_info_from_path_info(RepoFile(path="data/b.jsonl", size=100, oid="2" * 40), "x/b.jsonl")
    assert storage.file_version(lfs) == f"sha256:{sha}"
    assert storage.file_version(plain) == f"blob_id:{'2' * 40}"
    same_size = _cache_info_from_path_info(RepoFile(path="data/b.jsonl", size=100, oid="3" * 40), "x/b.jsonl")
    assert storage.file_version(same_size) != storage.file_version(plain)
