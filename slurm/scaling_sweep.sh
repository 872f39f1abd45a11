#!/bin/bash
# Weak- or strong-scaling sweep: one Slurm job per GPU count, all writing into one run folder,
# runs/<run name>/ of the directory it is called from, each result named with its job id, plus sweep.tsv
# listing the submitted points.
#
#   slurm/scaling_sweep.sh weak                 # 1, 2, 4, 8 GPUs, the script's per-GPU batch (256) at every point
#   slurm/scaling_sweep.sh strong               # 1, 2, 4, 8 GPUs sharing one global batch (default 256 x fewest GPUs)
#   SWEEP_GPUS="1 2 4 8 16" SWEEP_GPUS_PER_NODE=8 slurm/scaling_sweep.sh weak   # 16 GPUs = 2 nodes x 8
#   slurm/scaling_sweep.sh strong slurm/lightning_ddp_resnet50.sbatch --precision bf16   # another script, extra args
#   BENCH_DEVICE=cpu SWEEP_GPUS="1 2" SWEEP_WAIT=1 slurm/scaling_sweep.sh weak            # CPU processes (CI)
#   SWEEP_PROBE=1 slurm/scaling_sweep.sh weak    # each multi-GPU point also probes its link, for the ceiling
#   python report.py runs/<run folder>           # then: efficiency by GPU count (and the ceiling where probed)
#
# Usage: slurm/scaling_sweep.sh weak|strong [SBATCH SCRIPT (default slurm/ddp_resnet50.sbatch)] [BENCHMARK ARGS...]
# Settings (environment):
#   SWEEP_GPUS             GPU counts (default "1 2 4 8"); on the CPU: processes
#   SWEEP_GPUS_PER_NODE    GPUs per node of the partition (default 4, site-specific); a count above it runs on
#                          count / SWEEP_GPUS_PER_NODE full nodes and must divide by it
#   BENCH_GPU_REQUEST      gpus-per-node (default) or gres (sites without select/cons_tres: --gres=gpu:N)
#   BENCH_BATCH_SIZE_PER_DEVICE (weak), BENCH_GLOBAL_BATCH_SIZE (strong), and every other BENCH_* setting of
#                          slurm/common.sh, passed to the jobs through sbatch's environment
#   BENCH_RUN_NAME         the run folder (default <weak|strong>-<script>-<UTC time>)
#   BENCH_RESULTS_DIR      where the run folder goes (default runs/ of the current directory)
#   SWEEP_WAIT=1           wait for every job, then print each point's status and fail unless all are ok
#   SWEEP_PROBE=1          every point of more than one GPU runs the benchmark with --collective-probe: after its
#                          timed steps its ranks time the collectives (the package's collective_probe.py) on the
#                          same allocation and link, and the result keeps the fits, from which report.py prints
#                          that count's ceiling (ddp_resnet50.sbatch and lightning_ddp_resnet50.sbatch only)
#   sbatch's own SBATCH_PARTITION, SBATCH_ACCOUNT, SBATCH_TIMELIMIT, ... choose the site's partition and account.
set -euo pipefail

die() {
  echo "scaling_sweep.sh: error: $*" >&2
  exit 2
}

mode=${1:-}
case "$mode" in
  weak | strong) shift ;;
  *) die "first argument: weak (fixed batch per device) or strong (fixed global batch), got '${mode}'" ;;
esac
script=slurm/ddp_resnet50.sbatch
if [ $# -gt 0 ] && [[ $1 == *.sbatch ]]; then
  script=$1
  shift
fi
root=$(cd "$(dirname "$0")/.." && pwd)
# sbatch runs from the repository root (the scripts find common.sh there), so a relative path means from there.
script_path=$script
[[ $script == /* ]] || script_path=$root/$script
[ -r "$script_path" ] || die "no sbatch script $script_path"
command -v sbatch >/dev/null 2>&1 || die "sbatch not found: run this on a Slurm login node"

device=${BENCH_DEVICE:-cuda}
case "$device" in
  cuda | cpu) ;;
  *) die "BENCH_DEVICE=$device: use cuda or cpu" ;;
esac
case "${BENCH_GPU_REQUEST:-gpus-per-node}" in
  gpus-per-node | gres) ;;
  *) die "BENCH_GPU_REQUEST=$BENCH_GPU_REQUEST: use gpus-per-node or gres" ;;
esac
case "${SWEEP_WAIT:-0}" in
  0 | 1) ;;
  *) die "SWEEP_WAIT=$SWEEP_WAIT: use 1 (wait for the jobs) or 0" ;;
esac
case "${SWEEP_PROBE:-0}" in
  0) ;;
  1) [[ $(basename "$script") == *ddp_resnet50.sbatch ]] ||
       die "SWEEP_PROBE=1: the probe runs inside ddp_resnet50.sbatch or lightning_ddp_resnet50.sbatch, not $script" ;;
  *) die "SWEEP_PROBE=$SWEEP_PROBE: use 1 (probe each multi-GPU point's link) or 0" ;;
esac
if [ -n "${BENCH_CPUS_PER_TASK:-}" ] && [[ ! $BENCH_CPUS_PER_TASK =~ ^[1-9][0-9]*$ ]]; then
  die "BENCH_CPUS_PER_TASK=$BENCH_CPUS_PER_TASK is not a positive integer"
fi
read -r -a counts <<<"${SWEEP_GPUS:-1 2 4 8}"
per_node=${SWEEP_GPUS_PER_NODE:-4}
[[ $per_node =~ ^[1-9][0-9]*$ ]] || die "SWEEP_GPUS_PER_NODE=$per_node is not a positive integer"
[ "${#counts[@]}" -gt 0 ] || die "SWEEP_GPUS is empty"
smallest=
for count in "${counts[@]}"; do
  [[ $count =~ ^[1-9][0-9]*$ ]] || die "SWEEP_GPUS: '$count' is not a positive integer"
  if (( count > per_node && count % per_node )); then
    die "$count GPUs do not fill whole nodes of $per_node GPUs (SWEEP_GPUS_PER_NODE)"
  fi
  if [ -z "$smallest" ] || (( count < smallest )); then
    smallest=$count
  fi
done

if [ "$mode" = weak ]; then
  [ -z "${BENCH_GLOBAL_BATCH_SIZE:-}" ] || die "weak scaling fixes the batch per device: unset BENCH_GLOBAL_BATCH_SIZE"
  batch_note="batch per device ${BENCH_BATCH_SIZE_PER_DEVICE:-script default}"
else
  [ -z "${BENCH_BATCH_SIZE_PER_DEVICE:-}" ] || die "strong scaling fixes the global batch: set BENCH_GLOBAL_BATCH_SIZE, not BENCH_BATCH_SIZE_PER_DEVICE"
  # Default: the smallest point runs at the benchmarks' default batch per device (256 on a GPU, 4 in the CPU
  # mode of common.sh) and the larger ones split that global batch.
  if [ -z "${BENCH_GLOBAL_BATCH_SIZE:-}" ]; then
    BENCH_GLOBAL_BATCH_SIZE=$(( $([ "$device" = cpu ] && echo 4 || echo 256) * smallest ))
  fi
  [[ $BENCH_GLOBAL_BATCH_SIZE =~ ^[1-9][0-9]*$ ]] || die "BENCH_GLOBAL_BATCH_SIZE=$BENCH_GLOBAL_BATCH_SIZE is not a positive integer"
  for count in "${counts[@]}"; do
    (( BENCH_GLOBAL_BATCH_SIZE % count == 0 )) ||
      die "the global batch $BENCH_GLOBAL_BATCH_SIZE does not divide over $count GPUs: choose BENCH_GLOBAL_BATCH_SIZE divisible by every count in SWEEP_GPUS"
  done
  export BENCH_GLOBAL_BATCH_SIZE
  batch_note="global batch $BENCH_GLOBAL_BATCH_SIZE"
fi

name=$(basename "$script" .sbatch)
export BENCH_ROOT=$root
# The jobs run in the repository root, so a relative folder is made absolute from here, where it was meant.
BENCH_RESULTS_DIR=${BENCH_RESULTS_DIR:-runs}
[[ $BENCH_RESULTS_DIR == /* ]] || BENCH_RESULTS_DIR=$PWD/$BENCH_RESULTS_DIR
export BENCH_RESULTS_DIR
export BENCH_RUN_NAME=${BENCH_RUN_NAME:-$mode-$name-$(date -u +%Y%m%dT%H%M%SZ)}
# The jobs' own rule for the run folder's name (slurm/common.sh), checked before anything is made or submitted.
# shellcheck source=slurm/common.sh
source "$root/slurm/common.sh"
BENCH_NAME=scaling_sweep.sh bench_run_folder BENCH_RUN_NAME "$BENCH_RUN_NAME" >/dev/null
run_dir=$BENCH_RESULTS_DIR/$BENCH_RUN_NAME
manifest=$run_dir/sweep.tsv
sbatch_errors=$(mktemp)
job_ids=()
# Slurm does not create the folder of --output: the job logs go next to the results. The folders made here (the
# run folder and those above it that were missing, runs/ included) go again when the sweep ends, however it ends,
# without having submitted a job: a sweep that submitted nothing leaves nothing behind.
made_dirs=()
folder=$run_dir
while [ ! -d "$folder" ]; do
  made_dirs+=("$folder")
  folder=$(dirname "$folder")
done
clean_up() {
  rm -f "$sbatch_errors"
  if [ "${#job_ids[@]}" = 0 ]; then
    for folder in ${made_dirs[@]+"${made_dirs[@]}"}; do  # the deepest first; each one only while empty
      rmdir "$folder" 2>/dev/null || break
    done
  fi
}
trap clean_up EXIT
mkdir -p "$run_dir" 2>/dev/null || die "cannot make the run folder $run_dir (BENCH_RESULTS_DIR, BENCH_RUN_NAME)"

unit=$([ "$device" = cpu ] && echo process || echo GPU)
echo "== $mode scaling of $name over ${counts[*]} $([ "$device" = cpu ] && echo CPU processes || echo GPUs), $batch_note -> $run_dir"
for count in "${counts[@]}"; do
  if (( count > per_node )); then
    nodes=$(( count / per_node )) tasks=$per_node
  else
    nodes=1 tasks=$count
  fi
  options=(--parsable --job-name="$name-$mode-$count" --nodes="$nodes" --ntasks-per-node="$tasks"
           --output="$run_dir/%x-%j.out")
  if [ "$device" = cpu ]; then
    # No GPU: override the script's GPU request; one core per process unless told otherwise.
    options+=(--gpus-per-node=0 --cpus-per-task="${BENCH_CPUS_PER_TASK:-1}")
  elif [ "${BENCH_GPU_REQUEST:-gpus-per-node}" = gres ]; then
    options+=(--gres="gpu:$tasks")
  else
    options+=(--gpus-per-node="$tasks")
  fi
  probe=()
  if [ "${SWEEP_PROBE:-0}" = 1 ] && (( count > 1 )); then
    probe=(--collective-probe)  # one rank measures no link
  fi
  if ! job=$(cd "$root" && sbatch "${options[@]}" "$script" "$@" ${probe[@]+"${probe[@]}"} 2>"$sbatch_errors"); then
    # sbatch's last line says why (e.g. "Batch job submission failed: Invalid partition name specified").
    reason=$(sed -e '/^[[:space:]]*$/d' -e 's/^sbatch: error: //' "$sbatch_errors" | tail -n 1)
    if [ "${#job_ids[@]}" = 0 ]; then
      submitted="nothing was submitted"
    else
      submitted="already submitted: job(s) ${job_ids[*]}, listed in $manifest (scancel $(IFS=,; echo "${job_ids[*]}") cancels them)"
    fi
    echo "scaling_sweep.sh: error: sbatch failed for the $count-$unit point (${reason:-no message}): $submitted" >&2
    exit 1
  fi
  cat "$sbatch_errors" >&2  # sbatch's warnings, if any
  job=${job%%;*}  # --parsable prints "id" or "id;cluster"
  job_ids+=("$job")
  # Written with the first submitted job: a sweep that submitted nothing leaves no manifest behind.
  [ -e "$manifest" ] || printf 'mode\tgpus\tnodes\ttasks_per_node\tjob_id\tscript\n' >"$manifest"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$count" "$nodes" "$tasks" "$job" "$script" >>"$manifest"
  echo "   $count: $nodes node(s) x $tasks -> job $job"
done

if [ "${SWEEP_WAIT:-0}" != 1 ]; then
  echo "== submitted; watch with: squeue --jobs=$(IFS=,; echo "${job_ids[*]}")"
  exit 0
fi

# Without an accounting database sacct cannot say how a job ended, so wait until squeue no longer lists
# the jobs and read the verdict from their result files instead.
ids=$(IFS=,; echo "${job_ids[*]}")
while [ -n "$(squeue --noheader --jobs="$ids" --format=%i 2>/dev/null || true)" ]; do
  sleep "${SWEEP_POLL_S:-10}"
done
failed=0
for job in "${job_ids[@]}"; do
  found=0
  # One result per job, or one per strategy for oss_benchmark.py (<output stem>-<strategy>.json).
  for result in "$run_dir"/*-job"$job".json "$run_dir"/*-job"$job"-*.json; do
    [ -e "$result" ] || continue  # a pattern that matched nothing stays as it is
    found=1
    # The top-level "status" (the files are written with a one-space indent).
    status=$(sed -n 's/^ "status": "\([a-z]*\)".*/\1/p; T; q' "$result")
    echo "   job $job: ${status:-unreadable} $result"
    [ "$status" = ok ] || failed=1
  done
  if [ "$found" = 0 ]; then
    echo "   job $job: no result file (see $run_dir/*-$job.out)"
    failed=1
  fi
done
exit "$failed"
