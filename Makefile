# Everything a newcomer runs goes through here. The virtualenv lives in .venv/.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
OUT    ?= out/sample

.PHONY: help venv demo demo-scaffold test test-clusters test-fast lint bench bench-compare clean venv-cloud venv-torch venv-trainers engines prism flink-job-server spark-job-server loopback-shim FORCE

help:
	@echo "make demo   set up .venv and run the bucketed job on the bundled sample into $(OUT)"
	@echo "make demo-scaffold  the scaffold job on the Portuguese sample into $(SCAFFOLD_OUT)"
	@echo "make test   set up .venv and run the test suite"
	@echo "make test-clusters  the Flink and Spark cluster tests (separate processes, a member killed), ~15-45 minutes"
	@echo "make test-fast  the unit tests and a few end-to-end ones (-m 'unit or smoke'), a few minutes"
	@echo "make lint   ruff over the code"
	@echo "make bench  the performance benchmark (tests/bench/README.md): rewrites its sections of BENCHMARKS.md, ~40 minutes"
	@echo "make bench-compare  this checkout against BENCH_AGAINST (default 4798ec5) in one sitting, as ratios"
	@echo "make venv-cloud  add the gcp and aws extras to .venv (Dataflow dry run, gs:// and s3://)"
	@echo "make venv-torch  add torch and torchdata to .venv (WindowDataset, StatefulDataLoader; about 5 GB)"
	@echo "make venv-trainers  add megatron-core and OLMo-core to .venv (and torch): docs/training.md runs"
	@echo "make engines     fetch Prism, and Flink 1.19 and Spark 3.5 job servers (--runner=FlinkRunner / SparkRunner, tests/engines; cached)"

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.installed

# What the demos need, and no more: the package and its own dependencies, no test extras.
$(VENV)/.installed-demo: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $@

# The test extras plus gcp: what tests/engines needs beyond `make test`'s install.
$(VENV)/.installed-cloud: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test,gcp,aws]'
	touch $@

venv-cloud: $(VENV)/.installed-cloud

# The torch extra (torch and torchdata: about 5 GB with the CUDA libraries PyPI's torch wheel needs),
# for the WindowDataset and StatefulDataLoader tests; without it they skip, saying so.
$(VENV)/.installed-torch: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test,torch]'
	touch $@

venv-torch: $(VENV)/.installed-torch

# The trainers extra (pyproject.toml): megatron-core and OLMo-core for tests/e2e/test_megatron.py and
# tests/shards/test_trainers.py, which read the shards with each trainer's own dataset class. --no-deps, so
# that OLMo-core's torch<2.14 and cached-path's pins never move the torch the torch extra installed.
TRAINERS := megatron-core==0.16.1 ai2-olmo-core==3.0.0 cached-path==1.8.10 dataclass-extensions==0.5.0 \
            bettermap==1.3.1 dill==0.4.1 accelerate==1.15.0 psutil
# What OLMo-core's data modules import when they load, beyond the test extras: cached-path's gs:// and
# s3:// clients (google.cloud.storage, google.api_core, boto3). With their dependencies, none of which
# pins torch; so `make venv-trainers` alone, without venv-cloud, makes docs/training.md run.
TRAINER_RUNTIME := google-cloud-storage>=2 boto3
$(VENV)/.installed-trainers: $(VENV)/.installed-torch
	$(PY) -m pip install --quiet --no-deps $(TRAINERS)
	$(PY) -m pip install --quiet $(foreach r,$(TRAINER_RUNTIME),'$(r)')
	touch $@

venv-trainers: $(VENV)/.installed-trainers

# The test extras plus bench (datatrove, py-spy, pyinstrument, psutil).
$(VENV)/.installed-bench: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $@

# Engines for tests/engines and for `--runner=FlinkRunner` / `--runner=SparkRunner`
# (pipelines/engines.py): Prism built from the Go module proxy at the Beam version pyproject.toml
# pins; Flink 1.19 and Spark 3.5 job servers assembled from Maven Central with the poms in
# deploy/flink and deploy/spark (Beam's runners at 2.70.0, the newest served, with one substituted
# module that the poms name): each runtime closure is copied into $(ENGINES_DIR)/<engine>-2.70.0/lib
# and a thin launcher jar beside it (deploy/engine_launcher.py) lets Beam start it with `java -jar`.
# All of it lives outside the checkout and is fetched only when missing (Maven's own cache is ~/.m2).
# A fetch that fails is reported and logged in $(ENGINES_DIR), and that engine's tests skip quoting
# the log; PRETOKENIZE_REQUIRE_ENGINES (see .ci/run) turns such a skip into a failure.
# pipelines/engines.py and tests/engines/engine_setup.py compute the same paths: change them together.
BEAM_VERSION   := $(shell sed -n 's/^ *"apache-beam==\([0-9][0-9.]*\)",$$/\1/p' pyproject.toml)
RUNNER_VERSION := $(shell sed -n 's:.*<beam.runner.version>\(.*\)</beam.runner.version>.*:\1:p' deploy/flink/pom.xml)
ENGINES_DIR    ?= $(HOME)/.cache/beam-pretokenize
PRISM_BIN      := $(ENGINES_DIR)/prism-v$(BEAM_VERSION)/prism
FLINK_JAR      := $(ENGINES_DIR)/flink-$(RUNNER_VERSION)/job-server.jar
SPARK_JAR      := $(ENGINES_DIR)/spark-$(RUNNER_VERSION)/job-server.jar
FLINK_LIB      := $(ENGINES_DIR)/flink-$(RUNNER_VERSION)/lib
SPARK_LIB      := $(ENGINES_DIR)/spark-$(RUNNER_VERSION)/lib
FLINK_DRIVER   := org.apache.beam.runners.flink.FlinkJobServerDriver
SPARK_DRIVER   := org.apache.beam.runners.spark.SparkJobServerDriver
LAUNCHER_SOURCE := deploy/engines/HostBoundJobServer.java
MVN_CLOSURE    := mvn -B org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies -DincludeScope=runtime

LOOPBACK_JAVA  := $(ENGINES_DIR)/java-loopback
LOOPBACK_SO    := $(ENGINES_DIR)/loopback_bind.so

# What is built from the checkout's files is rebuilt when their content changes, not their mtime: a
# fresh clone's files are all newer than the cache, and comparing mtimes re-copied the closure (and
# recompiled the launcher and the shim) on every `make engines` there. Each step depends on a stamp
# beside its output holding the sha256 of its inputs, which is checked on every run and rewritten
# only when a sum differs, so its mtime moves only with the content.
FLINK_POM_STAMP      := $(ENGINES_DIR)/flink-$(RUNNER_VERSION)/pom.sha256
SPARK_POM_STAMP      := $(ENGINES_DIR)/spark-$(RUNNER_VERSION)/pom.sha256
FLINK_LAUNCHER_STAMP := $(ENGINES_DIR)/flink-$(RUNNER_VERSION)/launcher.sha256
SPARK_LAUNCHER_STAMP := $(ENGINES_DIR)/spark-$(RUNNER_VERSION)/launcher.sha256
LOOPBACK_STAMP       := $(ENGINES_DIR)/loopback.sha256
LAUNCHER_INPUTS      := deploy/engine_launcher.py $(LAUNCHER_SOURCE)

$(FLINK_POM_STAMP): STAMPED = deploy/flink/pom.xml
$(SPARK_POM_STAMP): STAMPED = deploy/spark/pom.xml
$(FLINK_LAUNCHER_STAMP): STAMPED = $(LAUNCHER_INPUTS) deploy/flink/embedded-flink-conf.yaml
$(SPARK_LAUNCHER_STAMP): STAMPED = $(LAUNCHER_INPUTS)
$(LOOPBACK_STAMP): STAMPED = deploy/loopback_bind.c deploy/loopback_shim.py
$(FLINK_POM_STAMP) $(SPARK_POM_STAMP) $(FLINK_LAUNCHER_STAMP) $(SPARK_LAUNCHER_STAMP) $(LOOPBACK_STAMP): FORCE
	@mkdir -p $(dir $@) && sha256sum $(STAMPED) > $@.new \
	  && if cmp -s $@.new $@; then rm -f $@.new; else mv $@.new $@; fi
FORCE:

engines: prism flink-job-server spark-job-server loopback-shim

prism: $(PRISM_BIN)
flink-job-server: $(FLINK_JAR)
spark-job-server: $(SPARK_JAR)
loopback-shim: $(LOOPBACK_JAVA) $(LOOPBACK_SO)

# deploy/loopback_bind.c built into $(ENGINES_DIR)/loopback_bind.so and a `java` that preloads it
# (java-loopback), which pipelines/engines.py hands Beam for the job servers above: the Fn API
# servers Beam opens while a job runs then listen on 127.0.0.1 only. Without a C compiler it says so
# and writes nothing (those ports then listen on every interface).
$(LOOPBACK_JAVA) $(LOOPBACK_SO): $(LOOPBACK_STAMP)
	@$(PYTHON) deploy/loopback_shim.py $(ENGINES_DIR)

$(PRISM_BIN):
	@mkdir -p $(dir $@)
	@echo "prism: go install github.com/apache/beam/sdks/v2/go/cmd/prism@v$(BEAM_VERSION)"
	@GOBIN=$(dir $@) go install github.com/apache/beam/sdks/v2/go/cmd/prism@v$(BEAM_VERSION) \
	    > $(ENGINES_DIR)/prism.log 2>&1 \
	  && echo "prism: $@" \
	  || echo "prism: NOT SET UP, see $(ENGINES_DIR)/prism.log; its tests will be skipped"

# The closure goes to lib.partial and is renamed to lib/ once complete (so lib/ exists only whole; a
# failed copy also removes the launcher, which would name jars no longer there);
# then javac compiles the launcher's main class (deploy/engines/HostBoundJobServer.java: the job
# server's ports bound to --job-host only) and the launcher jar is written last, so an interrupted
# fetch leaves no launcher and the next `make engines` finishes it. A failed step says so, quoting
# its log, and the other engines are still set up.
$(FLINK_JAR) $(FLINK_LIB): ENGINE = flink
$(FLINK_JAR): DRIVER = $(FLINK_DRIVER)
$(SPARK_JAR) $(SPARK_LIB): ENGINE = spark
$(SPARK_JAR): DRIVER = $(SPARK_DRIVER)
$(FLINK_LIB): $(FLINK_POM_STAMP)
$(SPARK_LIB): $(SPARK_POM_STAMP)
$(FLINK_LIB) $(SPARK_LIB):
	@mkdir -p $(dir $@)
	@echo "$(ENGINE): mvn copy-dependencies of deploy/$(ENGINE)/pom.xml into $@"
	@rm -rf $@.partial $@ \
	  && $(MVN_CLOSURE) -f deploy/$(ENGINE)/pom.xml -DoutputDirectory=$@.partial > $(ENGINES_DIR)/$(ENGINE).log 2>&1 \
	  && mv $@.partial $@ \
	  || { rm -f $(dir $@)job-server.jar; \
	       echo "$(ENGINE): NOT SET UP, see $(ENGINES_DIR)/$(ENGINE).log; its tests will be skipped"; }
$(FLINK_JAR): FLINK_CONF = deploy/flink/embedded-flink-conf.yaml
$(FLINK_JAR): $(FLINK_LIB) $(FLINK_LAUNCHER_STAMP)
$(SPARK_JAR): $(SPARK_LIB) $(SPARK_LAUNCHER_STAMP)
$(FLINK_JAR) $(SPARK_JAR):
	@test -d $(dir $@)lib || exit 0; \
	rm -rf $(dir $@)classes $(dir $@)conf \
	  && { test -z "$(FLINK_CONF)" || { mkdir $(dir $@)conf && cp $(FLINK_CONF) $(dir $@)conf/flink-conf.yaml; }; } \
	  && javac --release 17 -nowarn -cp '$(dir $@)lib/*' -d $(dir $@)classes $(LAUNCHER_SOURCE) \
	       >> $(ENGINES_DIR)/$(ENGINE).log 2>&1 \
	  && $(PYTHON) deploy/engine_launcher.py $@ $(DRIVER) $(dir $@)classes >> $(ENGINES_DIR)/$(ENGINE).log 2>&1 \
	  && echo "$(ENGINE): $@" \
	  || echo "$(ENGINE): NOT SET UP, see $(ENGINES_DIR)/$(ENGINE).log; its tests will be skipped"

demo: $(VENV)/.installed-demo
	$(VENV)/bin/pretokenize bucketed --input tests/data/finepdfs_sample.parquet --output $(OUT) --runner=FnApiRunner

# GPT-2: the ranks shipped in the package (transforms/tokenizers/data/gpt2.tiktoken), so the demo runs offline.
GPT2_TOKENIZER ?= gpt2
SCAFFOLD_OUT   ?= out/scaffold-sample

demo-scaffold: $(VENV)/.installed-demo
	$(VENV)/bin/pretokenize scaffold --input tests/data/scaffold/por_annotated.jsonl --output $(SCAFFOLD_OUT) \
	    --tokenizer $(GPT2_TOKENIZER) --shard-tokens 4000 --runner=FnApiRunner
	$(VENV)/bin/pretokenize decode $(SCAFFOLD_OUT)/val --docs 2 --markers --tokenizer $(GPT2_TOKENIZER)

# The whole suite: everything but the engines on two worker processes (pytest-xdist, a module to a
# worker so that its fixtures are built once), then the engines' tests in one process (Beam shares
# one Prism job server per process, and the engines' order is the one they were written for).
test: venv
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not engines"
	$(PY) -m pytest -q -m "engines and not cluster"

# The clusters of separate processes (tests/engines/test_cluster.py: each job byte-identical on a Flink
# session cluster and a Spark standalone cluster, a TaskManager / worker killed mid-job, every socket on
# 127.0.0.1). Not in `make test`: they start six JVMs and took 13 to 46 minutes on this 2-core machine
# under load (BENCHMARKS.md, "Engines: clusters"), more than CI's budget. Needs `make engines`.
test-clusters: venv
	$(PY) -m pytest -q -m cluster

# The unit tests and the end-to-end tests marked smoke (the markers: pyproject.toml, tests/conftest.py),
# on two worker processes (pytest-xdist), a module to a worker so that its fixtures are built once.
test-fast: venv
	$(PY) -m pytest -q -n 2 --dist loadfile -m "unit or smoke"

lint: venv
	$(VENV)/bin/ruff check .

# Builds its corpus once under ~/.cache/beam-pretokenize/bench (BENCH_ARGS, e.g. --cache DIR, go to the script).
# Then the same sitting's comparison with an earlier commit (BENCH_AGAINST; COMPARE_ARGS, e.g.
# --corpus x4 --repeats 3, go to tests/bench/compare_bench.py): interleaved, best of N, as ratios.
BENCH_AGAINST ?= 4798ec5
bench: $(VENV)/.installed-bench
	$(PY) tests/bench/run_bench.py $(BENCH_ARGS)
	$(PY) tests/bench/compare_bench.py --against $(BENCH_AGAINST) $(COMPARE_ARGS)

bench-compare: $(VENV)/.installed-bench
	$(PY) tests/bench/compare_bench.py --against $(BENCH_AGAINST) $(COMPARE_ARGS)

clean:
	rm -rf $(VENV) out .pytest_cache
