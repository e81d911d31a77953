# Worker image: Beam's Python SDK image with this package and its dependencies preinstalled.
#  - Dataflow (optional): --sdk_container_image, so hundreds of workers do not each pip-install the
#    package from PyPI at start-up (WORKER_IMAGE=... deploy/dataflow/launch.sh direct).
#  - Flink and Spark clusters: the Python worker pool beside each task manager / Spark worker,
#    started with `--worker_pool` (deploy/flink/README.md, deploy/spark/README.md).
# Build from the repository root:
#   docker build -f deploy/worker.Dockerfile -t "$WORKER_IMAGE" . && docker push "$WORKER_IMAGE"
# The base image's tag must be the apache-beam version pyproject.toml pins, and its Python the
# Python that launches the jobs.
FROM apache/beam_python3.11_sdk:2.77.0

WORKDIR /pretokenize
COPY pyproject.toml setup.py README.md LICENSE ./
COPY pipelines pipelines
COPY transforms transforms
COPY shards shards
RUN pip install --no-cache-dir '.[gcp,aws]'
