"""pipelines/engines.py without an engine: the flags ``--runner=FlinkRunner`` or
``--runner=SparkRunner`` alone stands for (a flag the user gives wins), the one line saying what
was chosen, and the filter of the Java job server's end-of-job hang-up, which drops that one error
and nothing else."""

from __future__ import annotations

import logging
import tempfile
import threading
from concurrent import futures

import grpc
import pytest

from pipelines import bucketed, engines
from transforms.core.records import UsageError


@pytest.fixture
def assembled(tmp_path, monkeypatch):
    """An ENGINES_DIR where `make engines` has written both launchers and the loopback ``java``."""
    monkeypatch.setenv("ENGINES_DIR", str(tmp_path))
    for engine in ("flink", "spark"):
        jar = engines.job_server_jar(engine)
        jar.parent.mkdir(parents=True)
        jar.write_bytes(b"PK")
    engines.loopback_java().write_text("#!/bin/sh\n")
    engines.loopback_java().with_name("loopback_bind.so").write_bytes(b"ELF")
    return tmp_path


def test_flink_runner_alone_gets_the_assembled_job_server_an_embedded_flink_and_loopback(assembled, caplog):
    caplog.set_level(logging.INFO, logger="pipelines")
    added = engines.engine_flags("FlinkRunner", {"runner"})
    jar = assembled / "flink-2.70.0" / "job-server.jar"
    java = assembled / "java-loopback"
    assert added == ["--flink_version=1.19", "--flink_master=[local]", "--environment_type=LOOPBACK",
                     f"--flink_job_server_jar={jar}", f"--job_server_java_launcher={java}"]
    (line,) = [r.getMessage() for r in caplog.records if r.name == "pipelines"]
    assert line == (f"--runner=FlinkRunner: embedded Flink 1.19, every port bound to 127.0.0.1; added "
                    f"--flink_version=1.19 --flink_master=[local] --environment_type=LOOPBACK "
                    f"--flink_job_server_jar={jar} --job_server_java_launcher={java} (any flag you give wins)")


@pytest.mark.parametrize("missing", ["java-loopback", "loopback_bind.so"])
def test_without_the_loopback_java_the_line_says_the_fn_api_ports_listen_everywhere(assembled, caplog, missing):
    caplog.set_level(logging.INFO, logger="pipelines")
    (assembled / missing).unlink()
    added = engines.engine_flags("FlinkRunner", {"runner"})
    assert not [a for a in added if a.startswith("--job_server_java_launcher")]
    (line,) = [r.getMessage() for r in caplog.records if r.name == "pipelines"]
    assert "its Fn API ports on every interface" in line and "C compiler" in line


def test_a_launcher_the_user_gives_wins_and_none_with_a_job_endpoint(assembled):
    assert not [a for a in engines.engine_flags("FlinkRunner", {"runner", "job_server_java_launcher"})
                if a.startswith("--job_server_java_launcher")]
    assert not [a for a in engines.engine_flags("FlinkRunner", {"runner", "job_endpoint"})
                if a.startswith("--job_server_java_launcher")]


def test_spark_runner_alone_gets_local_2_and_the_jvm_properties_that_bind_it_here(assembled):
    added = engines.engine_flags("SparkRunner", {"runner"})
    assert added[:4] == ["--spark_master_url=local[2]", "--environment_type=LOOPBACK",
                         f"--spark_job_server_jar={assembled / 'spark-2.70.0' / 'job-server.jar'}",
                         f"--job_server_java_launcher={assembled / 'java-loopback'}"]
    properties = [a.split("=", 1)[1] for a in added[4:]]
    assert all(a.startswith("--job_server_jvm_property=") for a in added[4:])
    assert "-Dspark.driver.bindAddress=127.0.0.1" in properties
    assert "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED" in properties


def test_a_flag_the_user_gives_wins(assembled):
    """Through the job's own parser: the user's master, environment and JVM property stand; only
    what is missing is added, and the user's JVM property comes last (the JVM takes the last)."""
    _, options = bucketed.parse_args([
        "--input", "tests/data/finepdfs_sample.parquet", "--output", "out", "--runner=SparkRunner",
        "--spark_master_url=spark://127.0.0.1:7077", "--environment_type=EXTERNAL",
        "--environment_config=127.0.0.1:50000", "--job_server_jvm_property=-Dspark.ui.enabled=true"])
    got = options.get_all_options()
    assert got["spark_master_url"] == "spark://127.0.0.1:7077"
    assert got["environment_type"] == "EXTERNAL"
    assert got["spark_job_server_jar"] == str(assembled / "spark-2.70.0" / "job-server.jar")
    assert got["job_server_jvm_properties"][-1] == "-Dspark.ui.enabled=true"


def test_a_job_endpoint_needs_no_assembled_job_server(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINES_DIR", str(tmp_path))
    assert engines.engine_flags("FlinkRunner", {"runner", "job_endpoint", "flink_master", "environment_type"}) == [
        "--flink_version=1.19"]


def test_without_make_engines_the_runner_is_refused_saying_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINES_DIR", str(tmp_path))
    with pytest.raises(UsageError, match=r"--runner=FlinkRunner: no Flink job server at .*flink-2.70.0/job-server.jar; "
                                         r"run `make engines`"):
        engines.engine_flags("FlinkRunner", {"runner"})


@pytest.mark.parametrize("runner", [None, "FnApiRunner", "PrismRunner", "DataflowRunner"])
def test_other_runners_get_nothing(runner, tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINES_DIR", str(tmp_path))
    assert engines.engine_flags(runner, {"runner"}) == []


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.RpcError:
    """A real gRPC error: a call to a server on 127.0.0.1 that ends it with ``code`` and ``details``."""
    def abort(_request, context):
        context.abort(code, details)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    handler = grpc.unary_unary_rpc_method_handler(abort)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t", {"m": handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            channel.unary_unary("/t/m")(b"", timeout=30)
    except grpc.RpcError as e:
        return e
    finally:
        server.stop(None)
    raise AssertionError("the call did not fail")


@pytest.fixture(scope="module")
def hangup():
    return rpc_error(grpc.StatusCode.CANCELLED, "Multiplexer hanging up")


@pytest.fixture(scope="module")
def other_errors():
    return [rpc_error(grpc.StatusCode.CANCELLED, "Cancelled by the user"),
            rpc_error(grpc.StatusCode.UNAVAILABLE, "Multiplexer hanging up"), ValueError("a worker failed")]


def test_only_the_hangup_is_recognized(hangup, other_errors):
    assert engines.is_end_of_job_hangup(hangup)
    wrapped = RuntimeError("re-raised by close()")
    wrapped.__cause__ = hangup
    assert engines.is_end_of_job_hangup(wrapped)
    assert not any(engines.is_end_of_job_hangup(e) for e in other_errors)


def test_the_hangup_is_not_logged_and_other_errors_are(hangup, other_errors, caplog, monkeypatch):
    data_plane = logging.getLogger("apache_beam.runners.worker.data_plane")
    monkeypatch.setattr(data_plane, "filters", [])
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    engines.engine_flags("PortableRunner", {"runner"})  # a Java job server: the filter is put in place
    for error in [hangup, *other_errors]:
        try:
            raise error
        except Exception:
            data_plane.exception("Failed to read inputs in the data plane.")
    assert [r.exc_info[1] for r in caplog.records if r.name == data_plane.name] == other_errors


def test_a_thread_ending_on_the_hangup_prints_nothing_and_other_errors_print(hangup, other_errors, monkeypatch):
    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    monkeypatch.setattr(logging.getLogger("apache_beam.runners.worker.data_plane"), "filters", [])
    engines.engine_flags("FlinkRunner", {"runner", "job_endpoint"})
    for error in [hangup, *other_errors]:
        thread = threading.Thread(target=lambda e=error: (_ for _ in ()).throw(e), name="read_grpc_client_inputs")
        thread.start()
        thread.join()
    assert seen == other_errors


@pytest.mark.parametrize(("flags", "here"), [
    (["--runner=FnApiRunner"], True),
    (["--runner=FlinkRunner", "--environment_type=LOOPBACK"], True),  # what FlinkRunner alone gets
    (["--runner=SparkRunner", "--environment_type=EXTERNAL", "--environment_config=127.0.0.1:50000"], False),
    (["--runner=DataflowRunner"], False),
])
def test_verify_reports_to_this_machine_only_when_its_workers_run_here(flags, here):
    """A LOOPBACK harness runs in the launching process: verify's report may go to its temporary
    directory; workers elsewhere could not write it, and verify asks for --report instead."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines import verify_graph

    options = PipelineOptions(flags)
    if here:
        url, scratch = verify_graph._report_url(None, options)
        assert scratch.startswith(tempfile.gettempdir()) and url.endswith("report.json")
    else:
        with pytest.raises(UsageError, match="its workers cannot write this machine's temporary directory"):
            verify_graph._report_url(None, options)


@pytest.mark.parametrize("runner", ["flink", "Flink", "flinkrunner", "FlinkRunner"])
def test_flink_named_as_beam_takes_it_gets_its_defaults(runner, tmp_path, monkeypatch):
    """Beam runs FlinkRunner for --runner=flink (any case, "Runner" or not): it gets Flink's defaults too."""
    monkeypatch.setenv("ENGINES_DIR", str(tmp_path))
    given = {"runner", "job_endpoint", "flink_master", "environment_type"}
    assert engines.engine_flags(runner, given) == ["--flink_version=1.19"]
