#!/usr/bin/env bash
# The GPU runs behind the tables of docs/performance.md and docs/sharding.md, by named matrix:
#
#   tools/gpu_evidence.sh [--dry-run] [--telemetry] [--gpus N] [--out DIR] MATRIX...
#
#   baseline  one GPU, 256 and 32 images: each precision and speed option (performance.md, "One GPU")
#   fastest   the fastest mode into an empty Inductor cache and from it, without --sums-batch-norm, the twin in it
#   measure   one GPU: peak memory and run-to-run agreement by mode, the twin's variants, the harness's own cost
#   scaling   one GPU against two: DDP's options, compression hooks, compiled and captured steps
#   twins     native against the Lightning twin, as shipped and --lightning-matched, in each mode
#   sharding  oss_benchmark.py: every strategy with SGD and Adam, FSDP2's unit sizes, fairscale's conditions
#   probes    the experiments/ probes: kernel profiles, the stem, batch norm, Lightning's loop cost
#   faults    a real out-of-memory, a real desync (ranks with different --lr), a SIGTERM: their statuses and exit codes
#   twins2    two GPUs: native, the stock twin and the matched twin in turn, three rounds, at 256 and 32 images eager
#             and 256 compiled (lightning/README.md)
#   slowlink  two GPUs: fairscale's conditions and the whole sharding suite under NCCL's defaults, without
#             peer-to-peer, and without peer-to-peer or shared memory (sharding.md)
#   defaults2 two GPUs: each script's defaults, for report.py --check-against the committed two-GPU campaigns
#   compare1, compare2, compare3  one GPU, compare.py's ABBA rounds: the twin against native (256 eager and
#             compiled, 32 eager), each speed option and the fastest mode (fp16, bf16) against the default, the
#             harness against a bare loop, oss_benchmark.py's defaults (each matrix fits a 10-minute call)
#
# One-GPU runs go in pairs, one per GPU, side by side (one after the other with --gpus 1; measure: one after the
# other); two-GPU runs one after another. Each run writes DIR/NAME.json (oss_benchmark.py: DIR/NAME-STRATEGY.json)
# and DIR/logs/NAME.log, and appends its command to DIR/commands.txt with output paths relative to DIR, so that DIR
# can become a results/ campaign. --dry-run prints the commands only. --telemetry samples nvidia-smi every 100 ms
# into DIR/nvidia-smi.csv. Exit 1 when a run ended otherwise than expected (DIR/failed.txt), 2 on bad usage; a
# result is never overwritten. The sharding matrix needs fairscale.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
PY=${PYTHON:-python}
OUT=runs/gpu-evidence DRY=0 TELEMETRY=0 GPUS="" MATRICES=()
usage() { echo "gpu_evidence.sh: error: $1 (usage: tools/gpu_evidence.sh [--dry-run] [--telemetry] [--gpus N]" \
  "[--out DIR] MATRIX...; matrices: baseline measure fastest scaling twins sharding probes faults twins2 slowlink" \
  "defaults2 compare1 compare2 compare3)" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --telemetry) TELEMETRY=1; shift ;;
    --gpus) [[ ${2:-} =~ ^[12]$ ]] || usage "--gpus takes 1 or 2"; GPUS=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || usage "--out needs a folder"; OUT=$2; shift 2 ;;
    baseline|measure|fastest|scaling|twins|sharding|probes|faults|twins2|slowlink|defaults2|compare[123])
      MATRICES+=("$1"); shift ;;
    *) usage "unknown matrix or option: $1" ;;
  esac
done
[ ${#MATRICES[@]} -gt 0 ] || usage "name at least one matrix"
[ -n "$GPUS" ] || GPUS=$( ((DRY)) && echo 2 || nvidia-smi -L 2>/dev/null | wc -l)
[ "$GPUS" -ge 1 ] 2>/dev/null || usage "no GPU visible (nvidia-smi -L lists none)"
if ((!DRY)); then
  mkdir -p "$OUT/logs" 2>/dev/null || usage "$OUT cannot be made"
  rm -f "$OUT/failed.txt"
fi
TWO=("$PY" -m torch.distributed.run --standalone --nproc-per-node 2)
L=lightning/ddp_resnet50.py
E=(--warmup-steps 10 --steps 100)  # eager and compiled
G=(--warmup-steps 20 --steps 100)  # captured (the capture is the last warm-up step)
FP16=(--precision fp16 --loss-scale 1024)
TUNED=("${FP16[@]}" --compile --coordinate-descent-tuning --cuda-graphs --space-to-depth-stem
  --dense-max-pool-backward --warmup-steps 20 --steps 200)
FASTEST=("${TUNED[@]}" --sums-batch-norm)

declare -A NAMED=()  # folders made at run time, shown by the variable that holds them
record() {  # record LINE: the command as commands.txt lists it, output paths relative to DIR
  local line=${1//"$OUT/"/} path
  for path in "${!NAMED[@]}"; do line=${line//"$path"/${NAMED[$path]}}; done
  if ((DRY)); then echo "$line"; else echo "$line" >>"$OUT/commands.txt"; fi
}

run() {  # run NAME GPUS EXPECTED_EXIT ENV... -- COMMAND... : one run, its output DIR/NAME.json, its log (a two-GPU
  # run is listed, not run, on a one-GPU machine)
  local name=$1 gpus=$2 expect=$3 env=() code
  shift 3
  while [ "$1" != -- ]; do env+=("$1"); shift; done
  shift
  if [ "$gpus" = 0,1 ] && [ "$GPUS" -lt 2 ]; then record "# $name needs two GPUs"; return; fi
  local shown=("${env[@]}" "$@" --output "$name.json")
  [ "$gpus" = 0,1 ] || shown=("CUDA_VISIBLE_DEVICES=$gpus" "${shown[@]}")
  [ -n "${RECORDED:-}" ] || record "${shown[*]}${BACKGROUND:+ &}"
  ((DRY)) || [ -n "${RECORD_ONLY:-}" ] && return 0
  local log=$OUT/logs/${LOG:-$name}.log
  if [ -e "$log" ]; then  # a name that two matrices share runs once into one folder; the first keeps its files
    echo "${LOG:-$name}: ran already into $OUT, not run again" >>"$OUT/failed.txt"
    return 0
  fi
  env CUDA_VISIBLE_DEVICES="$gpus" "${env[@]}" "$@" --output "$OUT/$name.json" >"$log" 2>&1
  code=$?
  echo "exit $code" >>"$log"
  [ "$code" -eq "$expect" ] || echo "${LOG:-$name}: exit $code, expected $expect" >>"$OUT/failed.txt"
}

one() {  # one NAME ARGS...: a one-GPU run on GPU 0
  local name=$1
  shift
  run "$name" 0 0 -- "$@"
}

two() {  # two NAME ARGS...: a two-GPU run
  local name=$1
  shift
  run "$name" 0,1 0 -- "$@"
}

pair() {  # pair "NAME ARGS..." "NAME ARGS...": two one-GPU runs side by side, GPU 0 and GPU 1
  local a b
  read -r -a a <<<"$1"
  read -r -a b <<<"$2"
  if [ "$GPUS" -lt 2 ]; then
    one "${a[@]}"
    one "${b[@]}"
    return
  fi
  RECORD_ONLY=1 BACKGROUND=1 run "${a[0]}" 0 0 -- "${a[@]:1}"  # the two lines first, then both runs
  RECORD_ONLY=1 BACKGROUND=1 run "${b[0]}" 1 0 -- "${b[@]:1}"
  record wait
  ((DRY)) && return 0
  RECORDED=1 run "${a[0]}" 0 0 -- "${a[@]:1}" &
  local first=$!
  RECORDED=1 run "${b[0]}" 1 0 -- "${b[@]:1}" &
  wait "$first" $!
}

cache() {  # cache VARIABLE: a fresh Inductor cache folder in VARIABLE, and the line that makes it
  local folder
  if ((DRY)); then folder="\$$1"; else folder=$(mktemp -d); NAMED[$folder]="\$$1"; fi
  printf -v "$1" '%s' "$folder"
  record "$1=\$(mktemp -d)  # an empty Inductor cache"
}

matrix_baseline() {  # performance.md: "One GPU, 256 images" and "One GPU, 32 images"
  local n=ddp_resnet50.py s=(--batch-size-per-device 32)
  pair "native-1gpu-fp32-256 $PY $n --precision fp32 ${E[*]}" "native-1gpu-bf16-256 $PY $n ${E[*]}"
  pair "native-1gpu-bf16-256-graphs $PY $n --cuda-graphs ${G[*]}" "native-1gpu-fp16-256 $PY $n --precision fp16 ${E[*]}"
  pair "native-1gpu-fp16ls-256 $PY $n ${FP16[*]} ${E[*]}" "native-1gpu-bf16-256-compile $PY $n --compile ${E[*]}"
  pair "native-1gpu-fp16-256-compile $PY $n --precision fp16 --compile ${E[*]}" \
       "native-1gpu-bf16-256-compile-graphs $PY $n --compile --cuda-graphs ${G[*]}"
  pair "native-1gpu-bf16-512-compile-graphs $PY $n --batch-size-per-device 512 --compile --cuda-graphs ${G[*]}" \
       "native-1gpu-bf16-256-compile-cdt-graphs $PY $n --compile --coordinate-descent-tuning --cuda-graphs ${G[*]}"
  pair "native-1gpu-fp16ls-256-compile-cdt-graphs $PY $n ${FP16[*]} --compile --coordinate-descent-tuning \
        --cuda-graphs ${G[*]}" "native-1gpu-bf16-32 $PY $n ${s[*]} ${E[*]}"
  run native-1gpu-bf16-256-autotune-graphs 0 0 TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS=ATEN -- \
    "$PY" $n --compile-mode max-autotune-no-cudagraphs --cuda-graphs "${G[@]}"
  pair "native-1gpu-bf16-32-compile $PY $n ${s[*]} --compile ${E[*]}" \
       "native-1gpu-bf16-32-graphs $PY $n ${s[*]} --cuda-graphs ${G[*]}"
  pair "native-1gpu-fp16ls-32-graphs $PY $n ${s[*]} ${FP16[*]} --cuda-graphs ${G[*]}" \
       "native-1gpu-bf16-32-compile-graphs $PY $n ${s[*]} --compile --cuda-graphs ${G[*]}"
}

matrix_measure() {  # performance.md: "What a result's numbers are worth"; experiments/harness-cost; the README
  local n=ddp_resnet50.py s=(--batch-size-per-device 32) c="$PY tools/harness_cost.py --blocks 8 --block-steps 20" b
  one native-1gpu-bf16-256-a "$PY" $n; one native-1gpu-bf16-256-b "$PY" $n; one native-1gpu-bf16-32 "$PY" $n "${s[@]}"
  for m in "" --cuda-graphs; do one "native-1gpu-bf16-256-compile${m:+-graphs}" "$PY" $n --compile $m
    one "native-1gpu-bf16-32-compile${m:+-graphs}" "$PY" $n "${s[@]}" --compile $m; done
  one lightning-1gpu-bf16-256 "$PY" $L; one lightning-1gpu-bf16-256-matched "$PY" $L --lightning-matched
  one native-1gpu-fp16ls-256-best "$PY" $n "${FASTEST[@]}"
  for b in 256 128 32; do one cost-bf16-$b $c --batch-size-per-device $b; one cost-fp16-$b $c --batch-size-per-device \
    $b --precision fp16; one cost-fp16ls-$b $c --batch-size-per-device $b "${FP16[@]}"; done
  one cost-bf16-256-compile $c --compile; one cost-bf16-32-compile-graphs $c "${s[@]}" --compile --cuda-graphs
}

matrix_fastest() {  # performance.md: "The fastest mode", one GPU, one run after another (the cache is per run)
  local n=ddp_resnet50.py untuned=("${FP16[@]}" --compile --cuda-graphs --space-to-depth-stem --dense-max-pool-backward
    --warmup-steps 20 --steps 200) A B C
  cache A
  run native-fastest-cold 0 0 "TORCHINDUCTOR_CACHE_DIR=$A" -- "$PY" $n "${FASTEST[@]}"
  run native-fastest-warm 0 0 "TORCHINDUCTOR_CACHE_DIR=$A" -- "$PY" $n "${FASTEST[@]}"
  cache B
  run native-fastest-no-sums-cold 0 0 "TORCHINDUCTOR_CACHE_DIR=$B" -- "$PY" $n "${TUNED[@]}"
  cache C
  run lightning-fastest-cold 0 0 "TORCHINDUCTOR_CACHE_DIR=$C" -- "$PY" $L --lightning-matched "${FASTEST[@]}"
  run lightning-fastest-warm 0 0 "TORCHINDUCTOR_CACHE_DIR=$C" -- "$PY" $L --lightning-matched "${FASTEST[@]}"
  one native-untuned-sums "$PY" $n "${untuned[@]}" --sums-batch-norm
  one native-untuned "$PY" $n "${untuned[@]}"
  one native-eager-sums "$PY" $n "${FP16[@]}" --sums-batch-norm "${E[@]}"
  one native-eager-stem-options "$PY" $n "${FP16[@]}" --space-to-depth-stem --dense-max-pool-backward "${E[@]}"
}

matrix_scaling() {  # performance.md: "Two GPUs: scaling" and "Compiled steps on two GPUs"
  local n=ddp_resnet50.py b=(--compile --bucket-cap-mb 50 --no-broadcast-buffers) s=(--batch-size-per-device 32)
  pair "native-1gpu-bf16-256-gpu0 $PY $n ${E[*]}" "native-1gpu-bf16-256-gpu1 $PY $n ${E[*]}"
  two native-2gpu-bf16-256 "${TWO[@]}" $n "${E[@]}"
  two native-2gpu-bf16-256-nobv "${TWO[@]}" $n --no-gradient-as-bucket-view "${E[@]}"
  two native-2gpu-bf16-256-static "${TWO[@]}" $n --static-graph "${E[@]}"
  run native-2gpu-bf16-256-nch4 0,1 0 NCCL_MAX_NCHANNELS=4 -- "${TWO[@]}" $n "${E[@]}"
  two native-2gpu-bf16-256-nobb "${TWO[@]}" $n --no-broadcast-buffers "${E[@]}"
  two native-2gpu-bf16-256-nobb-b10 "${TWO[@]}" $n --no-broadcast-buffers --bucket-cap-mb 10 "${E[@]}"
  two native-2gpu-bf16-256-nobb-bf16hook "${TWO[@]}" $n --no-broadcast-buffers --comm-hook bf16_compress "${E[@]}"
  two native-2gpu-bf16-256-nobb-fp16hook "${TWO[@]}" $n --no-broadcast-buffers --comm-hook fp16_compress "${E[@]}"
  pair "native-1gpu-bf16-256-heur-gpu0 $PY $n --no-cudnn-benchmark ${E[*]}" \
       "native-1gpu-bf16-256-heur-gpu1 $PY $n --no-cudnn-benchmark ${E[*]}"
  two native-2gpu-bf16-256-heur "${TWO[@]}" $n --no-cudnn-benchmark "${E[@]}"
  pair "native-1gpu-bf16-256-graphs-gpu0 $PY $n --cuda-graphs ${G[*]}" \
       "native-1gpu-bf16-256-graphs-gpu1 $PY $n --cuda-graphs ${G[*]}"
  two native-2gpu-bf16-256-graphs "${TWO[@]}" $n --cuda-graphs "${G[@]}"
  pair "native-1gpu-bf16-256-compile-gpu0 $PY $n --compile ${E[*]}" \
       "native-1gpu-bf16-256-compile-gpu1 $PY $n --compile ${E[*]}"
  two native-2gpu-bf16-256-compile "${TWO[@]}" $n --compile "${E[@]}"
  two native-2gpu-bf16-256-compile-b50-nobb "${TWO[@]}" $n "${b[@]}" "${E[@]}"
  pair "native-1gpu-bf16-256-compile-graphs-gpu0 $PY $n --compile --cuda-graphs ${G[*]}" \
       "native-1gpu-bf16-256-compile-graphs-gpu1 $PY $n --compile --cuda-graphs ${G[*]}"
  two native-2gpu-bf16-256-compile-graphs-b50-nobb "${TWO[@]}" $n "${b[@]}" --cuda-graphs "${G[@]}"
  two native-2gpu-bf16-32-compile-graphs "${TWO[@]}" $n "${s[@]}" --compile --cuda-graphs "${G[@]}"
}

matrix_twins() {  # performance.md: "The Lightning twin in these modes"; each pair runs again with the GPUs swapped
  local n=ddp_resnet50.py m="$L --lightning-matched" s=(--batch-size-per-device 32) mode
  two native-2gpu-bf16-256 "${TWO[@]}" $n "${E[@]}"
  two lightning-2gpu-bf16-256-stock "$PY" $L --devices 2 "${E[@]}"
  two lightning-2gpu-bf16-256-matched "$PY" $m --devices 2 "${E[@]}"
  for mode in "256-compile --compile ${E[*]}" "32-graphs ${s[*]} --cuda-graphs ${G[*]}" \
              "32-compile-graphs ${s[*]} --compile --cuda-graphs ${G[*]}"; do
    pair "native-1gpu-bf16-${mode%% *}-gpu0 $PY $n ${mode#* }" "lightning-1gpu-bf16-${mode%% *}-gpu1 $PY $m ${mode#* }"
    pair "lightning-1gpu-bf16-${mode%% *}-gpu0 $PY $m ${mode#* }" "native-1gpu-bf16-${mode%% *}-gpu1 $PY $n ${mode#* }"
  done
  two native-2gpu-bf16-32-compile-graphs "${TWO[@]}" $n "${s[@]}" --compile --cuda-graphs "${G[@]}"
  two lightning-2gpu-bf16-32-compile-graphs "$PY" $m --devices 2 "${s[@]}" --compile --cuda-graphs "${G[@]}"
  two native-2gpu-fp16ls-256-graphs-nobb "${TWO[@]}" $n "${FP16[@]}" --cuda-graphs --no-broadcast-buffers "${G[@]}"
  two lightning-2gpu-fp16ls-256-graphs-nobb "$PY" $m --devices 2 "${FP16[@]}" --cuda-graphs --no-broadcast-buffers \
    "${G[@]}"
}

matrix_sharding() {  # sharding.md: "Measured on 2 x H200"
  local o=oss_benchmark.py w=(--warmup-steps 10 --steps 50) units
  two sharding-2gpu-bf16-256-sgd "${TWO[@]}" $o --strategy all "${w[@]}"
  two sharding-2gpu-bf16-256-adam "${TWO[@]}" $o --strategy all --optimizer adam "${w[@]}"
  two sharding-2gpu-bf16-256-adam-block "${TWO[@]}" $o --strategy all --optimizer adam --fsdp-units block \
    --no-gradient-as-bucket-view "${w[@]}"
  for units in block stage model; do
    two "fsdp-$units" "${TWO[@]}" $o --strategy ddp,fsdp_zero2,fsdp_zero3 --fsdp-units $units "${w[@]}"
  done
  two fsdp-stage-bf16gather "${TWO[@]}" $o --strategy ddp,fsdp_zero2,fsdp_zero3 --fsdp-units stage \
    --fsdp-param-dtype compute "${w[@]}"
  two fsdp2-a "${TWO[@]}" $o --strategy ddp,fsdp_zero2 "${w[@]}"
  two fsdp2-b "${TWO[@]}" $o --strategy ddp,fsdp_zero2 "${w[@]}"
  two sharding-2gpu-preset-fairscale "${TWO[@]}" $o --strategy all --preset fairscale "${w[@]}"
  two sharding-2gpu-preset-fairscale-block "${TWO[@]}" $o --strategy all --preset fairscale --fsdp-units block \
    --no-gradient-as-bucket-view "${w[@]}"
  two sharding-2gpu-preset-epochs "${TWO[@]}" $o --preset fairscale --strategy ddp,oss_ddp,oss_sharded_ddp \
    --warmup-steps 10 --steps 1170 --steps-per-epoch 117
}

probe() {  # probe NAME GPUS COMMAND...: a probe, which names its own outputs (no --output)
  local name=$1 gpus=$2 code
  shift 2
  [ "$gpus" = 0,1 ] && [ "$GPUS" -lt 2 ] && { record "# $name needs two GPUs"; return; }
  record "$([ "$gpus" = 0,1 ] || echo "CUDA_VISIBLE_DEVICES=$gpus ")$*"
  ((DRY)) && return 0
  CUDA_VISIBLE_DEVICES=$gpus "$@" >"$OUT/logs/$name.log" 2>&1
  code=$?
  [ "$code" -eq 0 ] || echo "$name: exit $code" >>"$OUT/failed.txt"
}

matrix_probes() {  # experiments/*/README.md
  local d=$OUT/probes p=experiments/step-profile/probe.py v
  ((DRY)) || mkdir -p "$d"
  probe profile-1gpu 0 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 $p --out "$d" --name profile-1gpu
  probe profile-2gpu 0,1 "${TWO[@]}" $p --out "$d" --name profile-2gpu
  probe profile-2gpu-nobb 0,1 "${TWO[@]}" $p --out "$d" --name profile-2gpu-nobb --no-broadcast-buffers
  probe profile-2gpu-nobb-bf16hook 0,1 "${TWO[@]}" $p --out "$d" --name profile-2gpu-nobb-bf16hook \
    --no-broadcast-buffers --comm-hook bf16_compress
  probe profile-1gpu-compile-cdt 0 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 $p --out "$d" \
    --name profile-1gpu-compile-cdt --compile --coordinate-descent-tuning
  for v in stem-compile-module-module stem-compile-space-to-depth-module stem-compile-module-dense \
           stem-compile-space-to-depth-dense stem-compile-module-module-fp16 stem-compile-space-to-depth-dense-fp16 \
           stem-eager-module-module stem-eager-space-to-depth-module stem-eager-module-dense \
           stem-eager-space-to-depth-dense conv-eager-module conv-eager-space-to-depth; do
    local part=${v%%-*} rest=${v#*-*-} conv maxpool=module precision=bf16
    [[ $rest == *-fp16 ]] && { precision=fp16; rest=${rest%-fp16}; }
    [[ $rest == *-dense || $rest == *-module && $part == stem ]] && { maxpool=${rest##*-}; rest=${rest%-*}; }
    conv=$rest
    probe "$v" 0 "$PY" experiments/stem/stem_probe.py --part "$part" --conv "$conv" --maxpool $maxpool \
      --precision $precision $([[ $v == *-compile-* ]] && echo --compile) --json "$d/$v.json"
  done
  for v in torchvision sums; do probe "bn-$v" 0 "$PY" experiments/batchnorm/bn_probe.py --batch-norm $v \
    --precision fp16 --coordinate-descent-tuning --json "$d/bn-$v-fp16-cdt.json"; done
  probe loop-cost-cuda-bf16 0 "$PY" experiments/lightning-interleaved/hook_profile.py --timing --device cuda \
    --precision bf16 --repeats 5 --output-json "$d/loop-cost-cuda-bf16.json"
}

desync() {  # desync RANK: one rank of a two-rank run started by hand (the line is recorded before it starts)
  local rank=$1
  BACKGROUND=1 LOG=native-2gpu-desync-rank$rank run native-2gpu-desync 0,1 $((rank ? 0 : 3)) MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=29531 WORLD_SIZE=2 RANK=$rank LOCAL_RANK=$rank LOCAL_WORLD_SIZE=2 -- \
    "$PY" ddp_resnet50.py --lr "0.$((rank + 1))" "${E[@]}"
}

matrix_faults() {  # a real fault of each kind: the result's status and the exit code (README, "Exit codes")
  local n=ddp_resnet50.py rank
  [ "$GPUS" -ge 2 ] || { record "# the out-of-memory and desync runs need two GPUs"; return; }
  run native-2gpu-oom 0,1 4 -- "${TWO[@]}" $n --batch-size-per-device 4096 --warmup-steps 1 --steps 1
  for rank in 0 1; do RECORD_ONLY=1 desync $rank; done  # by hand, rank 1 with another learning rate: a real desync
  record wait
  if ((!DRY)); then
    RECORDED=1 desync 0 &
    RECORDED=1 desync 1
    wait
  fi
  run native-1gpu-sigterm 0 143 -- timeout --preserve-status -s TERM 40 "$PY" $n --warmup-steps 10 --steps 100000
}

matrix_twins2() {  # lightning/README.md: Lightning's cost on two GPUs, each variant in turn so that drift hits all
  local n=ddp_resnet50.py round mode args
  for round in a b c; do
    for mode in "256 ${E[*]}" "32 --batch-size-per-device 32 ${E[*]}" "256-compile --compile ${E[*]}"; do
      read -r -a args <<<"${mode#* }"
      two "native-2gpu-bf16-${mode%% *}-$round" "${TWO[@]}" $n "${args[@]}"
      two "lightning-2gpu-bf16-${mode%% *}-stock-$round" "$PY" $L --devices 2 "${args[@]}"
      two "lightning-2gpu-bf16-${mode%% *}-matched-$round" "$PY" $L --lightning-matched --devices 2 "${args[@]}"
    done
  done
}

matrix_slowlink() {  # sharding.md: the fairscale user's link, as near as two NVLinked GPUs get to it
  local o=oss_benchmark.py w=(--warmup-steps 10 --steps 50) link vars
  for link in nvlink "p2p-off NCCL_P2P_DISABLE=1" "p2p-shm-off NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"; do
    read -r -a vars <<<"${link#* }"
    [ "$link" = nvlink ] && vars=()
    run "fairscale-2gpu-${link%% *}" 0,1 0 "${vars[@]}" -- "${TWO[@]}" $o --preset fairscale \
      --strategy ddp,oss_ddp,oss_sharded_ddp "${w[@]}"
    run "sharding-2gpu-${link%% *}" 0,1 0 "${vars[@]}" -- "${TWO[@]}" $o --strategy all "${w[@]}"
  done
}

matrix_defaults2() {  # each script as a user first runs it on two GPUs
  two native-2gpu-default "${TWO[@]}" ddp_resnet50.py
  two lightning-2gpu-default "$PY" $L --devices 2
  two sharding-2gpu-default "${TWO[@]}" oss_benchmark.py
}

comparison() {  # comparison NAME "COMMAND A" "COMMAND B" COMPARE_OPTIONS...: compare.py's rounds into DIR/NAME.rounds
  local name=$1 a=$2 b=$3 code
  shift 3
  record "$PY compare.py --a '$a' --b '$b' $* --output $name.json"
  ((DRY)) && return 0
  "$PY" compare.py --a "$a" --b "$b" "$@" --output "$OUT/$name.json" >"$OUT/logs/$name.log" 2>&1
  code=$?
  echo "exit $code" >>"$OUT/logs/$name.log"
  [ "$code" -eq 0 ] || echo "$name: exit $code, expected 0" >>"$OUT/failed.txt"
}

ONE=(--compile --coordinate-descent-tuning --cuda-graphs --space-to-depth-stem --dense-max-pool-backward
  --sums-batch-norm)  # the fastest mode at the default step counts, with FP16 or in bf16

matrix_compare1() {  # README, performance.md, lightning/README.md: the twin, and the compiled modes, against native
  local n="$PY ddp_resnet50.py" l="$PY $L"
  comparison cmp-twin-vs-native-256 "$n" "$l" --rounds 3
  [ -s "$OUT/failed.txt" ] && return  # the scripts do not run here: the rest would fail as well
  comparison cmp-compile-vs-default "$n" "$n --compile" --rounds 3
  comparison cmp-compile-graphs-vs-default "$n" "$n --compile --cuda-graphs" --rounds 3
  comparison cmp-twin-vs-native-256-compile "$n --compile" "$l --compile" --rounds 3
  one harness-cost-bf16-256 "$PY" tools/harness_cost.py --blocks 10 --block-steps 20
}

matrix_compare2() {  # performance.md: the fastest mode in fp16 (into an empty Inductor cache, then from it), the
  local n="$PY ddp_resnet50.py"  # captured eager step, fp16 with a fixed loss scale
  comparison cmp-fastest-fp16-vs-default "$n" "$n ${FP16[*]} ${ONE[*]}" --rounds 2
  comparison cmp-graphs-vs-default "$n" "$n --cuda-graphs" --rounds 3
  comparison cmp-fp16ls-vs-default "$n" "$n --precision fp16 --loss-scale 1024" --rounds 3
}

matrix_compare3() {  # performance.md, sharding.md: the fastest mode in bf16; the host-bound twin; oss's defaults
  local n="$PY ddp_resnet50.py" s=--batch-size-per-device\ 32
  comparison cmp-fastest-bf16-vs-default "$n" "$n --precision bf16 ${ONE[*]}" --rounds 2
  comparison cmp-twin-vs-native-32 "$n $s" "$PY $L $s" --rounds 8 --until-interval 1.5 --max-minutes 2
  one oss-1gpu-default "$PY" oss_benchmark.py
}

record "# tools/gpu_evidence.sh ${MATRICES[*]}: $(date -u +%F), commit $(git rev-parse --short HEAD 2>/dev/null)"
record "export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off"
for matrix in "${MATRICES[@]}"; do
  ((TELEMETRY && !DRY)) && { nvidia-smi --query-gpu=timestamp,index,uuid,clocks.sm,clocks.mem,power.draw,power.limit,\
temperature.gpu,clocks_event_reasons.active --format=csv -lms 100 >>"$OUT/nvidia-smi.csv" 2>&1 & TELEMETRY_PID=$!; }
  "matrix_$matrix"
  [ -n "${TELEMETRY_PID:-}" ] && { kill "$TELEMETRY_PID" 2>/dev/null; wait "$TELEMETRY_PID" 2>/dev/null; }
  unset TELEMETRY_PID
done
((DRY)) && exit 0
[ -s "$OUT/failed.txt" ] && { cat "$OUT/failed.txt" >&2; exit 1; }
exit 0
