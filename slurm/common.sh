# shellcheck shell=bash
# Shared by the sbatch scripts in slurm/: the layout checks, the settings and the srun launch.
# Sourced, not run. It all runs in the batch step (on the job's first node) before any training starts,
# and every check that fails prints exactly one line and exits 2 (the benchmarks' own code for bad input).
#
# Settings (environment variables; sbatch passes the submitting shell's environment to the job):
#   BENCH_DEVICE                cuda (default) or cpu: gloo, 32 px images, 4 images per device, 2+4 steps
#   BENCH_BATCH_SIZE_PER_DEVICE weak scaling: images per device (default: the script's, 256 on GPU)
#   BENCH_GLOBAL_BATCH_SIZE     strong scaling: images per step over all devices (divisible by the world size)
#   BENCH_STEPS, BENCH_WARMUP_STEPS, BENCH_PRECISION, BENCH_IMAGE_SIZE, BENCH_TIMEOUT: the script's options
#   BENCH_RUN_NAME              <results dir>/<run name>/ (default: the job name)
#   BENCH_RESULTS_DIR           where run folders go (default: runs/ in the job's working directory, git-ignored)
#   BENCH_PYTHON                the interpreter (default: active venv, else the repository's .venv, else python3)
#   BENCH_VENV                  a virtual environment to activate first
#   BENCH_MODULES               site-specific: modules to `module load` first, e.g. "cuda/12.4 nccl"
#   BENCH_ROOT                  the repository (default: the directory sbatch was called from)
# Arguments after the sbatch script's name are passed on to the benchmark and win over the settings above.

# One line naming the broken rule, then stop: the job ends FAILED with exit code 2, nothing was started.
bench_die() {
  echo "${BENCH_NAME:-slurm}: error: $*" >&2
  exit 2
}

bench_is_count() {
  [[ ${1:-} =~ ^[0-9]+$ ]] && (( 10#$1 > 0 ))
}

# The value of the last `--name value` or `--name=value` in the arguments after the first; empty if absent.
bench_arg_value() {
  local name=$1 value="" previous="" argument
  shift
  for argument in "$@"; do
    if [ "$previous" = "$name" ]; then
      value=$argument
    elif [[ $argument == "$name="* ]]; then
      value=${argument#*=}
    fi
    previous=$argument
  done
  echo "$value"
}

bench_has_arg() {
  local name=$1 argument
  shift
  for argument in "$@"; do
    if [ "$argument" = "$name" ] || [[ $argument == "$name="* ]]; then
      return 0
    fi
  done
  return 1
}

# GPUs on this (the job's first) node as Slurm allocated them: SLURM_GPUS_ON_NODE, whether they were asked
# for with --gpus-per-node, --gres=gpu:N or --gpus. Sites that hand out whole nodes without GPU accounting
# set none: then what CUDA_VISIBLE_DEVICES or nvidia-smi shows counts.
bench_gpus_on_node() {
  local count
  if [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then
    count=$SLURM_GPUS_ON_NODE
  elif [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    local visible
    IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
    count=${#visible[@]}
  elif command -v nvidia-smi >/dev/null 2>&1; then
    count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  else
    count=0
  fi
  [[ $count =~ ^[0-9]+$ ]] || bench_die "cannot read the GPUs on the node (SLURM_GPUS_ON_NODE='${SLURM_GPUS_ON_NODE:-}')"
  echo "$count"
}

# The job's shape: sets BENCH_NODES and BENCH_TASKS_PER_NODE and checks that it is one task per GPU,
# the same number on every node. Lightning's SLURMEnvironment makes the same demands at start-up, but only
# after a rank has imported everything and as a traceback; here it is one line before srun.
bench_check_layout() {
  [ -n "${SLURM_JOB_ID:-}" ] || bench_die "not inside a Slurm job: submit with sbatch (or run it in an salloc allocation)"
  BENCH_DEVICE=${BENCH_DEVICE:-cuda}
  BENCH_GPUS_ON_NODE=""
  case "$BENCH_DEVICE" in
    cuda | cpu) ;;
    *) bench_die "BENCH_DEVICE=$BENCH_DEVICE: use cuda or cpu" ;;
  esac
  BENCH_NODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-}}
  bench_is_count "$BENCH_NODES" || bench_die "cannot read the number of nodes (SLURM_JOB_NUM_NODES='$BENCH_NODES')"
  if [ -z "${SLURM_NTASKS_PER_NODE:-}" ]; then
    if [ -n "${SLURM_NTASKS:-}" ]; then
      bench_die "--ntasks=$SLURM_NTASKS without --ntasks-per-node: ask for --nodes and --ntasks-per-node=<GPUs per node> instead (one task per GPU, the same on every node)"
    fi
    bench_die "--ntasks-per-node is not set: ask for --nodes and --ntasks-per-node=<GPUs per node> (one task per GPU)"
  fi
  BENCH_TASKS_PER_NODE=$SLURM_NTASKS_PER_NODE
  bench_is_count "$BENCH_TASKS_PER_NODE" || bench_die "cannot read SLURM_NTASKS_PER_NODE='$SLURM_NTASKS_PER_NODE'"
  if [ -n "${SLURM_NTASKS:-}" ] && (( SLURM_NTASKS != BENCH_NODES * BENCH_TASKS_PER_NODE )); then
    bench_die "--ntasks=$SLURM_NTASKS is not --nodes ($BENCH_NODES) x --ntasks-per-node ($BENCH_TASKS_PER_NODE): give only --nodes and --ntasks-per-node"
  fi
  if [ "$BENCH_DEVICE" = cuda ]; then
    local gpus
    gpus=$(bench_gpus_on_node)
    if (( gpus == 0 )); then
      bench_die "no GPU allocated to this job: submit with --gpus-per-node=$BENCH_TASKS_PER_NODE (or --gres=gpu:$BENCH_TASKS_PER_NODE where the site uses that), or set BENCH_DEVICE=cpu for a CPU run"
    elif (( gpus < BENCH_TASKS_PER_NODE )); then
      bench_die "$BENCH_TASKS_PER_NODE tasks per node but only $gpus GPU(s) per node: one task per GPU, so ask for --gpus-per-node=$BENCH_TASKS_PER_NODE or --ntasks-per-node=$gpus"
    elif (( gpus > BENCH_TASKS_PER_NODE )) && ! bench_requested_gpus_per_node "$BENCH_TASKS_PER_NODE"; then
      bench_die "$gpus GPUs per node but only $BENCH_TASKS_PER_NODE task(s) per node: one task per GPU, so ask for --ntasks-per-node=$gpus or --gpus-per-node=$BENCH_TASKS_PER_NODE"
    fi
    BENCH_GPUS_ON_NODE=$gpus
  fi
}

# True when the job asked for exactly $1 GPUs per node. With --exclusive Slurm allocates every GPU of the
# node, more than asked for; the request itself is in SLURM_GPUS_PER_NODE ([type:]N) for --gpus-per-node,
# but --gres=gpu:[type:]N leaves it unset and only the job record has it (TresPerNode=gres:gpu:N, or
# gres/gpu:N in later Slurm versions).
bench_requested_gpus_per_node() {
  local want=$1 entry entries
  if [ -n "${SLURM_GPUS_PER_NODE:-}" ]; then
    [ "${SLURM_GPUS_PER_NODE##*:}" = "$want" ]
    return
  fi
  entries=$(scontrol show job --oneliner "$SLURM_JOB_ID" 2>/dev/null | grep -o 'TresPerNode=[^ ]*' || true)
  IFS=, read -r -a entries <<<"${entries#TresPerNode=}"
  for entry in "${entries[@]}"; do
    if [[ $entry =~ ^gres[:/]gpu(:[^:=]+)?[:=]([0-9]+)$ ]] && [ "${BASH_REMATCH[2]}" = "$want" ]; then
      return 0
    fi
  done
  return 1
}

# Modules, venv and interpreter: the site-specific part of the job's environment.
bench_setup_environment() {
  if [ -n "${BENCH_MODULES:-}" ]; then
    if ! command -v module >/dev/null 2>&1; then
      # Batch scripts run in a non-login shell, where Lmod / Environment Modules may not be initialised yet.
      # Their init scripts read variables that may be unset, hence set +u around them.
      set +u
      for init in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh /usr/share/lmod/lmod/init/bash; do
        if [ -r "$init" ]; then
          # shellcheck disable=SC1090
          source "$init"
          break
        fi
      done
      set -u
    fi
    command -v module >/dev/null 2>&1 || bench_die "BENCH_MODULES is set but this node has no module command"
    # Word splitting is wanted: BENCH_MODULES is a list of modules.
    # shellcheck disable=SC2086
    module load $BENCH_MODULES
  fi
  if [ -n "${BENCH_VENV:-}" ]; then
    [ -r "$BENCH_VENV/bin/activate" ] || bench_die "BENCH_VENV=$BENCH_VENV is not a virtual environment (no bin/activate)"
    set +u
    # shellcheck disable=SC1091
    source "$BENCH_VENV/bin/activate"
    set -u
  fi
  if [ -z "${BENCH_PYTHON:-}" ]; then
    if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
      BENCH_PYTHON=$VIRTUAL_ENV/bin/python
    elif [ -x "$BENCH_ROOT/.venv/bin/python" ]; then  # what `make venv` builds
      BENCH_PYTHON=$BENCH_ROOT/.venv/bin/python
    else
      BENCH_PYTHON=python3
    fi
  fi
  command -v "$BENCH_PYTHON" >/dev/null 2>&1 ||
    bench_die "python '$BENCH_PYTHON' not found: set BENCH_PYTHON or BENCH_VENV, or load a Python module (BENCH_MODULES)"
}

# The benchmark's arguments (BENCH_ARGS) and the result path (BENCH_OUTPUT) from the settings and the
# arguments given after the sbatch script ("$@"), which come last so that they win.
bench_build_args() {
  if [ -n "${BENCH_BATCH_SIZE_PER_DEVICE:-}" ] && [ -n "${BENCH_GLOBAL_BATCH_SIZE:-}" ]; then
    bench_die "set BENCH_BATCH_SIZE_PER_DEVICE (weak scaling) or BENCH_GLOBAL_BATCH_SIZE (strong scaling), not both"
  fi
  if [ "$BENCH_DEVICE" = cpu ]; then
    # The smoke-test size of the test suite and `make bench` without a GPU: it proves the job works,
    # its images/s say nothing about GPU training.
    : "${BENCH_IMAGE_SIZE:=32}" "${BENCH_WARMUP_STEPS:=2}" "${BENCH_STEPS:=4}"
    if [ -z "${BENCH_GLOBAL_BATCH_SIZE:-}" ] && ! bench_has_arg --global-batch-size "$@" &&
      ! bench_has_arg --batch-size-per-device "$@"; then
      : "${BENCH_BATCH_SIZE_PER_DEVICE:=4}"
    fi
  fi
  BENCH_ARGS=(--device "$BENCH_DEVICE")
  local option variable
  for option in image-size:BENCH_IMAGE_SIZE batch-size-per-device:BENCH_BATCH_SIZE_PER_DEVICE \
    global-batch-size:BENCH_GLOBAL_BATCH_SIZE warmup-steps:BENCH_WARMUP_STEPS steps:BENCH_STEPS \
    precision:BENCH_PRECISION timeout:BENCH_TIMEOUT; do
    variable=${option#*:}
    if [ -n "${!variable:-}" ]; then
      BENCH_ARGS+=("--${option%%:*}" "${!variable}")
    fi
  done
  BENCH_OUTPUT=$(bench_arg_value --output "$@")
  if [ -z "$BENCH_OUTPUT" ]; then
    local run unit restart=""
    # One folder per run (a sweep shares one); the file name carries the shape and the job id.
    if [ -n "${BENCH_RUN_NAME:-}" ]; then
      run=$(bench_run_folder BENCH_RUN_NAME "$BENCH_RUN_NAME")
    else
      run=$(bench_run_folder "the job name (--job-name; BENCH_RUN_NAME overrides it)" "${SLURM_JOB_NAME:-$BENCH_NAME}")
    fi
    unit=$([ "$BENCH_DEVICE" = cuda ] && echo gpu || echo cpu)
    # A requeued job keeps its id: its second attempt must not collide with the first one's result.
    if [ "${SLURM_RESTART_COUNT:-0}" != 0 ]; then
      restart=".restart$SLURM_RESTART_COUNT"
    fi
    # runs/ of the working directory (git-ignored in the repository): results are committed only on purpose.
    # The benchmark makes the folder once every rule has passed: refused input leaves no empty folder behind.
    BENCH_OUTPUT=${BENCH_RESULTS_DIR:-$PWD/runs}/$run/$BENCH_NAME-${BENCH_NODES}n${BENCH_TASKS_PER_NODE}$unit-job$SLURM_JOB_ID$restart.json
    BENCH_ARGS+=(--output "$BENCH_OUTPUT")
  fi
  BENCH_ARGS+=("$@")
}

# The run folder's name ($2, from the setting named $1) as it is, or one line and exit 2: a name such as '..' or
# 'a/b' would put the result outside <results dir>/, and changing it silently would file it under another name.
# (Runs in a command substitution: the caller's `set -e` stops the job on the exit 2.)
bench_run_folder() {
  if [[ ! $2 =~ ^[A-Za-z0-9._-]+$ ]] || [ "$2" = . ] || [ "$2" = .. ]; then
    bench_die "$1 '$2' cannot name the run folder: use letters, digits, '.', '_' and '-', not '.' or '..'"
  fi
  echo "$2"
}

# The result files this job may write, each with what identifies its current version (device, inode, size,
# modification time to the nanosecond): the one file, one per strategy (<stem>-<strategy>.json) when
# oss_benchmark.py runs several, and <stem>.<pid>.json where a run found its file taken meanwhile.
# Prints "identity<TAB>path" lines.
bench_result_files() {
  local stem=${BENCH_OUTPUT%.json} file
  shopt -s nullglob
  for file in "$BENCH_OUTPUT" "$stem"-*.json "$stem".[0-9]*.json; do
    if [ -f "$file" ]; then
      printf '%s\t%s\n' "$(stat -c '%d:%i:%s:%y' -- "$file")" "$file"
    fi
  done
  shopt -u nullglob
}

# srun one task per device on every node; returns the step's exit status (the job's).
bench_launch() {
  local script=$1 hosts status=0
  shift
  # The rendezvous host: the job's first node, as Slurm lists it (the benchmarks need it for several nodes).
  hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
  export MASTER_ADDR=${MASTER_ADDR:-${hosts%%$'\n'*}}
  export PYTHONUNBUFFERED=1
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
  # Since Slurm 22.05 srun no longer inherits --cpus-per-task from the job; this variable passes it on.
  if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then
    export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
  fi
  echo "== $BENCH_NAME: Slurm job $SLURM_JOB_ID on $BENCH_NODES node(s) x $BENCH_TASKS_PER_NODE task(s) ($BENCH_DEVICE${BENCH_GPUS_ON_NODE:+, $BENCH_GPUS_ON_NODE GPU(s) on the first node}), MASTER_ADDR=$MASTER_ADDR"
  echo "== $BENCH_PYTHON $script $*"
  # Files of these names may be older than the job: a Slurm job id comes again after the cluster's
  # controller starts afresh, and --output may name an existing file. The closing line names only the
  # files that are new or were rewritten while the job ran.
  local before after written=() line
  before=$(bench_result_files)
  # --kill-on-bad-exit=1 (whatever the site's default): when one task fails, Slurm ends the step's other tasks at
  # once. A signal (scancel, the time limit) takes its default action in every task: no partial result.
  srun --kill-on-bad-exit=1 --nodes="$BENCH_NODES" --ntasks-per-node="$BENCH_TASKS_PER_NODE" \
    "$BENCH_PYTHON" "$BENCH_ROOT/$script" "$@" || status=$?
  after=$(bench_result_files)
  while IFS= read -r line; do
    if [ -n "$line" ] && ! grep -qxF -- "$line" <<<"$before"; then
      written+=("${line#*$'\t'}")
    fi
  done <<<"$after"
  echo "== srun exit status $status; result file(s): ${written[*]:-none}"
  return "$status"
}
