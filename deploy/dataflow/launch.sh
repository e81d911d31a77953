#!/usr/bin/env bash
# A job on Dataflow: by default the bucketed job over the whole FinePDFs-Edu English corpus
# (sizing: SIZING.md).
#
#   deploy/dataflow/launch.sh direct           launch from this checkout (make venv-cloud: .venv/)
#   deploy/dataflow/launch.sh build-template   build the Flex Template image and its spec file
#   deploy/dataflow/launch.sh run-template     launch a job from that template
#
# Settings come from the environment; PROJECT and BUCKET have no default:
#   PROJECT=my-project BUCKET=my-bucket deploy/dataflow/launch.sh direct
# JOB=scaffold runs the scaffold job instead (INPUT and OUTPUT required). More job flags go in
# EXTRA_FLAGS for direct ('--long-docs chunk'), EXTRA_PARAMETERS for run-template ('long_docs=chunk').
# The input must already be on GCS (copy the parquet files of FinePDFs-Edu's eng_Latn
# configuration there first). The dataset card's licence and source: LICENSE and SOURCE_DATASET,
# FinePDFs-Edu's (odc-by, HuggingFaceFW/finepdfs-edu) when INPUT is the default, else none.
set -euo pipefail

case "${1:-}" in
  direct|build-template|run-template) ;;
  *) sed -n '2,15p' "$0"; exit 2 ;;
esac
: "${PROJECT:?set PROJECT to the GCP project id}"
: "${BUCKET:?set BUCKET to a GCS bucket name (no gs://) in REGION}"
REGION=${REGION:-us-central1}
JOB=${JOB:-bucketed}
case "$JOB" in
  bucketed|scaffold) ;;
  *) echo "JOB=$JOB: bucketed or scaffold" >&2; exit 2 ;;
esac
if [[ "$JOB" == bucketed ]]; then
  if [[ -z "${INPUT:-}" ]]; then
    # FinePDFs-Edu, whose card gives the licence (ODC-By v1.0) and the source; another INPUT says
    # its own, or its card says `license: unknown` and no source.
    INPUT=gs://$BUCKET/finepdfs-edu/eng_Latn/*.parquet
    LICENSE=${LICENSE-odc-by}
    SOURCE_DATASET=${SOURCE_DATASET-HuggingFaceFW/finepdfs-edu}
  fi
  OUTPUT=${OUTPUT:-gs://$BUCKET/pretokenized/finepdfs-edu-jet-nemotron}
fi
LICENSE=${LICENSE:-}
SOURCE_DATASET=${SOURCE_DATASET:-}
: "${INPUT:?set INPUT to the documents on GCS (a glob, file or directory)}"
: "${OUTPUT:?set OUTPUT to a gs:// directory}"
JOB_NAME=${JOB_NAME:-pretokenize-$JOB-$(date -u +%Y%m%d-%H%M%S)}
# Tokenizing is CPU-bound, one SDK process per vCPU; memory per process stays small (SIZING.md).
MACHINE_TYPE=${MACHINE_TYPE:-n2-standard-8}
NUM_WORKERS=${NUM_WORKERS:-4}     # SIZING.md: the first row (7.4 vCPU-hours on 32 vCPUs, about 14 minutes of processing at 50 % efficiency)
MAX_WORKERS=${MAX_WORKERS:-16}    # room for autoscaling if the real efficiency is lower
# The boot disk: the OS, the SDK image, the installs, and the write stage's scratch (at most 8 SDK
# processes x one group of the largest bucket); SIZING.md, "Disk", has the arithmetic.
DISK_GB=${DISK_GB:-250}
WORKER_IMAGE=${WORKER_IMAGE:-}        # optional: deploy/worker.Dockerfile, pushed to Artifact Registry
# The template image goes to an Artifact Registry Docker repository; build-template creates it
# when it is missing (Cloud Build cannot push to a repository that does not exist).
REPOSITORY=${REPOSITORY:-pretokenize}
TEMPLATE_IMAGE=${TEMPLATE_IMAGE:-$REGION-docker.pkg.dev/$PROJECT/$REPOSITORY/pretokenize-template:latest}
TEMPLATE_SPEC=${TEMPLATE_SPEC:-gs://$BUCKET/templates/pretokenize.json}

EXTRA_FLAGS=${EXTRA_FLAGS:-}
EXTRA_PARAMETERS=${EXTRA_PARAMETERS:-}
# The card's flags (direct) and parameters (run-template), for either job.
card_flags=() card_params=""
if [[ -n "$LICENSE" ]]; then
  card_flags+=(--license "$LICENSE") card_params+=",license=$LICENSE"
fi
if [[ -n "$SOURCE_DATASET" ]]; then
  card_flags+=(--source-dataset "$SOURCE_DATASET") card_params+=",source_dataset=$SOURCE_DATASET"
fi

cd "$(dirname "$0")/../.."

# Create the Artifact Registry repository TEMPLATE_IMAGE names (LOCATION-docker.pkg.dev/PROJECT/
# REPOSITORY/IMAGE) unless it exists; an image elsewhere (gcr.io, another registry) is left alone.
ensure_repository() {
  local pattern='^([a-z0-9-]+)-docker\.pkg\.dev/([^/]+)/([^/]+)/'
  if [[ ! "$TEMPLATE_IMAGE" =~ $pattern ]]; then
    return 0
  fi
  local location=${BASH_REMATCH[1]} project=${BASH_REMATCH[2]} repository=${BASH_REMATCH[3]}
  if gcloud artifacts repositories describe "$repository" \
       --project="$project" --location="$location" >/dev/null 2>&1; then
    return 0
  fi
  echo "creating Artifact Registry repository $repository in $location"
  gcloud artifacts repositories create "$repository" \
    --project="$project" --location="$location" --repository-format=docker \
    --description="pretokenize Flex Template images"
}

beam_flags=(
  --runner=DataflowRunner
  --project="$PROJECT"
  --region="$REGION"
  --temp_location="gs://$BUCKET/dataflow/tmp"
  --staging_location="gs://$BUCKET/dataflow/staging"
  --machine_type="$MACHINE_TYPE"
  --num_workers="$NUM_WORKERS"
  --max_num_workers="$MAX_WORKERS"
  --autoscaling_algorithm=THROUGHPUT_BASED
  --disk_size_gb="$DISK_GB"
)
if [[ -n "$WORKER_IMAGE" ]]; then
  beam_flags+=(--sdk_container_image="$WORKER_IMAGE")
fi

case "${1:-}" in
  direct)
    # --setup_file: the workers install this package from the sdist Beam builds of it, with its base
    # dependencies only (pip installs no extra of it); --requirements_file adds what the workers
    # need beyond those (gcsfs, for gs://), fetched by each worker from PyPI as it fetches the
    # package's dependencies (--requirements_cache=skip: the launcher downloads nothing to stage).
    # --no_save_main_session: the code is in the package, nothing is needed from __main__.
    # The command waits for the job and prints its summary, as it does on a laptop.
    if [[ "$JOB" == bucketed ]]; then
      job_flags=(--language eng_Latn --lid-threshold 0.90 --partitions 32 --max-shard-bytes 1.5e9)
    else
      job_flags=()
    fi
    # The tool: PRETOKENIZE if set, else `pretokenize` on PATH (an activated venv), else the
    # README's set-up, this checkout's .venv/bin/pretokenize (make venv-cloud adds the gcp extra).
    tool=${PRETOKENIZE:-}
    if [[ -z "$tool" ]]; then
      if command -v pretokenize >/dev/null 2>&1; then
        tool=pretokenize
      elif [[ -x .venv/bin/pretokenize ]]; then
        tool=.venv/bin/pretokenize
      else
        echo "launch.sh: no pretokenize: not on PATH and no $PWD/.venv/bin/pretokenize; run 'make venv-cloud'" \
             "(the README's .venv with the gcp extra), activate a venv with pip install -e '.[gcp]', or set" \
             "PRETOKENIZE to the tool" >&2
        exit 2
      fi
    fi
    # shellcheck disable=SC2086  # EXTRA_FLAGS is a list of flags, split on spaces
    exec "$tool" "$JOB" \
      --input "$INPUT" \
      --output "$OUTPUT" \
      "${job_flags[@]}" "${card_flags[@]}" $EXTRA_FLAGS \
      --job_name="$JOB_NAME" \
      --setup_file=./setup.py \
      --requirements_file=deploy/dataflow/requirements.txt \
      --requirements_cache=skip \
      --no_save_main_session \
      "${beam_flags[@]}"
    ;;
  build-template)
    ensure_repository
    gcloud builds submit --project="$PROJECT" --region="$REGION" \
      --config=/dev/stdin . <<EOF
steps:
- name: gcr.io/cloud-builders/docker
  args: [build, -f, deploy/dataflow/Dockerfile, -t, "$TEMPLATE_IMAGE", .]
images: ["$TEMPLATE_IMAGE"]
EOF
    exec gcloud dataflow flex-template build "$TEMPLATE_SPEC" \
      --project="$PROJECT" \
      --image="$TEMPLATE_IMAGE" \
      --sdk-language=PYTHON \
      --metadata-file=deploy/dataflow/metadata.json
    ;;
  run-template)
    # Machine type, worker counts and the boot disk go through gcloud's flags; the job's own flags
    # are template parameters (metadata.json).
    # The launcher returns once the job is submitted (deploy/dataflow/main.py); follow the job in
    # the console, and see dataset_stats.txt appear in OUTPUT when it has finished.
    params="job=$JOB,input=$INPUT,output=$OUTPUT"
    if [[ "$JOB" == bucketed ]]; then
      params+=",language=eng_Latn,lid_threshold=0.90,partitions=32"
    fi
    params+="$card_params"
    if [[ -n "$EXTRA_PARAMETERS" ]]; then
      params+=",$EXTRA_PARAMETERS"
    fi
    if [[ -n "$WORKER_IMAGE" ]]; then
      params+=",sdk_container_image=$WORKER_IMAGE"
    fi
    exec gcloud dataflow flex-template run "$JOB_NAME" \
      --project="$PROJECT" \
      --region="$REGION" \
      --template-file-gcs-location="$TEMPLATE_SPEC" \
      --temp-location="gs://$BUCKET/dataflow/tmp" \
      --staging-location="gs://$BUCKET/dataflow/staging" \
      --worker-machine-type="$MACHINE_TYPE" \
      --num-workers="$NUM_WORKERS" \
      --max-workers="$MAX_WORKERS" \
      --additional-pipeline-options="disk_size_gb=$DISK_GB" \
      --parameters="$params"
    ;;
esac
