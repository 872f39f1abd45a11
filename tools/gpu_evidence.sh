#!/usr/bin/env bash
# The GPU evidence behind results/: every configuration the README reports, in one call on a
# 2-GPU machine. One-GPU configurations run in pairs, one per GPU, at the same time (each process sees
# only its own GPU); two-GPU configurations run one after another.
#
#   tools/gpu_evidence.sh SECTION... [--out DIR]
#
# Sections: native (issue 2), lightning (issue 3), graphs and compile (issue 7), sharding (issue 4), oom (issue 9);
# the second session's: ddp2 (issue 2), twins2 (issue 3), fsdp (issue 4), compile2 (issue 7), and more below;
# the third session's are scale4, compile4 (its launch-bound pairs did not run: the call's time ran out) and
# final4; the fourth session's next5, twins6, autotune5 and exit6; the fifth session's s8a, s8b and s8c (next7,
# prepared in the fourth, was replaced by s8a and s8c and never run); next9 ran once, inside s12b, and its 2-GPU
# run was cut by the call's time limit;
# the sixth session's s10a, s10b and s10c; the seventh's s11a to s11e; the eighth's s12a and s12b; the ninth's s13a
# to s13c; the tenth's s14a to s14c; the eleventh's s15a to s15e; the twelfth's s16a to s16d; the thirteenth's s17a to s17d; the fourteenth's s18a to s18d; the fifteenth's s19a to s19d; the sixteenth's s20a to s20c.
# Each run writes DIR/results/<name>.json and DIR/logs/<name>.log (with its exit code and duration) and its
# command line to DIR/commands.txt; a summary table is printed last, and the script exits 1 when a run ended
# otherwise than expected (DIR/failed.txt names them). Give each call its own DIR: a result is never overwritten.
# Keep NVLink multicast off (the machine's rule): exported here, inherited by every child process.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT_DIR=${OUT_DIR:-/tmp/gpu-evidence}
sections=()
usage() { echo "gpu_evidence.sh: error: $1 (usage: tools/gpu_evidence.sh SECTION... [--out DIR])" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || usage "--out needs a directory"; OUT_DIR=$2; shift 2 ;;
    *) sections+=("$1"); shift ;;
  esac
done
[ ${#sections[@]} -gt 0 ] || usage "name at least one section"
RES=$OUT_DIR/results LOGS=$OUT_DIR/logs
mkdir -p "$RES" "$LOGS" || usage "$OUT_DIR cannot be made"
rm -f "$OUT_DIR/failed.txt"
PY=${PYTHON:-python3}
TWO=("$PY" -m torch.distributed.run --standalone --nproc-per-node 2)
STEPS=(--warmup-steps 10 --steps 100)
# Issue 7's fastest mode since the thirteenth session (fp16, a fixed loss scale, both stem options), compiled and
# captured, with Inductor's coordinate-descent tuning (TUNED) and without it (UNTUNED)
FAST=(--precision fp16 --loss-scale 1024 --compile --cuda-graphs --warmup-steps 20 --steps 200
  --space-to-depth-stem --dense-max-pool-backward)
TUNED=(--precision fp16 --loss-scale 1024 --compile --coordinate-descent-tuning --cuda-graphs --warmup-steps 20
  --steps 200 --space-to-depth-stem --dense-max-pool-backward)
BEST=("${TUNED[@]}" --sums-batch-norm)  # since the fourteenth session
# interleave.py (docs/diagnostics/lightning-interleaved/) at 32 images per GPU, 80 Lightning blocks of 20 steps
INTERLEAVE=docs/diagnostics/lightning-interleaved/interleave.py
INTERLEAVE_32=(--batch-size-per-device 32 --warmup-steps 20 --block-steps 20 --blocks 80)

run() {  # run NAME GPUS LIMIT_S COMMAND... : one command, its line in commands.txt, its log with exit code and time
  local name=$1 gpus=$2 limit=$3
  shift 3
  local var given="" started=$SECONDS code
  for var in NCCL_MAX_NCHANNELS OMP_NUM_THREADS NCCL_DEBUG NCCL_DEBUG_SUBSYS TORCH_NCCL_HIGH_PRIORITY \
             TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS TORCHINDUCTOR_COORDINATE_DESCENT_TUNING; do  # this run only
    [ -n "${!var:-}" ] && given+="$var=${!var} "
  done
  echo "[$(date -u +%H:%M:%S)] $name (GPU $gpus): $given$*" | tee -a "$OUT_DIR/commands.txt"
  CUDA_VISIBLE_DEVICES=$gpus timeout --kill-after 15 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  code=$?
  echo "exit $code after $((SECONDS - started)) s" >>"$LOGS/$name.log"
  [ "$code" -eq "${EXPECT_EXIT:-0}" ] || echo "$name: exit $code" >>"$OUT_DIR/failed.txt"
}

bench() {  # bench NAME GPUS LIMIT_S COMMAND... : a benchmark run writing RES/NAME.json
  local name=$1
  run "$@" --output "$RES/$name.json"
}

cache_counts() {  # cache_counts DIR...: how many tuned configurations each Inductor cache holds (its autotune
  # cache's best configs), and how many of them coordinate descent found, into DIR/diag/inductor-cache-counts.txt
  local dir
  mkdir -p "$OUT_DIR/diag"
  for dir in "$@"; do
    echo "$dir: $(find "$dir" -name '*.best_config' | wc -l) best configs, $(grep -l '"found_by_coordesc": true' \
      -r "$dir" --include '*.best_config' | wc -l) found by coordinate descent"
  done >>"$OUT_DIR/diag/inductor-cache-counts.txt"
}

pair() {  # pair "NAME LIMIT ARGS..." "NAME LIMIT ARGS...": two one-GPU runs side by side
  local a b
  read -r -a a <<<"$1"
  read -r -a b <<<"$2"
  bench "${a[0]}" 0 "${a[1]}" "$PY" "${a[@]:2}" &
  local first=$!
  bench "${b[0]}" 1 "${b[1]}" "$PY" "${b[@]:2}" &
  wait "$first" $!  # these two only: a bare wait would also wait for the telemetry, which runs until stopped
}

section_native() {
  pair "native-1gpu-bf16-256-a 120 ddp_resnet50.py ${STEPS[*]}" \
       "native-1gpu-bf16-256-b 120 ddp_resnet50.py ${STEPS[*]}"
  pair "native-1gpu-fp32-256 120 ddp_resnet50.py --precision fp32 ${STEPS[*]}" \
       "native-1gpu-bf16-256-compile 300 ddp_resnet50.py --compile ${STEPS[*]}"
  bench native-2gpu-bf16-256-a 0,1 120 "${TWO[@]}" ddp_resnet50.py "${STEPS[@]}"
  bench native-2gpu-bf16-256-b 0,1 120 "${TWO[@]}" ddp_resnet50.py "${STEPS[@]}"
  bench native-2gpu-fp32-256 0,1 120 "${TWO[@]}" ddp_resnet50.py --precision fp32 "${STEPS[@]}"
  bench native-2gpu-bf16-256-compile 0,1 300 "${TWO[@]}" ddp_resnet50.py --compile "${STEPS[@]}"
}

section_lightning() {
  pair "lightning-1gpu-bf16-256 120 lightning/ddp_resnet50.py ${STEPS[*]}" \
       "native-1gpu-bf16-32 120 ddp_resnet50.py --batch-size-per-device 32 ${STEPS[*]}"
  pair "lightning-1gpu-bf16-32 120 lightning/ddp_resnet50.py --batch-size-per-device 32 ${STEPS[*]}" \
       "native-1gpu-bf16-256-c 120 ddp_resnet50.py ${STEPS[*]}"
  bench lightning-2gpu-bf16-256 0,1 150 "$PY" lightning/ddp_resnet50.py --devices 2 "${STEPS[@]}"
  bench native-2gpu-bf16-32 0,1 120 "${TWO[@]}" ddp_resnet50.py --batch-size-per-device 32 "${STEPS[@]}"
  bench lightning-2gpu-bf16-32 0,1 150 "$PY" lightning/ddp_resnet50.py --devices 2 --batch-size-per-device 32 \
    "${STEPS[@]}"
  bench native-2gpu-bf16-256-c 0,1 120 "${TWO[@]}" ddp_resnet50.py "${STEPS[@]}"
}

section_graphs() {
  local graphs=(--cuda-graphs --warmup-steps 20 --steps 100)
  pair "native-1gpu-fp16-256 120 ddp_resnet50.py --precision fp16 ${STEPS[*]}" \
       "native-1gpu-bf16-32-graphs 120 ddp_resnet50.py --batch-size-per-device 32 ${graphs[*]}"
  pair "native-1gpu-bf16-256-graphs 120 ddp_resnet50.py ${graphs[*]}" \
       "native-1gpu-fp16-32-graphs 120 ddp_resnet50.py --precision fp16 --batch-size-per-device 32 ${graphs[*]}"
  bench native-2gpu-bf16-32-graphs 0,1 150 "${TWO[@]}" ddp_resnet50.py --batch-size-per-device 32 "${graphs[@]}"
}

section_compile() {
  local graphs=(--cuda-graphs --warmup-steps 20 --steps 100)
  pair "native-1gpu-fp16-256-compile 300 ddp_resnet50.py --precision fp16 --compile ${STEPS[*]}" \
       "native-1gpu-bf16-32-compile-graphs 300 ddp_resnet50.py --batch-size-per-device 32 --compile ${graphs[*]}"
  pair "native-1gpu-fp16-256-compile-graphs 300 ddp_resnet50.py --precision fp16 --compile ${graphs[*]}" \
       "native-1gpu-bf16-256-compile-graphs 300 ddp_resnet50.py --compile ${graphs[*]}"
  bench native-2gpu-bf16-32-compile-graphs 0,1 300 "${TWO[@]}" ddp_resnet50.py --batch-size-per-device 32 \
    --compile "${graphs[@]}"
}

section_round2() {  # fixes and open questions after the first round (docs/performance.md, lightning/README.md)
  local graphs=(--cuda-graphs --warmup-steps 20 --steps 100)
  # launch-bound configurations alone on the machine: a neighbour's host thread disturbs them
  bench native-1gpu-bf16-32-solo 0 120 "$PY" ddp_resnet50.py --batch-size-per-device 32 "${STEPS[@]}"
  bench lightning-1gpu-bf16-32-solo 0 120 "$PY" lightning/ddp_resnet50.py --batch-size-per-device 32 "${STEPS[@]}"
  bench lightning-2gpu-bf16-256-d 0,1 150 "$PY" lightning/ddp_resnet50.py --devices 2 "${STEPS[@]}"
  bench lightning-2gpu-bf16-32-d 0,1 150 "$PY" lightning/ddp_resnet50.py --devices 2 --batch-size-per-device 32 \
    "${STEPS[@]}"
  bench lightning-2gpu-bf16-256-sigterm-sync 0,1 150 "$PY" lightning/ddp_resnet50.py --devices 2 \
    --lightning-sigterm-sync "${STEPS[@]}"
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV bench native-2gpu-bf16-256-bucket-view 0,1 120 "${TWO[@]}" \
    ddp_resnet50.py --gradient-as-bucket-view "${STEPS[@]}"
  bench native-2gpu-bf16-256-bucket-100 0,1 120 "${TWO[@]}" ddp_resnet50.py --bucket-cap-mb 100 "${STEPS[@]}"
  section_oom
  pair "native-1gpu-fp16-256-d 120 ddp_resnet50.py --precision fp16 ${STEPS[*]}" \
       "native-1gpu-fp16-256-compile 300 ddp_resnet50.py --precision fp16 --compile ${STEPS[*]}"
  pair "native-1gpu-bf16-256-compile-graphs 300 ddp_resnet50.py --compile ${graphs[*]}" \
       "native-1gpu-bf16-32-compile-graphs 300 ddp_resnet50.py --batch-size-per-device 32 --compile ${graphs[*]}"
  bench native-2gpu-bf16-32-compile-graphs 0,1 300 "${TWO[@]}" ddp_resnet50.py --batch-size-per-device 32 \
    --compile "${graphs[@]}"
}

section_twins() {  # native and Lightning back to back on one machine, 2 GPUs, 256 and 32 per GPU
  bench twins-native-2gpu-bf16-256 0,1 120 "${TWO[@]}" ddp_resnet50.py "${STEPS[@]}"
  bench twins-lightning-2gpu-bf16-256 0,1 150 "$PY" lightning/ddp_resnet50.py --devices 2 "${STEPS[@]}"
  bench twins-native-2gpu-bf16-32 0,1 120 "${TWO[@]}" ddp_resnet50.py --batch-size-per-device 32 "${STEPS[@]}"
  bench twins-lightning-2gpu-bf16-32 0,1 150 "$PY" lightning/ddp_resnet50.py --devices 2 --batch-size-per-device 32 \
    "${STEPS[@]}"
}

section_overlap_adam() {  # zero1_overlap with Adam after the fused-Adam fix; PYTHONPATH must hold fairscale
  bench sharding-2gpu-bf16-256-adam-rerun 0,1 120 "${TWO[@]}" oss_benchmark.py --strategy zero1_overlap \
    --optimizer adam --warmup-steps 10 --steps 50
}

section_sharding() {  # every strategy in one launch per optimizer; PYTHONPATH must hold fairscale
  local opt shard=(--warmup-steps 10 --steps 50)
  for opt in sgd adam; do
    bench "sharding-2gpu-bf16-256-$opt" 0,1 200 "${TWO[@]}" oss_benchmark.py --strategy all --optimizer "$opt" \
      "${shard[@]}"
  done
  bench sharding-2gpu-preset-fairscale 0,1 200 "${TWO[@]}" oss_benchmark.py --strategy all --preset fairscale \
    "${shard[@]}"
}

section_ddp2() {  # session 2, issue 2: what is left of the 2-GPU eager scaling loss (~1.5 ms per step)
  pair "ddp2-native-1gpu-bf16-256-gpu0 120 ddp_resnet50.py ${STEPS[*]}" \
       "ddp2-native-1gpu-bf16-256-gpu1 120 ddp_resnet50.py ${STEPS[*]}"
  bench ddp2-native-2gpu-bf16-256-default 0,1 120 "${TWO[@]}" ddp_resnet50.py --no-gradient-as-bucket-view "${STEPS[@]}"
  bench ddp2-native-2gpu-bf16-256-bv 0,1 120 "${TWO[@]}" ddp_resnet50.py --gradient-as-bucket-view "${STEPS[@]}"
  bench ddp2-native-2gpu-bf16-256-bv-nobb 0,1 120 "${TWO[@]}" ddp_resnet50.py --gradient-as-bucket-view \
    --no-broadcast-buffers "${STEPS[@]}"
  NCCL_MAX_NCHANNELS=4 bench ddp2-native-2gpu-bf16-256-bv-nch4 0,1 120 "${TWO[@]}" ddp_resnet50.py \
    --gradient-as-bucket-view "${STEPS[@]}"
  bench ddp2-native-2gpu-bf16-256-bv-static 0,1 120 "${TWO[@]}" ddp_resnet50.py --gradient-as-bucket-view \
    --static-graph "${STEPS[@]}"
}

section_twins2() {  # session 2, issue 3: the Lightning launcher against torchrun, with the DDP options of ddp2
  bench twins2-lightning-2gpu-bf16-256-bv 0,1 150 "$PY" lightning/ddp_resnet50.py --devices 2 \
    --gradient-as-bucket-view "${STEPS[@]}"
  bench twins2-lightning-torchrun-2gpu-bf16-256-bv 0,1 150 "${TWO[@]}" lightning/ddp_resnet50.py --devices 2 \
    --gradient-as-bucket-view "${STEPS[@]}"
  OMP_NUM_THREADS=1 bench twins2-lightning-omp1-2gpu-bf16-256-bv 0,1 150 "$PY" lightning/ddp_resnet50.py \
    --devices 2 --gradient-as-bucket-view "${STEPS[@]}"
  bench twins2-native-2gpu-bf16-256-bv 0,1 120 "${TWO[@]}" ddp_resnet50.py --gradient-as-bucket-view "${STEPS[@]}"
}

section_fsdp() {  # session 2, issue 4: FSDP2 units and all-gather dtype; PYTHONPATH must hold fairscale
  local shard=(--warmup-steps 10 --steps 50)
  bench fsdp-stage 0,1 200 "${TWO[@]}" oss_benchmark.py --strategy ddp,fsdp_zero2,fsdp_zero3 --fsdp-units stage \
    "${shard[@]}"
  bench fsdp-model 0,1 150 "${TWO[@]}" oss_benchmark.py --strategy fsdp_zero2,fsdp_zero3 --fsdp-units model \
    "${shard[@]}"
  bench fsdp-stage-bf16gather 0,1 150 "${TWO[@]}" oss_benchmark.py --strategy fsdp_zero2,fsdp_zero3 \
    --fsdp-units stage --fsdp-param-dtype compute "${shard[@]}"
}

section_compile2() {  # session 2, issue 7: batch 512, fp16 with a fixed loss scale, compiled DDP on 2 GPUs
  local graphs=(--cuda-graphs --warmup-steps 20 --steps 100)
  pair "compile2-native-1gpu-bf16-512-compile-graphs 300 ddp_resnet50.py --batch-size-per-device 512 --compile ${graphs[*]}" \
       "compile2-native-1gpu-fp16ls-256-compile-graphs 300 ddp_resnet50.py --precision fp16 --loss-scale 1024 --compile ${graphs[*]}"
  bench compile2-native-2gpu-bf16-256-compile-bv-noopt 0,1 300 "${TWO[@]}" ddp_resnet50.py --compile \
    --gradient-as-bucket-view --compiled-ddp no_optimization "${STEPS[@]}"
  bench compile2-native-2gpu-bf16-256-compile-bv 0,1 300 "${TWO[@]}" ddp_resnet50.py --compile \
    --gradient-as-bucket-view "${STEPS[@]}"
  bench compile2-native-2gpu-bf16-256-compile-graphs-bv 0,1 300 "${TWO[@]}" ddp_resnet50.py --compile \
    --gradient-as-bucket-view "${graphs[@]}"
}

section_lprobe() {  # session 2, issue 3 diagnosis: Lightning's DDP with one of its setup details changed
  cat >/tmp/lprobe.py <<'PYEOF'
import os, runpy, sys
import torch
from torch.nn.parallel import DistributedDataParallel
from lightning.pytorch.strategies import DDPStrategy
mode = sys.argv.pop(1)
if mode == "nostream":  # DDP built on the current stream, as native (Lightning builds it on a side stream)
    DDPStrategy._setup_model = lambda self, model: DistributedDataParallel(
        module=model, device_ids=self.determine_ddp_device_ids(), **self._ddp_kwargs)
if mode == "deviceid":  # NCCL initialised eagerly with the device, as native
    original = torch.distributed.init_process_group
    def init(*args, **kwargs):
        kwargs.setdefault("device_id", torch.device("cuda", int(os.environ["LOCAL_RANK"])))
        return original(*args, **kwargs)
    torch.distributed.init_process_group = init
sys.argv[0] = "lightning/ddp_resnet50.py"
runpy.run_path("lightning/ddp_resnet50.py", run_name="__main__")
PYEOF
  bench lprobe-lightning-2gpu-bf16-256-bv-nostream 0,1 150 "${TWO[@]}" /tmp/lprobe.py nostream --devices 2 \
    --gradient-as-bucket-view "${STEPS[@]}"
  bench lprobe-lightning-2gpu-bf16-256-bv-deviceid 0,1 150 "${TWO[@]}" /tmp/lprobe.py deviceid --devices 2 \
    --gradient-as-bucket-view "${STEPS[@]}"
}

section_ddp3() {  # session 2, issue 2: smaller buckets shorten the all-reduce left after backward
  bench ddp3-native-2gpu-bf16-256-bv-nobb-b10 0,1 120 "${TWO[@]}" ddp_resnet50.py --gradient-as-bucket-view \
    --no-broadcast-buffers --bucket-cap-mb 10 "${STEPS[@]}"
  bench ddp3-native-2gpu-bf16-256-bv-b10 0,1 120 "${TWO[@]}" ddp_resnet50.py --gradient-as-bucket-view \
    --bucket-cap-mb 10 "${STEPS[@]}"
}

section_fsdp2() {  # session 2, issue 4: one FSDP unit with the all-gather in bf16
  bench fsdp2-model-bf16gather 0,1 150 "${TWO[@]}" oss_benchmark.py --strategy fsdp_zero2,fsdp_zero3 \
    --fsdp-units model --fsdp-param-dtype compute --warmup-steps 10 --steps 50
}

section_final2() {  # session 2: the new defaults (gradient_as_bucket_view, one FSDP unit), twice where it matters
  pair "final2-native-1gpu-bf16-256 120 ddp_resnet50.py ${STEPS[*]}" \
       "final2-native-1gpu-bf16-256-compile 300 ddp_resnet50.py --compile ${STEPS[*]}"
  bench final2-native-2gpu-bf16-256 0,1 120 "${TWO[@]}" ddp_resnet50.py "${STEPS[@]}"
  bench final2-lightning-2gpu-bf16-256 0,1 150 "$PY" lightning/ddp_resnet50.py --devices 2 "${STEPS[@]}"
  bench final2-sharding-2gpu-bf16-256-sgd 0,1 200 "${TWO[@]}" oss_benchmark.py --strategy all --warmup-steps 10 \
    --steps 50
  bench final2-sharding-2gpu-bf16-256-adam 0,1 150 "${TWO[@]}" oss_benchmark.py --strategy ddp,fsdp_zero2,fsdp_zero3 \
    --optimizer adam --warmup-steps 10 --steps 50
  bench final2-lightning-2gpu-bf16-256-compile 0,1 300 "$PY" lightning/ddp_resnet50.py --devices 2 --compile \
    "${STEPS[@]}"
  bench final2-native-2gpu-bf16-256-compile-noopt 0,1 300 "${TWO[@]}" ddp_resnet50.py --compile \
    --compiled-ddp no_optimization "${STEPS[@]}"
}

section_fsdp3() {  # session 2, issue 4: fsdp_zero2 with Adam again (its first run had a 4 % MAD)
  bench fsdp3-sharding-2gpu-bf16-256-adam 0,1 120 "${TWO[@]}" oss_benchmark.py --strategy ddp,fsdp_zero2 \
    --optimizer adam --warmup-steps 10 --steps 50
}

section_scale4() {  # session 3, issues 2 and 3: twins at 256 and 32, what is left of 2-GPU scaling, profiles
  local d=$OUT_DIR/diagnostics probe=docs/diagnostics/ddp-scaling/probe.py
  mkdir -p "$d"
  pair "s4-native-1gpu-bf16-256-gpu0 120 ddp_resnet50.py ${STEPS[*]}" \
       "s4-native-1gpu-bf16-256-gpu1 120 ddp_resnet50.py ${STEPS[*]}"
  bench s4-native-2gpu-bf16-256-a 0,1 120 "${TWO[@]}" ddp_resnet50.py "${STEPS[@]}"
  bench s4-lightning-2gpu-bf16-256-a 0,1 150 "$PY" lightning/ddp_resnet50.py --devices 2 "${STEPS[@]}"
  bench s4-lightning-2gpu-bf16-256-b 0,1 150 "$PY" lightning/ddp_resnet50.py --devices 2 "${STEPS[@]}"
  bench s4-native-2gpu-bf16-256-b 0,1 120 "${TWO[@]}" ddp_resnet50.py "${STEPS[@]}"
  # launch-bound: alone on the machine, native and Lightning in the order A B B A
  bench s4-native-1gpu-bf16-32-a 0 120 "$PY" ddp_resnet50.py --batch-size-per-device 32 "${STEPS[@]}"
  bench s4-lightning-1gpu-bf16-32-a 0 120 "$PY" lightning/ddp_resnet50.py --batch-size-per-device 32 "${STEPS[@]}"
  bench s4-lightning-1gpu-bf16-32-b 0 120 "$PY" lightning/ddp_resnet50.py --batch-size-per-device 32 "${STEPS[@]}"
  bench s4-native-1gpu-bf16-32-b 0 120 "$PY" ddp_resnet50.py --batch-size-per-device 32 "${STEPS[@]}"
  # 2-GPU scaling candidates (an environment variable's run goes to diagnostics: its config does not show it)
  bench s4-native-2gpu-bf16-256-nobb 0,1 120 "${TWO[@]}" ddp_resnet50.py --no-broadcast-buffers "${STEPS[@]}"
  bench s4-native-2gpu-bf16-256-nobb-b10 0,1 120 "${TWO[@]}" ddp_resnet50.py --no-broadcast-buffers \
    --bucket-cap-mb 10 "${STEPS[@]}"
  TORCH_NCCL_HIGH_PRIORITY=1 bench s4-native-2gpu-bf16-256-hiprio 0,1 120 "${TWO[@]}" ddp_resnet50.py "${STEPS[@]}"
  mv "$RES/s4-native-2gpu-bf16-256-hiprio.json" "$d/" 2>/dev/null
  # kernel-level profiles of the same step on 1 and 2 GPUs; host profiles of the twins at 32 per GPU
  run profile-1gpu 0 120 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 $probe --out "$d" \
    --name profile-1gpu
  run profile-2gpu 0,1 120 "${TWO[@]}" $probe --out "$d" --name profile-2gpu
  bench s4-cprofile-native-1gpu-bf16-32 0 120 "$PY" -m cProfile -o "$d/native-1gpu-bf16-32.prof" ddp_resnet50.py \
    --batch-size-per-device 32 "${STEPS[@]}"
  bench s4-cprofile-lightning-1gpu-bf16-32 0 150 "$PY" -m cProfile -o "$d/lightning-1gpu-bf16-32.prof" \
    lightning/ddp_resnet50.py --batch-size-per-device 32 "${STEPS[@]}"
  mv "$RES"/s4-cprofile-*.json "$d/" 2>/dev/null
  "$PY" $probe --compare "$d/profile-1gpu-rank0.json" "$d/profile-2gpu-rank0.json" | tee "$d/profile-compare.txt"
  gzip -f "$d"/*.trace.json
}

section_compile4() {  # session 3, issues 7 and 3: compiled scaling and twins, launch-bound twins side by side
  local graphs=(--cuda-graphs --warmup-steps 20 --steps 100)
  pair "c4-native-1gpu-bf16-256-compile 300 ddp_resnet50.py --compile ${STEPS[*]}" \
       "c4-native-1gpu-bf16-256-compile-graphs 300 ddp_resnet50.py --compile ${graphs[*]}"
  bench c4-native-2gpu-bf16-256-compile-noopt 0,1 300 "${TWO[@]}" ddp_resnet50.py --compile \
    --compiled-ddp no_optimization "${STEPS[@]}"
  bench c4-lightning-2gpu-bf16-256-compile 0,1 300 "$PY" lightning/ddp_resnet50.py --devices 2 --compile "${STEPS[@]}"
  bench c4-native-2gpu-bf16-256-compile-noopt-nobb 0,1 300 "${TWO[@]}" ddp_resnet50.py --compile \
    --compiled-ddp no_optimization --no-broadcast-buffers "${STEPS[@]}"
  bench c4-native-2gpu-bf16-256-compile-noopt-graphs 0,1 300 "${TWO[@]}" ddp_resnet50.py --compile \
    --compiled-ddp no_optimization "${graphs[@]}"
  # 32 per GPU is bound by the host, whose speed drifts within a run: the twins run at the same time, one per
  # GPU, so that both see the same host, then swap GPUs
  pair "c4-native-1gpu-bf16-32-gpu0 120 ddp_resnet50.py --batch-size-per-device 32 ${STEPS[*]}" \
       "c4-lightning-1gpu-bf16-32-gpu1 120 lightning/ddp_resnet50.py --batch-size-per-device 32 ${STEPS[*]}"
  pair "c4-lightning-1gpu-bf16-32-gpu0 120 lightning/ddp_resnet50.py --batch-size-per-device 32 ${STEPS[*]}" \
       "c4-native-1gpu-bf16-32-gpu1 120 ddp_resnet50.py --batch-size-per-device 32 ${STEPS[*]}"
}

section_final4() {  # session 3, last call: launch-bound twins (issue 3), compiled scaling again (7), sharding (4)
  local graphs=(--cuda-graphs --warmup-steps 20 --steps 100) shard=(--warmup-steps 10 --steps 50)
  # 32 per GPU is bound by the host, whose speed drifts within a run: on 1 GPU the twins run at the same
  # time, one per GPU, so that both see the same host, then swap GPUs; on 2 GPUs they alternate
  pair "f4-native-1gpu-bf16-32-gpu0 120 ddp_resnet50.py --batch-size-per-device 32 ${STEPS[*]}" \
       "f4-lightning-1gpu-bf16-32-gpu1 120 lightning/ddp_resnet50.py --batch-size-per-device 32 ${STEPS[*]}"
  pair "f4-lightning-1gpu-bf16-32-gpu0 120 lightning/ddp_resnet50.py --batch-size-per-device 32 ${STEPS[*]}" \
       "f4-native-1gpu-bf16-32-gpu1 120 ddp_resnet50.py --batch-size-per-device 32 ${STEPS[*]}"
  local run
  for run in a b; do
    bench "f4-native-2gpu-bf16-32-$run" 0,1 120 "${TWO[@]}" ddp_resnet50.py --batch-size-per-device 32 "${STEPS[@]}"
    bench "f4-lightning-2gpu-bf16-32-$run" 0,1 150 "$PY" lightning/ddp_resnet50.py --devices 2 \
      --batch-size-per-device 32 "${STEPS[@]}"
  done
  bench f4-native-2gpu-bf16-256-compile-noopt-nobb 0,1 300 "${TWO[@]}" ddp_resnet50.py --compile \
    --compiled-ddp no_optimization --no-broadcast-buffers "${STEPS[@]}"
  bench f4-sharding-2gpu-preset-fairscale 0,1 200 "${TWO[@]}" oss_benchmark.py --strategy all --preset fairscale \
    "${shard[@]}"
  bench f4-sharding-2gpu-bf16-256-sgd 0,1 200 "${TWO[@]}" oss_benchmark.py --strategy all "${shard[@]}"
  bench f4-native-2gpu-bf16-256-compile-noopt-graphs-nobb 0,1 300 "${TWO[@]}" ddp_resnet50.py --compile \
    --compiled-ddp no_optimization --no-broadcast-buffers "${graphs[@]}"
}

section_next5() {  # session 4, call 1: eager CUDA graphs on 2 GPUs (2), compiled twins (3, 7), sharding host cost (4)
  local graphs=(--cuda-graphs --warmup-steps 20 --steps 100) shard=(--warmup-steps 10 --steps 50) run
  # issue 2: CUDA graphs remove the launch gaps of DDP's extra kernels (docs/diagnostics/ddp-scaling/)
  pair "n5-native-1gpu-bf16-256-graphs-gpu0 120 ddp_resnet50.py ${graphs[*]}" \
       "n5-native-1gpu-bf16-256-graphs-gpu1 120 ddp_resnet50.py ${graphs[*]}"
  bench n5-native-2gpu-bf16-256-graphs 0,1 150 "${TWO[@]}" ddp_resnet50.py "${graphs[@]}"
  bench n5-native-2gpu-bf16-256-graphs-nobb 0,1 150 "${TWO[@]}" ddp_resnet50.py --no-broadcast-buffers "${graphs[@]}"
  # issues 3 and 7: the compiled twins twice, alternating (the first compile fills the cache for the others)
  for run in a b; do
    bench "n5-native-2gpu-bf16-256-compile-noopt-$run" 0,1 300 "${TWO[@]}" ddp_resnet50.py --compile \
      --compiled-ddp no_optimization "${STEPS[@]}"
    bench "n5-lightning-2gpu-bf16-256-compile-noopt-$run" 0,1 300 "$PY" lightning/ddp_resnet50.py --devices 2 \
      --compile --compiled-ddp no_optimization "${STEPS[@]}"
  done
  # issue 4: the suite again, now with each strategy's host cost per phase (analysis.host_phases_ms)
  bench n5-sharding-2gpu-bf16-256-sgd 0,1 200 "${TWO[@]}" oss_benchmark.py --strategy all "${shard[@]}"
}

section_exit6() {  # session 4, last call: a 2-GPU --cuda-graphs run must now exit (next5's two hung after writing
  # their results: pytorch#115388), and the compiled Lightning twin's second run (next5's ran out of time)
  local graphs=(--cuda-graphs --warmup-steps 20 --steps 100)
  bench e6-native-2gpu-bf16-256-graphs 0,1 90 "${TWO[@]}" ddp_resnet50.py "${graphs[@]}"
  bench e6-lightning-2gpu-bf16-256-compile-noopt-b 0,1 200 "$PY" lightning/ddp_resnet50.py --devices 2 \
    --compile --compiled-ddp no_optimization "${STEPS[@]}"
  bench e6-native-2gpu-bf16-256-compile-noopt-c 0,1 100 "${TWO[@]}" ddp_resnet50.py --compile \
    --compiled-ddp no_optimization "${STEPS[@]}"
}

section_s8a() {  # session 5, call 1 (issue 7): max-autotune end to end with the convolutions left to cuDNN
  # (autotune5 spent its 7 minutes autotuning convolutions that cuDNN won every time) on GPU 0; on GPU 1 the
  # default compiled reference, then the default mode with Inductor's coordinate-descent tuning of its Triton
  # kernels (which max-autotune also turns on), one after the other on the same GPU
  local graphs=(--cuda-graphs --warmup-steps 20 --steps 100)
  TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS=ATEN bench s8-native-1gpu-bf16-256-autotune-gemm-graphs 0 500 "$PY" \
    ddp_resnet50.py --compile-mode max-autotune-no-cudagraphs "${graphs[@]}" &
  { bench s8-native-1gpu-bf16-256-compile-graphs 1 200 "$PY" ddp_resnet50.py --compile "${graphs[@]}"
    TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 bench s8-native-1gpu-bf16-256-compile-cdt-graphs 1 290 "$PY" \
      ddp_resnet50.py --compile "${graphs[@]}"
  } &
  wait
}

section_s8b() {  # session 5, call 2: eager scaling with cuDNN's heuristics instead of per-process autotuning
  # (issue 2: the profile saw the two ranks pick different algorithms and the step run at the slower rank's
  # pace), against the defaults on the same machine; then the fairscale preset with and without each rank bound
  # to its own cores, and fsdp_zero2 launches (issue 4)
  pair "s8-native-1gpu-bf16-256-heur-gpu0 120 ddp_resnet50.py --no-cudnn-benchmark ${STEPS[*]}" \
       "s8-native-1gpu-bf16-256-heur-gpu1 120 ddp_resnet50.py --no-cudnn-benchmark ${STEPS[*]}"
  pair "s8-native-1gpu-bf16-256-gpu0 120 ddp_resnet50.py ${STEPS[*]}" \
       "s8-native-1gpu-bf16-256-gpu1 120 ddp_resnet50.py ${STEPS[*]}"
  bench s8-native-2gpu-bf16-256-heur 0,1 120 "${TWO[@]}" ddp_resnet50.py --no-cudnn-benchmark "${STEPS[@]}"
  bench s8-native-2gpu-bf16-256-heur-nobb 0,1 120 "${TWO[@]}" ddp_resnet50.py --no-cudnn-benchmark \
    --no-broadcast-buffers "${STEPS[@]}"
  bench s8-native-2gpu-bf16-256 0,1 120 "${TWO[@]}" ddp_resnet50.py "${STEPS[@]}"
  bench s8-native-2gpu-bf16-256-nobb 0,1 120 "${TWO[@]}" ddp_resnet50.py --no-broadcast-buffers "${STEPS[@]}"
  local bind=()
  "${TWO[@]}" --help 2>/dev/null | grep -q -- --numa-binding && bind=(--numa-binding exclusive)
  echo "# s8b binding: ${bind[*]:-torchrun has no --numa-binding}" >>"$OUT_DIR/commands.txt"
  local bound=("${TWO[@]:0:4}" "${bind[@]}" "${TWO[@]:4}")  # torchrun with its options, binding included
  local preset=(--preset fairscale --strategy ddp,oss_ddp,oss_sharded_ddp --warmup-steps 10 --steps 100)
  bench s8-sharding-2gpu-preset-bound-a 0,1 150 "${bound[@]}" oss_benchmark.py "${preset[@]}"
  bench s8-sharding-2gpu-preset 0,1 150 "${TWO[@]}" oss_benchmark.py "${preset[@]}"
  bench s8-sharding-2gpu-preset-bound-b 0,1 150 "${bound[@]}" oss_benchmark.py "${preset[@]}"
  bench s8-sharding-2gpu-bf16-256-fsdp2-a 0,1 150 "${TWO[@]}" oss_benchmark.py --strategy ddp,fsdp_zero2 \
    --warmup-steps 10 --steps 50
  bench s8-sharding-2gpu-bf16-256-fsdp2-bound 0,1 150 "${bound[@]}" oss_benchmark.py \
    --strategy ddp,fsdp_zero2 --warmup-steps 10 --steps 50
}

section_s8c() {  # session 5, call 3: the reducer traced into the compiled backward (issue 7) against
  # no_optimization on the same machine; the compiled twins at 32 per GPU on one GPU, side by side and swapped
  # (issue 3: in case compiling took the host out of the step; it did not, the compiled step stayed host-bound)
  bench s8-native-2gpu-bf16-256-compile-noopt 0,1 200 "${TWO[@]}" ddp_resnet50.py --compile \
    --compiled-ddp no_optimization "${STEPS[@]}"
  bench s8-native-2gpu-bf16-256-compile-pyreducer 0,1 280 "${TWO[@]}" ddp_resnet50.py --compile \
    --compiled-ddp python_reducer "${STEPS[@]}"
  local small=(--compile --batch-size-per-device 32 --warmup-steps 10 --steps 300)
  bench s8-native-1gpu-bf16-32-compile-gpu0 0 150 "$PY" ddp_resnet50.py "${small[@]}" &
  bench s8-lightning-1gpu-bf16-32-compile-gpu1 1 150 "$PY" lightning/ddp_resnet50.py "${small[@]}" &
  wait
  bench s8-lightning-1gpu-bf16-32-compile-gpu0 0 150 "$PY" lightning/ddp_resnet50.py "${small[@]}" &
  bench s8-native-1gpu-bf16-32-compile-gpu1 1 150 "$PY" ddp_resnet50.py "${small[@]}" &
  wait
}

section_next9() {  # run once, in the eighth session as s12b (its 2-GPU run was cut) (issue 7): compiled 2-GPU scaling with
  # coordinate-descent tuning, against tuned one-GPU runs on both GPUs of the same machine. Two ranks tuning cold
  # outlasted 200 s in the fifth session: the one-GPU pair fills the Inductor cache first, and the limit is longer.
  local tuned=(--compile --coordinate-descent-tuning "${STEPS[@]}")
  pair "n9-native-1gpu-bf16-256-compile-cdt-gpu0 400 ddp_resnet50.py ${tuned[*]}" \
       "n9-native-1gpu-bf16-256-compile-cdt-gpu1 400 ddp_resnet50.py ${tuned[*]}"
  bench n9-native-2gpu-bf16-256-compile-cdt-noopt 0,1 450 "${TWO[@]}" ddp_resnet50.py --compiled-ddp no_optimization \
    "${tuned[@]}"
  bench n9-native-2gpu-bf16-256-compile-cdt-noopt-nobb 0,1 300 "${TWO[@]}" ddp_resnet50.py \
    --compiled-ddp no_optimization --no-broadcast-buffers "${tuned[@]}"
}

telemetry() {  # telemetry start|stop: nvidia-smi every 100 ms into DIR/nvidia-smi.csv (clocks, power, the
  # throttle reasons), to line up with each result's throughput.rank0_timed_window_utc (tools/telemetry.py)
  if [ "$1" = start ]; then
    nvidia-smi --query-gpu=timestamp,index,uuid,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active \
      --format=csv -lms 100 >>"$OUT_DIR/nvidia-smi.csv" 2>&1 &
    TELEMETRY_PID=$!
  else
    kill "${TELEMETRY_PID:-}" 2>/dev/null; wait "${TELEMETRY_PID:-}" 2>/dev/null
  fi
}

section_s12a() {  # session 8, calls 1 (hung after its first pair, before pair() waited for its own runs only)
  # and 2 (issue 7, issue 2): why compiled 2-GPU steps scale 95.6-97.3 %. Longer timed
  # windows (300 steps) under 100 ms GPU telemetry, to compare each run's SM clock and power cap with its one-GPU
  # pair; the DDP tail after a compiled backward timed alone (tail_probe.py, fp32 and bf16 all-reduce); eager too.
  local c=(--compile --warmup-steps 10 --steps 300) e=(--warmup-steps 10 --steps 300)
  local noopt=(--compiled-ddp no_optimization --no-broadcast-buffers) tail=docs/diagnostics/compiled-scaling/tail_probe.py
  mkdir -p "$OUT_DIR/diag"
  telemetry start
  pair "s12-native-1gpu-bf16-256-compile-gpu0 300 ddp_resnet50.py ${c[*]}" \
       "s12-native-1gpu-bf16-256-compile-gpu1 300 ddp_resnet50.py ${c[*]}"
  bench s12-native-2gpu-bf16-256-compile-noopt-nobb 0,1 300 "${TWO[@]}" ddp_resnet50.py "${noopt[@]}" "${c[@]}"
  run s12-tail-fp32-25mb 0,1 90 "${TWO[@]}" "$tail" --json "$OUT_DIR/diag/tail-fp32-25mb.json"
  run s12-tail-bf16-25mb 0,1 90 "${TWO[@]}" "$tail" --hook bf16 --json "$OUT_DIR/diag/tail-bf16-25mb.json"
  run s12-tail-fp32-100mb 0,1 90 "${TWO[@]}" "$tail" --bucket-cap-mb 100 --json "$OUT_DIR/diag/tail-fp32-100mb.json"
  pair "s12-native-1gpu-bf16-256-compile-gpu0-b 200 ddp_resnet50.py ${c[*]}" \
       "s12-native-1gpu-bf16-256-compile-gpu1-b 200 ddp_resnet50.py ${c[*]}"
  bench s12-native-2gpu-bf16-256-compile-noopt-nobb-b 0,1 200 "${TWO[@]}" ddp_resnet50.py "${noopt[@]}" "${c[@]}"
  pair "s12-native-1gpu-bf16-256-gpu0 120 ddp_resnet50.py ${e[*]}" \
       "s12-native-1gpu-bf16-256-gpu1 120 ddp_resnet50.py ${e[*]}"
  bench s12-native-2gpu-bf16-256-nobb 0,1 120 "${TWO[@]}" ddp_resnet50.py --no-broadcast-buffers "${e[@]}"
  bench s12-native-2gpu-bf16-256-nobb-b 0,1 120 "${TWO[@]}" ddp_resnet50.py --no-broadcast-buffers "${e[@]}"
  telemetry stop
}

section_s12b() {  # session 8, call 3 (issue 7): next9 (compiled 2-GPU scaling with coordinate-descent tuning)
  # under the same telemetry
  telemetry start
  section_next9
  telemetry stop
}

fsdp2_rounds() {  # fsdp2_rounds PREFIX: three ddp,fsdp_zero2 launches (issue 4's fsdp_zero2 >= 95 % of ddp), one call
  local round
  for round in a b c; do
    bench "$1-sharding-2gpu-bf16-256-fsdp2-$round" 0,1 120 "${TWO[@]}" oss_benchmark.py --strategy ddp,fsdp_zero2 \
      --warmup-steps 10 --steps 50
  done
}

section_s15a() {  # session 11, call 1 (issues 3, 4 and 7): the twin's fp16 with native's fixed --loss-scale (Lightning's
  # fp16 plugin with FixedLossScaler) against native, captured at 256 and 32 per GPU, compiled and captured, and
  # uncaptured (automatic optimization); the launch-bound 1-GPU ratio at 32 measured in one process, Lightning and
  # native blocks interleaved (docs/diagnostics/lightning-interleaved/); three more ddp,fsdp_zero2 launches.
  local f=(--precision fp16 --loss-scale 1024) g=(--cuda-graphs --warmup-steps 20 --steps 200)
  local g32=(--batch-size-per-device 32 --cuda-graphs --warmup-steps 20 --steps 300) e=(--warmup-steps 10 --steps 200)
  local c=(--compile --cuda-graphs --warmup-steps 20 --steps 200) nobb=--no-broadcast-buffers
  local n=s15-native l=s15-lightning L=lightning/ddp_resnet50.py il=$INTERLEAVE
  mkdir -p "$OUT_DIR/diag"
  telemetry start
  pair "$n-1gpu-fp16ls-256-graphs-gpu0 150 ddp_resnet50.py ${f[*]} ${g[*]}" "$l-1gpu-fp16ls-256-graphs-gpu1 150 $L ${f[*]} ${g[*]}"
  pair "$l-1gpu-fp16ls-256-graphs-gpu0 150 $L ${f[*]} ${g[*]}" "$n-1gpu-fp16ls-256-graphs-gpu1 150 ddp_resnet50.py ${f[*]} ${g[*]}"
  pair "$n-1gpu-fp16ls-32-graphs-gpu0 150 ddp_resnet50.py ${f[*]} ${g32[*]}" "$l-1gpu-fp16ls-32-graphs-gpu1 150 $L ${f[*]} ${g32[*]}"
  pair "$l-1gpu-fp16ls-32-graphs-gpu0 150 $L ${f[*]} ${g32[*]}" "$n-1gpu-fp16ls-32-graphs-gpu1 150 ddp_resnet50.py ${f[*]} ${g32[*]}"
  bench "$n-2gpu-fp16ls-256-graphs-nobb" 0,1 150 "${TWO[@]}" ddp_resnet50.py "$nobb" "${f[@]}" "${g[@]}"
  bench "$l-2gpu-fp16ls-256-graphs-nobb" 0,1 150 "$PY" "$L" --devices 2 "$nobb" "${f[@]}" "${g[@]}"
  pair "$l-1gpu-fp16ls-256-gpu0 120 $L ${f[*]} ${e[*]}" "$n-1gpu-fp16ls-256-gpu1 120 ddp_resnet50.py ${f[*]} ${e[*]}"
  run s15-interleave-1gpu-bf16-32 0 150 "$PY" "$il" --batch-size-per-device 32 --warmup-steps 20 --block-steps 20 \
    --blocks 40 --output-json "$OUT_DIR/diag/interleave-1gpu-bf16-32.json"
  pair "$n-1gpu-fp16ls-256-compile-graphs-gpu0 300 ddp_resnet50.py ${f[*]} ${c[*]}" "$l-1gpu-fp16ls-256-compile-graphs-gpu1 300 $L ${f[*]} ${c[*]}"
  fsdp2_rounds s15
  telemetry stop
}

section_s15b() {  # session 11, call 1 (issue 7): does PyTorch's ddp_optimizer with 50 MB buckets, captured, scale the
  # compiled step better than no_optimization (it overlaps the first bucket's all-reduce with the backward, and the
  # capture removes the host cost of its graph pieces)? One-GPU pairs before and after. (Two runs of an interleaving
  # diagnostic, prepared under another name, followed and exited at once: the file was not in the tree yet.)
  local c=(--compile --cuda-graphs --warmup-steps 20 --steps 300) nobb=--no-broadcast-buffers
  local n=s15-native-2gpu-bf16-256-compile-graphs
  telemetry start
  pair "s15-native-1gpu-bf16-256-compile-graphs-gpu0 300 ddp_resnet50.py ${c[*]}" \
       "s15-native-1gpu-bf16-256-compile-graphs-gpu1 300 ddp_resnet50.py ${c[*]}"
  bench "$n-noopt-nobb" 0,1 240 "${TWO[@]}" ddp_resnet50.py --compiled-ddp no_optimization "$nobb" "${c[@]}"
  bench "$n-ddpopt-b50-nobb" 0,1 240 "${TWO[@]}" ddp_resnet50.py --compiled-ddp ddp_optimizer --bucket-cap-mb 50 \
    "$nobb" "${c[@]}"
  pair "s15-native-1gpu-bf16-256-compile-graphs-gpu0-b 240 ddp_resnet50.py ${c[*]}" \
       "s15-native-1gpu-bf16-256-compile-graphs-gpu1-b 240 ddp_resnet50.py ${c[*]}"
  telemetry stop
}

section_s15c() {  # session 11, call 3 (issue 3): the interleaved Lightning/native measurement again (the same command
  # twice before believing it), at 256 per GPU as its control (where separate runs agree: 0.99-1.00), and on 2 GPUs.
  local il=$INTERLEAVE
  mkdir -p "$OUT_DIR/diag"
  telemetry start
  run s15-interleave-1gpu-bf16-32-b 0 150 "$PY" "$il" --batch-size-per-device 32 --warmup-steps 20 --block-steps 20 \
    --blocks 40 --output-json "$OUT_DIR/diag/interleave-1gpu-bf16-32-b.json"
  run s15-interleave-1gpu-bf16-256 0 150 "$PY" "$il" --warmup-steps 10 --block-steps 10 --blocks 15 \
    --output-json "$OUT_DIR/diag/interleave-1gpu-bf16-256.json"
  run s15-interleave-2gpu-bf16-32 0,1 150 "${TWO[@]}" "$il" --devices 2 --batch-size-per-device 32 --warmup-steps 20 \
    --block-steps 20 --blocks 40 --output-json "$OUT_DIR/diag/interleave-2gpu-bf16-32.json"
  run s15-interleave-1gpu-bf16-32-c 1 150 "$PY" "$il" --batch-size-per-device 32 --warmup-steps 20 --block-steps 20 \
    --blocks 40 --output-json "$OUT_DIR/diag/interleave-1gpu-bf16-32-c.json"
  telemetry stop
}

section_s15d() {  # session 11, call 4 (issue 3): is the twin's manual optimization (the step in training_step, no
  # closure) cheaper on the host than its automatic optimization? Interleaved with native in one process each, the
  # two modes side by side on GPU 0 and GPU 1, then swapped.
  local il=$INTERLEAVE a=(--batch-size-per-device 32 --warmup-steps 20
    --block-steps 20 --blocks 40) first second
  mkdir -p "$OUT_DIR/diag"
  telemetry start
  run s15-interleave-1gpu-bf16-32-gpu0-d 0 150 "$PY" "$il" "${a[@]}" --output-json "$OUT_DIR/diag/interleave-1gpu-bf16-32-gpu0-d.json" &
  first=$!
  run s15-interleave-1gpu-bf16-32-manual-gpu1-d 1 150 "$PY" "$il" "${a[@]}" --lightning-manual-optimization \
    --output-json "$OUT_DIR/diag/interleave-1gpu-bf16-32-manual-gpu1-d.json" &
  second=$!
  wait "$first" "$second"
  run s15-interleave-1gpu-bf16-32-manual-gpu0-e 0 150 "$PY" "$il" "${a[@]}" --lightning-manual-optimization \
    --output-json "$OUT_DIR/diag/interleave-1gpu-bf16-32-manual-gpu0-e.json" &
  first=$!
  run s15-interleave-1gpu-bf16-32-gpu1-e 1 150 "$PY" "$il" "${a[@]}" --output-json "$OUT_DIR/diag/interleave-1gpu-bf16-32-gpu1-e.json" &
  second=$!
  wait "$first" "$second"
  telemetry stop
}

interleave_pair() {  # interleave_pair SESSION NAME ROUND LIMIT_S ARGS...: interleave.py at once on GPU 0 and on GPU 1,
  # each writing DIR/diag/NAME-gpuN-ROUND.json (logged as SESSION-NAME-gpuN-ROUND)
  local session=$1 name=$2 round=$3 limit=$4 first
  shift 4
  run "$session-$name-gpu0-$round" 0 "$limit" "$PY" "$INTERLEAVE" "$@" --output-json "$OUT_DIR/diag/$name-gpu0-$round.json" &
  first=$!
  run "$session-$name-gpu1-$round" 1 "$limit" "$PY" "$INTERLEAVE" "$@" --output-json "$OUT_DIR/diag/$name-gpu1-$round.json" &
  wait "$first" $!
}

interleave_2gpu() {  # interleave_2gpu SESSION NAME LIMIT_S ARGS...: interleave.py on both GPUs (torchrun, --devices 2),
  # writing DIR/diag/NAME.json (logged as SESSION-NAME)
  local session=$1 name=$2 limit=$3
  shift 3
  run "$session-$name" 0,1 "$limit" "${TWO[@]}" "$INTERLEAVE" --devices 2 "$@" --output-json "$OUT_DIR/diag/$name.json"
}

s16_interleave_pair() {  # s16_interleave_pair ROUND LIMIT_S ARGS...: the twelfth session's pairs
  interleave_pair s16 interleave-1gpu-bf16-32 "$@"
}

section_s16a() {  # session 12, call 1 (issue 3): the interleaved Lightning/native ratio at 32 per GPU, uncaptured, again:
  # four more one-GPU runs (in pairs, one per GPU, as s15d) and two on 2 GPUs, 80 Lightning blocks each instead of 40,
  # to narrow the interval that the eleventh session's runs left around 0.95 (pooled: pool.py in the same folder).
  local round
  mkdir -p "$OUT_DIR/diag"
  telemetry start
  s16_interleave_pair f 150 "${INTERLEAVE_32[@]}"
  s16_interleave_pair g 150 "${INTERLEAVE_32[@]}"
  for round in f g; do
    interleave_2gpu s16 "interleave-2gpu-bf16-32-$round" 170 "${INTERLEAVE_32[@]}"
  done
  telemetry stop
}

section_s16b() {  # session 12, call 2 (issue 7): the eleventh session's best-mode pair (fp16 --loss-scale 1024 on GPU 0,
  # 7,574 img/s, beside bf16 on GPU 1, 7,268) with the GPUs swapped, then as before, so that each precision ran on
  # each GPU; the first pair compiles and tunes (cold cache), the later ones reuse Inductor's cache. Eager pairs of
  # the two precisions, swapped too, last: the +30 % of eager fp16 with a fixed scale on one machine.
  local c=(--compile --coordinate-descent-tuning --cuda-graphs --warmup-steps 20 --steps 200)
  local f="--precision fp16 --loss-scale 1024" e=(--warmup-steps 10 --steps 200) n=s16-native-1gpu
  telemetry start
  pair "$n-bf16-256-compile-cdt-graphs-gpu0 480 ddp_resnet50.py ${c[*]}" \
       "$n-fp16ls-256-compile-cdt-graphs-gpu1 480 ddp_resnet50.py $f ${c[*]}"
  pair "$n-fp16ls-256-compile-cdt-graphs-gpu0 200 ddp_resnet50.py $f ${c[*]}" \
       "$n-bf16-256-compile-cdt-graphs-gpu1 200 ddp_resnet50.py ${c[*]}"
  pair "$n-bf16-256-compile-cdt-graphs-gpu0-b 200 ddp_resnet50.py ${c[*]}" \
       "$n-fp16ls-256-compile-cdt-graphs-gpu1-b 200 ddp_resnet50.py $f ${c[*]}"
  pair "$n-bf16-256-gpu0 90 ddp_resnet50.py ${e[*]}" "$n-fp16ls-256-gpu1 90 ddp_resnet50.py $f ${e[*]}"
  pair "$n-fp16ls-256-gpu0 90 ddp_resnet50.py $f ${e[*]}" "$n-bf16-256-gpu1 90 ddp_resnet50.py ${e[*]}"
  telemetry stop
}

section_s16c() {  # session 12, call 3 (issue 7): in s16b fp16 --loss-scale 1024 in the best mode ran at 7,719 img/s when
  # it compiled and tuned from a cold Inductor cache and at 7,253-7,262 when it loaded that cache, while bf16 ran the
  # same either way. Is the tuned fp16 step lost on a cache hit? Each GPU gets its own fresh cache directory: a cold
  # run on each, then a warm one (the cache as it is) and one with the FX graph and AOTAutograd caches off (Inductor
  # generates the code again but takes the tuned block sizes from its autotune cache), the GPUs swapped between them.
  local c=(--precision fp16 --loss-scale 1024 --compile --coordinate-descent-tuning --cuda-graphs --warmup-steps 20
    --steps 200) n=s16-native-1gpu-fp16ls-256-compile-cdt-graphs d0=/tmp/inductor-gpu0 d1=/tmp/inductor-gpu1 first
  local nofx=(TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0)
  rm -rf "$d0" "$d1"
  telemetry start
  bench "$n-cold-gpu0" 0 480 env TORCHINDUCTOR_CACHE_DIR=$d0 "$PY" ddp_resnet50.py "${c[@]}" &
  first=$!
  bench "$n-cold-gpu1" 1 480 env TORCHINDUCTOR_CACHE_DIR=$d1 "$PY" ddp_resnet50.py "${c[@]}" &
  wait "$first" $!
  bench "$n-warm-gpu0" 0 200 env TORCHINDUCTOR_CACHE_DIR=$d0 "$PY" ddp_resnet50.py "${c[@]}" &
  first=$!
  bench "$n-nofxcache-gpu1" 1 200 env TORCHINDUCTOR_CACHE_DIR=$d1 "${nofx[@]}" "$PY" ddp_resnet50.py "${c[@]}" &
  wait "$first" $!
  bench "$n-nofxcache-gpu0" 0 200 env TORCHINDUCTOR_CACHE_DIR=$d0 "${nofx[@]}" "$PY" ddp_resnet50.py "${c[@]}" &
  first=$!
  bench "$n-warm-gpu1" 1 200 env TORCHINDUCTOR_CACHE_DIR=$d1 "$PY" ddp_resnet50.py "${c[@]}" &
  wait "$first" $!
  telemetry stop
  cache_counts "$d0" "$d1"
}

section_s17a() {  # session 13, call 1 (issue 7): the stem computed differently, same model. Space to depth: conv1 as a
  # 4x4 stride-1 convolution of 2x2 pixel blocks (cuDNN ran the 7x7 stride-2 one at ~20 TFLOP/s); the dense max-pool
  # backward (Inductor's gather through the indices was one 1.46 ms kernel). First the stem alone (stem_probe.py),
  # compiled on GPU 0 and eager on GPU 1, with eager full-model runs on GPU 1 after; then the best mode (fp16
  # --loss-scale 1024, compiled, tuned, captured), each GPU into its own empty Inductor cache: both options on GPU 0,
  # none on GPU 1.
  local stem=docs/diagnostics/stem/stem_probe.py v name n=s17-native-1gpu e=(--warmup-steps 10 --steps 200)
  local c=(--precision fp16 --loss-scale 1024 --compile --coordinate-descent-tuning --cuda-graphs --warmup-steps 20
    --steps 200) fast=(--space-to-depth-stem --dense-max-pool-backward) first
  mkdir -p "$OUT_DIR/diag"
  rm -rf /tmp/inductor-s17-gpu0 /tmp/inductor-s17-gpu1
  telemetry start
  { for v in "--conv module --maxpool module" "--conv space-to-depth --maxpool module" \
             "--conv module --maxpool dense" "--conv space-to-depth --maxpool dense" \
             "--conv space-to-depth --maxpool dense --precision fp16" "--conv module --maxpool module --precision fp16"; do
      name=$(echo "$v" | sed 's/--conv //; s/ --maxpool /-/; s/ --precision /-/')
      run "s17-stem-compile-$name" 0 120 env TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-s17-probe "$PY" "$stem" --part stem \
        --compile $v --json "$OUT_DIR/diag/stem-compile-$name.json"
    done
  } &
  first=$!
  { for v in "--conv module --maxpool module" "--conv space-to-depth --maxpool module" \
             "--conv space-to-depth --s2d-channels 12 --maxpool module" "--conv module --maxpool dense" \
             "--conv space-to-depth --maxpool dense" "--conv module --maxpool scatter"; do
      name=$(echo "$v" | sed 's/--conv //; s/ --s2d-channels /-/; s/ --maxpool /-/')
      run "s17-stem-eager-$name" 1 60 "$PY" "$stem" --part stem $v --json "$OUT_DIR/diag/stem-eager-$name.json"
    done
    for v in module space-to-depth; do
      run "s17-conv-eager-$v" 1 60 "$PY" "$stem" --part conv --conv $v --json "$OUT_DIR/diag/conv-eager-$v.json"
    done
    bench "$n-fp16ls-256-gpu1" 1 90 "$PY" ddp_resnet50.py --precision fp16 --loss-scale 1024 "${e[@]}"
    bench "$n-fp16ls-256-fast-gpu1" 1 90 "$PY" ddp_resnet50.py --precision fp16 --loss-scale 1024 "${fast[@]}" "${e[@]}"
  } &
  wait "$first" $!
  bench "$n-fp16ls-256-compile-cdt-graphs-fast-cold-gpu0" 0 400 env TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-s17-gpu0 \
    "$PY" ddp_resnet50.py "${c[@]}" "${fast[@]}" &
  first=$!
  bench "$n-fp16ls-256-compile-cdt-graphs-cold-gpu1" 1 400 env TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-s17-gpu1 \
    "$PY" ddp_resnet50.py "${c[@]}" &
  wait "$first" $!
  telemetry stop
}

section_s17b() {  # session 13, call 2 (issue 7): s17a's best-mode pair again with the GPUs swapped (both stem options on
  # GPU 1, none on GPU 0, each into its own empty Inductor cache); then bf16 with the options (GPU 0) beside the
  # Lightning twin's fp16 with them (GPU 1); last, eager with space to depth only (the dense max-pool backward is
  # for compiled steps: eager it took the stem from 8.2 to 19.4 ms in s17a) beside eager without, in fp16.
  local n=s17-native-1gpu l=s17-lightning-1gpu L=lightning/ddp_resnet50.py e=(--warmup-steps 10 --steps 200) first
  local c=(--compile --coordinate-descent-tuning --cuda-graphs --warmup-steps 20 --steps 200)
  local f=(--precision fp16 --loss-scale 1024) fast=(--space-to-depth-stem --dense-max-pool-backward) d=/tmp/inductor-s17b
  rm -rf "$d"-*
  telemetry start
  bench "$n-fp16ls-256-compile-cdt-graphs-cold-gpu0" 0 300 env TORCHINDUCTOR_CACHE_DIR=$d-1 \
    "$PY" ddp_resnet50.py "${f[@]}" "${c[@]}" &
  first=$!
  bench "$n-fp16ls-256-compile-cdt-graphs-fast-cold-gpu1" 1 300 env TORCHINDUCTOR_CACHE_DIR=$d-2 \
    "$PY" ddp_resnet50.py "${f[@]}" "${c[@]}" "${fast[@]}" &
  wait "$first" $!
  bench "$n-bf16-256-compile-cdt-graphs-fast-cold-gpu0" 0 300 env TORCHINDUCTOR_CACHE_DIR=$d-3 \
    "$PY" ddp_resnet50.py "${c[@]}" "${fast[@]}" &
  first=$!
  bench "$l-fp16ls-256-compile-cdt-graphs-fast-cold-gpu1" 1 300 env TORCHINDUCTOR_CACHE_DIR=$d-4 \
    "$PY" "$L" "${f[@]}" "${c[@]}" "${fast[@]}" &
  wait "$first" $!
  pair "$n-fp16ls-256-s2d-gpu0 60 ddp_resnet50.py ${f[*]} --space-to-depth-stem ${e[*]}" \
       "$n-fp16ls-256-gpu1-b 60 ddp_resnet50.py ${f[*]} ${e[*]}"
  telemetry stop
}

section_s17c() {  # session 13, call 3 (issue 7): can cuDNN run the space-to-depth convolution faster when it may time
  # every algorithm (--cudnn-benchmark-limit 0)? The stem's convolution alone (eager) with 16 and 12 channels and
  # both limits on GPU 1, while GPU 0 runs the best mode with both stem options and the limit 0; then the same
  # without the limit on GPU 1, side by side with nothing. Last the eager pair that s17b's time cut.
  local n=s17-native-1gpu stem=docs/diagnostics/stem/stem_probe.py e=(--warmup-steps 10 --steps 200) first v ch lim
  local c=("${TUNED[@]}") d=/tmp/inductor-s17c
  rm -rf "$d"-*
  mkdir -p "$OUT_DIR/diag"
  telemetry start
  bench "$n-fp16ls-256-compile-cdt-graphs-fast-l0-cold-gpu0" 0 330 env TORCHINDUCTOR_CACHE_DIR=$d-1 \
    "$PY" ddp_resnet50.py "${c[@]}" --cudnn-benchmark-limit 0 &
  first=$!
  { for v in "16 10" "16 0" "12 10" "12 0"; do
      read -r ch lim <<<"$v"
      run "s17-conv-eager-space-to-depth-$ch-l$lim" 1 40 "$PY" "$stem" --part conv --conv space-to-depth \
        --s2d-channels "$ch" --benchmark-limit "$lim" --precision fp16 --json "$OUT_DIR/diag/conv-eager-s2d-$ch-l$lim-fp16.json"
    done
    bench "$n-fp16ls-256-compile-cdt-graphs-fast-cold-gpu1-b" 1 330 env TORCHINDUCTOR_CACHE_DIR=$d-2 \
      "$PY" ddp_resnet50.py "${c[@]}"
  } &
  wait "$first" $!
  pair "$n-fp16ls-256-s2d-gpu0 60 ddp_resnet50.py --precision fp16 --loss-scale 1024 --space-to-depth-stem ${e[*]}" \
       "$n-fp16ls-256-gpu1-b 60 ddp_resnet50.py --precision fp16 --loss-scale 1024 ${e[*]}"
  telemetry stop
}

section_s19a() {  # session 15, call 1 (issue 7), a one-GPU machine: the best mode with --sums-batch-norm compiled and
  # tuned into an empty Inductor cache (a third run, another machine), then twice from that cache: as it is (a
  # cache hit), and with the FX graph and AOTAutograd caches off (the code generated again, the block sizes from
  # the autotune cache). In the twelfth session fp16 lost 6 % on a cache hit (s16c): does the best mode?
  local n=s19-native-1gpu d=/tmp/inductor-s19-native
  local c=("${BEST[@]}") nofx=(TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0)
  rm -rf "$d"
  telemetry start
  bench "$n-fp16ls-256-compile-cdt-graphs-fast-sums-cold-gpu0" 0 330 env TORCHINDUCTOR_CACHE_DIR=$d \
    "$PY" ddp_resnet50.py "${c[@]}"
  bench "$n-fp16ls-256-compile-cdt-graphs-fast-sums-warm-gpu0" 0 110 env TORCHINDUCTOR_CACHE_DIR=$d \
    "$PY" ddp_resnet50.py "${c[@]}"
  bench "$n-fp16ls-256-compile-cdt-graphs-fast-sums-nofxcache-gpu0" 0 115 env TORCHINDUCTOR_CACHE_DIR=$d "${nofx[@]}" \
    "$PY" ddp_resnet50.py "${c[@]}"
  telemetry stop
  cache_counts "$d"
}

section_s19b() {  # session 15, call 2 (issue 7), the machine of s19a still warm: the Lightning twin in the best mode
  # with --sums-batch-norm, into an empty cache and then from it; then native from s19a's cache once more.
  local n=s19-native-1gpu l=s19-lightning-1gpu d=/tmp/inductor-s19-lightning
  local c=("${BEST[@]}")
  rm -rf "$d"
  telemetry start
  bench "$l-fp16ls-256-compile-cdt-graphs-fast-sums-cold-gpu0" 0 340 env TORCHINDUCTOR_CACHE_DIR=$d \
    "$PY" lightning/ddp_resnet50.py "${c[@]}"
  bench "$l-fp16ls-256-compile-cdt-graphs-fast-sums-warm-gpu0" 0 110 env TORCHINDUCTOR_CACHE_DIR=$d \
    "$PY" lightning/ddp_resnet50.py "${c[@]}"
  bench "$n-fp16ls-256-compile-cdt-graphs-fast-sums-warm-gpu0-b" 0 100 env TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-s19-native \
    "$PY" ddp_resnet50.py "${c[@]}"
  telemetry stop
  cache_counts "$d"
}

section_s19c() {  # session 15, call 3 (issue 7), the machine of s19a and s19b if still warm: the best mode without
  # --sums-batch-norm into an empty cache (what the option gives when tuned, on one GPU), then native and the twin
  # with it once more from their s19a / s19b caches.
  local n=s19-native-1gpu l=s19-lightning-1gpu d=/tmp/inductor-s19
  local c=("${BEST[@]}")
  rm -rf "$d-nosums"
  telemetry start
  bench "$n-fp16ls-256-compile-cdt-graphs-fast-cold-gpu0" 0 300 env TORCHINDUCTOR_CACHE_DIR=$d-nosums \
    "$PY" ddp_resnet50.py "${TUNED[@]}"
  bench "$n-fp16ls-256-compile-cdt-graphs-fast-sums-warm-gpu0-c" 0 100 env TORCHINDUCTOR_CACHE_DIR=$d-native \
    "$PY" ddp_resnet50.py "${c[@]}"
  bench "$l-fp16ls-256-compile-cdt-graphs-fast-sums-warm-gpu0-b" 0 110 env TORCHINDUCTOR_CACHE_DIR=$d-lightning \
    "$PY" lightning/ddp_resnet50.py "${c[@]}"
  telemetry stop
}

section_s19d() {  # session 15, call 4 (issue 7), the last device minutes on the machine of s19a-c: native and the
  # twin in the best mode with --sums-batch-norm once more from their caches (the call ran these two inline).
  local c=("${BEST[@]}") d=/tmp/inductor-s19
  bench s19-native-1gpu-fp16ls-256-compile-cdt-graphs-fast-sums-warm-gpu0-d 0 100 env TORCHINDUCTOR_CACHE_DIR=$d-native \
    "$PY" ddp_resnet50.py "${c[@]}"
  bench s19-lightning-1gpu-fp16ls-256-compile-cdt-graphs-fast-sums-warm-gpu0-c 0 105 env TORCHINDUCTOR_CACHE_DIR=$d-lightning \
    "$PY" lightning/ddp_resnet50.py "${c[@]}"
}

section_s20a() {  # session 16, call 1 (issue 3), a 2-GPU machine: Lightning's loop cost at 32 per GPU, uncaptured, where
  # the thirteen one-GPU interleaved runs pooled to 0.951 (at the 0.95 target, not clearly above it). First the loop's own
  # host cost a step on this host, timed without a profiler (hook_profile.py --timing: a trivial model by a plain loop and
  # by the Trainer, on the GPU in bf16 and on the CPU), to set against native's step time; then interleave.py, whose
  # native blocks now run native's timed loop with its per-step harness work (the old ones ran the step alone): three
  # pairs of one-GPU runs (one per GPU) and one 2-GPU run, 80 Lightning blocks each.
  local hp=docs/diagnostics/lightning-interleaved/hook_profile.py round
  mkdir -p "$OUT_DIR/diag"
  telemetry start
  run s20-loop-cost-cuda-bf16 0 100 "$PY" "$hp" --timing --device cuda --precision bf16 --repeats 5 \
    --output-json "$OUT_DIR/diag/loop-cost-cuda-bf16.json"
  run s20-loop-cost-cpu-fp32 0 100 "$PY" "$hp" --timing --device cpu --precision fp32 --repeats 5 \
    --output-json "$OUT_DIR/diag/loop-cost-cpu-fp32.json"
  for round in a b c; do
    interleave_pair s20 interleave-v2-1gpu-bf16-32 "$round" 130 "${INTERLEAVE_32[@]}"
  done
  interleave_2gpu s20 interleave-v2-2gpu-bf16-32-a 150 "${INTERLEAVE_32[@]}"
  telemetry stop
}

section_s20b() {  # session 16, call 2 (issue 3), the machine of s20a if still warm: more of its interleaved runs. s20a's
  # one-GPU pairs took 107-119 s and its 2-GPU run was cut by the call's limit, so two pairs and two 2-GPU runs.
  local round
  mkdir -p "$OUT_DIR/diag"
  telemetry start
  for round in d e; do
    interleave_pair s20 interleave-v2-1gpu-bf16-32 "$round" 130 "${INTERLEAVE_32[@]}"
  done
  for round in b c; do
    interleave_2gpu s20 "interleave-v2-2gpu-bf16-32-$round" 150 "${INTERLEAVE_32[@]}"
  done
  telemetry stop
}

section_s20c() {  # session 16, call 3 (issue 3), the machine of s20a-b if still warm: the last device minutes, more of
  # the same interleaved runs (one-GPU pairs f and g, a 2-GPU run, then pair h).
  mkdir -p "$OUT_DIR/diag"
  telemetry start
  interleave_pair s20 interleave-v2-1gpu-bf16-32 f 130 "${INTERLEAVE_32[@]}"
  interleave_pair s20 interleave-v2-1gpu-bf16-32 g 130 "${INTERLEAVE_32[@]}"
  interleave_2gpu s20 interleave-v2-2gpu-bf16-32-d 150 "${INTERLEAVE_32[@]}"
  interleave_pair s20 interleave-v2-1gpu-bf16-32 h 130 "${INTERLEAVE_32[@]}"
  telemetry stop
}

section_s18b() {  # session 14, call 2 (issue 7), a one-GPU machine: s18a's best-mode run with --sums-batch-norm again,
  # with a longer limit (its cold compilation and tuning passed s18a's 300 s); then eager fp16 with the option.
  local n=s18-native-1gpu
  local c=("${TUNED[@]}") d=/tmp/inductor-s18b
  rm -rf "$d"-*
  telemetry start
  bench "$n-fp16ls-256-compile-cdt-graphs-fast-sums-cold-gpu0" 0 470 env TORCHINDUCTOR_CACHE_DIR=$d-1 \
    "$PY" ddp_resnet50.py "${c[@]}" --sums-batch-norm
  bench "$n-fp16ls-256-sums-gpu0" 0 60 "$PY" ddp_resnet50.py --precision fp16 --loss-scale 1024 --sums-batch-norm \
    --warmup-steps 10 --steps 200
  telemetry stop
}

section_s18d() {  # session 14, call 4 (issue 7), a one-GPU machine: s18b's best-mode run with --sums-batch-norm once more
  # (into a new empty cache): the same configuration twice before the figure is believed.
  local n=s18-native-1gpu d=/tmp/inductor-s18d
  local c=("${FAST[@]}")
  rm -rf "$d"-*
  telemetry start
  bench "$n-fp16ls-256-compile-cdt-graphs-fast-sums-cold-gpu0-b" 0 320 env TORCHINDUCTOR_CACHE_DIR=$d-1 \
    "$PY" ddp_resnet50.py "${c[@]}" --coordinate-descent-tuning --sums-batch-norm
  telemetry stop
}

section_s18c() {  # session 14, call 3 (issue 7), a one-GPU machine: what --sums-batch-norm gives without the tuning (a
  # shorter compilation): fp16 --loss-scale 1024 compiled and captured with both stem options, with the option, without,
  # with again, one after the other on GPU 0, each into its own empty Inductor cache; then eager fp16 without it.
  local n=s18-native-1gpu c=(--precision fp16 --loss-scale 1024 --compile --cuda-graphs --warmup-steps 20 --steps 200
    --space-to-depth-stem --dense-max-pool-backward) d=/tmp/inductor-s18c
  rm -rf "$d"-*
  telemetry start
  bench "$n-fp16ls-256-compile-graphs-fast-sums-cold-gpu0" 0 150 env TORCHINDUCTOR_CACHE_DIR=$d-1 \
    "$PY" ddp_resnet50.py "${c[@]}" --sums-batch-norm
  bench "$n-fp16ls-256-compile-graphs-fast-cold-gpu0" 0 150 env TORCHINDUCTOR_CACHE_DIR=$d-2 "$PY" ddp_resnet50.py "${c[@]}"
  bench "$n-fp16ls-256-compile-graphs-fast-sums-cold-gpu0-b" 0 150 env TORCHINDUCTOR_CACHE_DIR=$d-3 \
    "$PY" ddp_resnet50.py "${c[@]}" --sums-batch-norm
  bench "$n-fp16ls-256-gpu0" 0 60 "$PY" ddp_resnet50.py --precision fp16 --loss-scale 1024 --warmup-steps 10 --steps 200
  telemetry stop
}

section_s18a() {  # session 14, call 1 (issue 7), a one-GPU machine: --sums-batch-norm (batch-norm statistics from
  # sums of x and x*x instead of Inductor's Welford reduction) in the best mode with both stem options, compiled and
  # tuned into an empty Inductor cache; then the batch-norm probe, PyTorch's batch norm and the sums one, tuned.
  local n=s18-native-1gpu probe=docs/diagnostics/batchnorm/bn_probe.py form
  local c=("${TUNED[@]}") d=/tmp/inductor-s18a
  rm -rf "$d"-*
  mkdir -p "$OUT_DIR/diag"
  telemetry start
  bench "$n-fp16ls-256-compile-cdt-graphs-fast-sums-cold-gpu0" 0 300 env TORCHINDUCTOR_CACHE_DIR=$d-1 \
    "$PY" ddp_resnet50.py "${c[@]}" --sums-batch-norm
  for form in torchvision sums; do
    run "s18-bn-probe-$form-fp16-cdt" 0 115 env TORCHINDUCTOR_CACHE_DIR=$d-probe-$form "$PY" "$probe" \
      --batch-norm "$form" --precision fp16 --coordinate-descent-tuning --json "$OUT_DIR/diag/bn-$form-fp16-cdt.json"
  done
  telemetry stop
}

section_s17d() {  # session 13, call 4 (issue 7): the last device minutes, on a one-GPU machine (the only kind lent then):
  # the final code of the stem options on the GPU, and their gain without coordinate-descent tuning (a shorter
  # compilation): fp16 --loss-scale 1024, compiled and captured, both options then none, one after the other on
  # GPU 0, each into its own empty Inductor cache.
  local n=s17-native-1gpu c=(--precision fp16 --loss-scale 1024 --compile --cuda-graphs --warmup-steps 20 --steps 200)
  local d=/tmp/inductor-s17d
  rm -rf "$d"-*
  telemetry start
  bench "$n-fp16ls-256-compile-graphs-fast-cold-gpu0" 0 120 env TORCHINDUCTOR_CACHE_DIR=$d-1 \
    "$PY" ddp_resnet50.py "${c[@]}" --space-to-depth-stem --dense-max-pool-backward
  bench "$n-fp16ls-256-compile-graphs-cold-gpu0" 0 120 env TORCHINDUCTOR_CACHE_DIR=$d-2 "$PY" ddp_resnet50.py "${c[@]}"
  telemetry stop
}

section_s16d() {  # session 12, call 4 (issue 3): the last device minutes, two more pairs of one-GPU interleaved runs
  # (60 blocks each) for the pooled Lightning/native ratio at 32 per GPU.
  local a=(--batch-size-per-device 32 --warmup-steps 20 --block-steps 20 --blocks 60)
  mkdir -p "$OUT_DIR/diag"
  telemetry start
  s16_interleave_pair h 120 "${a[@]}"
  s16_interleave_pair i 120 "${a[@]}"
  telemetry stop
}

section_s15e() {  # session 11, call 5 (issue 7): fp16 with a fixed loss scale ran compiled and captured at 7,221-7,266
  # img/s in call 2; does it beat bf16 in the best mode (+ coordinate-descent tuning)? One pair, side by side.
  local c=(--compile --coordinate-descent-tuning --cuda-graphs --warmup-steps 20 --steps 200)
  telemetry start
  pair "s15-native-1gpu-fp16ls-256-compile-cdt-graphs-gpu0 480 ddp_resnet50.py --precision fp16 --loss-scale 1024 ${c[*]}" \
       "s15-native-1gpu-bf16-256-compile-cdt-graphs-gpu1 480 ddp_resnet50.py ${c[*]}"
  telemetry stop
}

section_s14a() {  # session 10, call 1 (issues 3 and 7): the Lightning twin's --cuda-graphs (the whole step captured
  # in training_step under manual optimization) against native's, eager kernels: 32 images per GPU, where uncaptured
  # eager steps are bound by the host, and 256. One-GPU pairs put each script on each GPU in turn.
  local g=(--cuda-graphs --warmup-steps 20 --steps 300) g256=(--cuda-graphs --warmup-steps 20 --steps 200)
  local b=--batch-size-per-device n=s14-native l=s14-lightning L=lightning/ddp_resnet50.py nobb=--no-broadcast-buffers
  telemetry start
  pair "$l-1gpu-bf16-32-graphs-gpu0 150 $L $b 32 ${g[*]}" "$n-1gpu-bf16-32-graphs-gpu1 150 ddp_resnet50.py $b 32 ${g[*]}"
  pair "$n-1gpu-bf16-32-graphs-gpu0 150 ddp_resnet50.py $b 32 ${g[*]}" "$l-1gpu-bf16-32-graphs-gpu1 150 $L $b 32 ${g[*]}"
  bench "$l-2gpu-bf16-32-graphs" 0,1 150 "$PY" "$L" --devices 2 "$b" 32 "${g[@]}"
  bench "$n-2gpu-bf16-32-graphs" 0,1 150 "${TWO[@]}" ddp_resnet50.py "$b" 32 "${g[@]}"
  bench "$n-2gpu-bf16-32-graphs-b" 0,1 150 "${TWO[@]}" ddp_resnet50.py "$b" 32 "${g[@]}"
  bench "$l-2gpu-bf16-32-graphs-b" 0,1 150 "$PY" "$L" --devices 2 "$b" 32 "${g[@]}"
  bench "$l-2gpu-bf16-32-graphs-nobb" 0,1 150 "$PY" "$L" --devices 2 "$b" 32 "$nobb" "${g[@]}"
  bench "$n-2gpu-bf16-32-graphs-nobb" 0,1 150 "${TWO[@]}" ddp_resnet50.py "$b" 32 "$nobb" "${g[@]}"
  pair "$l-1gpu-bf16-256-graphs-gpu0 150 $L ${g256[*]}" "$n-1gpu-bf16-256-graphs-gpu1 150 ddp_resnet50.py ${g256[*]}"
  bench "$n-2gpu-bf16-256-graphs-nobb" 0,1 150 "${TWO[@]}" ddp_resnet50.py "$nobb" "${g256[@]}"
  bench "$l-2gpu-bf16-256-graphs-nobb" 0,1 150 "$PY" "$L" --devices 2 "$nobb" "${g256[@]}"
  telemetry stop
}

section_s14b() {  # session 10, call 2 (issues 3 and 7): the same for the compiled and captured step, the twin's
  # fastest mode: 256 per GPU on 1 GPU and on 2 (no_optimization, no buffer broadcast, the best 2-GPU mode), then 32
  # per GPU (the 4,000 img/s target's mode); the one-GPU pair at 256 again with the GPUs swapped, last.
  local c=(--compile --cuda-graphs --warmup-steps 20 --steps 200) noopt=(--compiled-ddp no_optimization --no-broadcast-buffers)
  local b=--batch-size-per-device n=s14-native l=s14-lightning L=lightning/ddp_resnet50.py
  telemetry start
  pair "$n-1gpu-bf16-256-compile-graphs-gpu0 300 ddp_resnet50.py ${c[*]}" "$l-1gpu-bf16-256-compile-graphs-gpu1 300 $L ${c[*]}"
  bench "$n-2gpu-bf16-256-compile-graphs-noopt-nobb" 0,1 240 "${TWO[@]}" ddp_resnet50.py "${noopt[@]}" "${c[@]}"
  bench "$l-2gpu-bf16-256-compile-graphs-noopt-nobb" 0,1 240 "$PY" "$L" --devices 2 "${noopt[@]}" "${c[@]}"
  pair "$l-1gpu-bf16-32-compile-graphs-gpu0 200 $L $b 32 ${c[*]}" "$n-1gpu-bf16-32-compile-graphs-gpu1 200 ddp_resnet50.py $b 32 ${c[*]}"
  bench "$n-2gpu-bf16-32-compile-graphs" 0,1 200 "${TWO[@]}" ddp_resnet50.py "$b" 32 "${c[@]}"
  bench "$l-2gpu-bf16-32-compile-graphs" 0,1 200 "$PY" "$L" --devices 2 "$b" 32 "${c[@]}"
  pair "$l-1gpu-bf16-256-compile-graphs-gpu0 200 $L ${c[*]}" "$n-1gpu-bf16-256-compile-graphs-gpu1 200 ddp_resnet50.py ${c[*]}"
  telemetry stop
}

section_s14c() {  # session 10, call 3 (issues 3, 4 and 7): the twin now broadcasts the buffers inside its own step
  # (captured, as native's DDP forward is), where calls 1 and 2 let DDP's forward do it eagerly before every replay.
  # 32 per GPU with the default broadcast, alternated with native; then three more ddp,fsdp_zero2 launches (issue 4).
  local g=(--cuda-graphs --warmup-steps 20 --steps 300) c=(--compile --cuda-graphs --warmup-steps 20 --steps 300)
  local b=--batch-size-per-device n=s14-native l=s14-lightning L=lightning/ddp_resnet50.py
  telemetry start
  bench "$l-2gpu-bf16-32-graphs-c" 0,1 150 "$PY" "$L" --devices 2 "$b" 32 "${g[@]}"
  bench "$n-2gpu-bf16-32-graphs-c" 0,1 150 "${TWO[@]}" ddp_resnet50.py "$b" 32 "${g[@]}"
  bench "$n-2gpu-bf16-32-graphs-d" 0,1 150 "${TWO[@]}" ddp_resnet50.py "$b" 32 "${g[@]}"
  bench "$l-2gpu-bf16-32-graphs-d" 0,1 150 "$PY" "$L" --devices 2 "$b" 32 "${g[@]}"
  bench "$n-2gpu-bf16-32-compile-graphs-c" 0,1 200 "${TWO[@]}" ddp_resnet50.py "$b" 32 "${c[@]}"
  bench "$l-2gpu-bf16-32-compile-graphs-c" 0,1 200 "$PY" "$L" --devices 2 "$b" 32 "${c[@]}"
  pair "$l-1gpu-bf16-32-graphs-gpu0-c 150 $L $b 32 ${g[*]}" "$n-1gpu-bf16-32-graphs-gpu1-c 150 ddp_resnet50.py $b 32 ${g[*]}"
  pair "$n-1gpu-bf16-32-graphs-gpu0-d 150 ddp_resnet50.py $b 32 ${g[*]}" "$l-1gpu-bf16-32-graphs-gpu1-d 150 $L $b 32 ${g[*]}"
  fsdp2_rounds s14
  telemetry stop
}

section_s13a() {  # session 9, call 1 (issue 2, issue 7): does halving the all-reduce's bytes (--comm-hook
  # bf16_compress / fp16_compress) take eager 2-GPU scaling to 99 %? Alternated with the plain all-reduce, one-GPU
  # pairs before and after, 300 timed steps under 100 ms telemetry; the Lightning twin with the hook once.
  local e=(--warmup-steps 10 --steps 300) nobb=(--no-broadcast-buffers) n=s13-native-2gpu-bf16-256-nobb
  telemetry start
  pair "s13-native-1gpu-bf16-256-gpu0 120 ddp_resnet50.py ${e[*]}" "s13-native-1gpu-bf16-256-gpu1 120 ddp_resnet50.py ${e[*]}"
  bench "$n" 0,1 120 "${TWO[@]}" ddp_resnet50.py "${nobb[@]}" "${e[@]}"
  bench "$n-bf16hook" 0,1 120 "${TWO[@]}" ddp_resnet50.py "${nobb[@]}" --comm-hook bf16_compress "${e[@]}"
  bench "$n-fp16hook" 0,1 120 "${TWO[@]}" ddp_resnet50.py "${nobb[@]}" --comm-hook fp16_compress "${e[@]}"
  bench "$n-bf16hook-b" 0,1 120 "${TWO[@]}" ddp_resnet50.py "${nobb[@]}" --comm-hook bf16_compress "${e[@]}"
  bench "$n-b" 0,1 120 "${TWO[@]}" ddp_resnet50.py "${nobb[@]}" "${e[@]}"
  bench "$n-c" 0,1 120 "${TWO[@]}" ddp_resnet50.py "${nobb[@]}" "${e[@]}"
  bench "$n-bf16hook-c" 0,1 120 "${TWO[@]}" ddp_resnet50.py "${nobb[@]}" --comm-hook bf16_compress "${e[@]}"
  bench s13-lightning-2gpu-bf16-256-nobb-bf16hook 0,1 150 "$PY" lightning/ddp_resnet50.py --devices 2 "${nobb[@]}" \
    --comm-hook bf16_compress "${e[@]}"
  pair "s13-native-1gpu-bf16-256-gpu0-b 120 ddp_resnet50.py ${e[*]}" "s13-native-1gpu-bf16-256-gpu1-b 120 ddp_resnet50.py ${e[*]}"
  telemetry stop
}

section_s13b() {  # session 9, call 2 (issue 7): the same for the compiled step, which runs at the 700 W limit
  # (eighth session): fewer bytes on NVLink, a shorter all-reduce after the compiled backward (no_optimization) or
  # inside it (ddp_optimizer, 50 MB buckets). One-GPU pairs before and after.
  local c=(--compile --warmup-steps 10 --steps 300) noopt=(--compiled-ddp no_optimization --no-broadcast-buffers)
  local n=s13-native-2gpu-bf16-256-compile-noopt-nobb hook=(--comm-hook bf16_compress)
  telemetry start
  pair "s13-native-1gpu-bf16-256-compile-gpu0 300 ddp_resnet50.py ${c[*]}" \
       "s13-native-1gpu-bf16-256-compile-gpu1 300 ddp_resnet50.py ${c[*]}"
  bench "$n" 0,1 300 "${TWO[@]}" ddp_resnet50.py "${noopt[@]}" "${c[@]}"
  bench "$n-bf16hook" 0,1 200 "${TWO[@]}" ddp_resnet50.py "${noopt[@]}" "${hook[@]}" "${c[@]}"
  bench "$n-bf16hook-b" 0,1 200 "${TWO[@]}" ddp_resnet50.py "${noopt[@]}" "${hook[@]}" "${c[@]}"
  bench "$n-b" 0,1 200 "${TWO[@]}" ddp_resnet50.py "${noopt[@]}" "${c[@]}"
  pair "s13-native-1gpu-bf16-256-compile-gpu0-b 200 ddp_resnet50.py ${c[*]}" \
       "s13-native-1gpu-bf16-256-compile-gpu1-b 200 ddp_resnet50.py ${c[*]}"
  bench s13-native-2gpu-bf16-256-compile-ddpopt-b50-nobb-bf16hook 0,1 200 "${TWO[@]}" ddp_resnet50.py \
    --compiled-ddp ddp_optimizer --bucket-cap-mb 50 --no-broadcast-buffers "${hook[@]}" "${c[@]}"
  telemetry stop
}

section_s13c() {  # session 9, call 4 (issue 7): a controlled test of the power share. One-GPU compiled pairs alone,
  # beside an idle NCCL group of two other processes on the same GPUs, beside the same group all-reducing
  # ResNet-50's 97.5 MiB every 39 ms (DDP's traffic at a compiled 2-GPU step's pace; link_load.py), alone again.
  local c=(--compile --warmup-steps 10 --steps 300) load=docs/diagnostics/compiled-scaling/link_load.py mode pid
  mkdir -p "$OUT_DIR/diag"
  telemetry start
  pair "s13-native-1gpu-bf16-256-compile-alone-gpu0 300 ddp_resnet50.py ${c[*]}" \
       "s13-native-1gpu-bf16-256-compile-alone-gpu1 300 ddp_resnet50.py ${c[*]}"
  for mode in idle busy; do
    run "s13-link-$mode" 0,1 90 "${TWO[@]}" "$load" --mode "$mode" --seconds 50 --json "$OUT_DIR/diag/link-$mode.json" &
    pid=$!
    sleep 5  # the group is up before the pair starts
    pair "s13-native-1gpu-bf16-256-compile-$mode-gpu0 200 ddp_resnet50.py ${c[*]}" \
         "s13-native-1gpu-bf16-256-compile-$mode-gpu1 200 ddp_resnet50.py ${c[*]}"
    wait "$pid"
  done
  pair "s13-native-1gpu-bf16-256-compile-alone-gpu0-b 200 ddp_resnet50.py ${c[*]}" \
       "s13-native-1gpu-bf16-256-compile-alone-gpu1-b 200 ddp_resnet50.py ${c[*]}"
  telemetry stop
}

section_s10a() {  # session 6, call 1 (issue 7): where the tuned compiled step spends its time (a kernel profile,
  # which also fills the Inductor cache), what the stem costs, and whether cuDNN finds faster convolutions when it
  # may time every algorithm (--cudnn-benchmark-limit 0) instead of PyTorch's 10, eager and compiled
  local cdt=(--compile --coordinate-descent-tuning) graphs=(--cuda-graphs --warmup-steps 20 --steps 100)
  local stem=docs/diagnostics/stem/stem_probe.py probe v
  mkdir -p "$OUT_DIR/diag"
  run s10-probe-1gpu-bf16-256-compile-cdt 0 420 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 \
    docs/diagnostics/ddp-scaling/probe.py --out "$OUT_DIR/diag" --name 1gpu-compile-cdt "${cdt[@]}" \
    --warmup-steps 10 &
  { for v in "conv 3 10" "conv 3 0" "conv 4 10" "conv 8 10" "conv 8 0" "stem 3 10" "stem 3 0" "stem 8 10"; do
      read -r -a probe <<<"$v"
      run "s10-stem-${probe[0]}-c${probe[1]}-l${probe[2]}" 1 120 "$PY" "$stem" --part "${probe[0]}" \
        --pad-channels "${probe[1]}" --benchmark-limit "${probe[2]}" --json "$OUT_DIR/diag/stem-${v// /-}.json"
    done
    run s10-stem-stem-c3-l10-compile 1 200 "$PY" "$stem" --part stem --compile --json "$OUT_DIR/diag/stem-compile.json"
    bench s10-native-1gpu-bf16-256-a 1 120 "$PY" ddp_resnet50.py "${STEPS[@]}"
    bench s10-native-1gpu-bf16-256-l0-a 1 180 "$PY" ddp_resnet50.py --cudnn-benchmark-limit 0 "${STEPS[@]}"
    bench s10-native-1gpu-bf16-256-b 1 120 "$PY" ddp_resnet50.py "${STEPS[@]}"
    bench s10-native-1gpu-bf16-256-l0-b 1 180 "$PY" ddp_resnet50.py --cudnn-benchmark-limit 0 "${STEPS[@]}"
  } &
  wait
  pair "s10-native-1gpu-bf16-256-compile-cdt-graphs-gpu0 300 ddp_resnet50.py ${cdt[*]} ${graphs[*]}" \
       "s10-native-1gpu-bf16-256-compile-cdt-graphs-l0-gpu1 300 ddp_resnet50.py ${cdt[*]} ${graphs[*]} --cudnn-benchmark-limit 0"
  pair "s10-native-1gpu-bf16-256-compile-cdt-graphs-l0-gpu0 300 ddp_resnet50.py ${cdt[*]} ${graphs[*]} --cudnn-benchmark-limit 0" \
       "s10-native-1gpu-bf16-256-compile-cdt-graphs-gpu1 300 ddp_resnet50.py ${cdt[*]} ${graphs[*]}"
}

section_s10b() {  # session 6, call 4: compiled 2-GPU scaling without the buffer broadcast again (issue 7; 97.1 % on
  # average over two runs in the third session), eager scaling (2), the launch-bound twins at 32 on one GPU with
  # nothing else running and the host's own counters recorded (3), fsdp_zero2 and the preset once more (4)
  local noopt=(--compile --compiled-ddp no_optimization --no-broadcast-buffers "${STEPS[@]}") round
  local small=(--batch-size-per-device 32 --warmup-steps 10 --steps 200)
  pair "s10-native-1gpu-bf16-256-compile-gpu0 240 ddp_resnet50.py --compile ${STEPS[*]}" \
       "s10-native-1gpu-bf16-256-compile-gpu1 240 ddp_resnet50.py --compile ${STEPS[*]}"
  bench s10-native-2gpu-bf16-256-compile-noopt-nobb-a 0,1 200 "${TWO[@]}" ddp_resnet50.py "${noopt[@]}"
  bench s10-native-2gpu-bf16-256-compile-noopt-nobb-b 0,1 200 "${TWO[@]}" ddp_resnet50.py "${noopt[@]}"
  pair "s10-native-1gpu-bf16-256-gpu0 120 ddp_resnet50.py ${STEPS[*]}" \
       "s10-native-1gpu-bf16-256-gpu1 120 ddp_resnet50.py ${STEPS[*]}"
  bench s10-native-2gpu-bf16-256-nobb-a 0,1 120 "${TWO[@]}" ddp_resnet50.py --no-broadcast-buffers "${STEPS[@]}"
  bench s10-native-2gpu-bf16-256-nobb-b 0,1 120 "${TWO[@]}" ddp_resnet50.py --no-broadcast-buffers "${STEPS[@]}"
  for round in 1 2 3; do
    bench "s10-native-1gpu-bf16-32-r$round" 0 90 "$PY" ddp_resnet50.py "${small[@]}"
    bench "s10-lightning-1gpu-bf16-32-r$round" 0 120 "$PY" lightning/ddp_resnet50.py "${small[@]}"
  done
  bench s10-sharding-2gpu-bf16-256-fsdp2 0,1 150 "${TWO[@]}" oss_benchmark.py --strategy ddp,fsdp_zero2 \
    --warmup-steps 10 --steps 50
  bench s10-sharding-2gpu-preset 0,1 150 "${TWO[@]}" oss_benchmark.py --preset fairscale \
    --strategy ddp,oss_ddp,oss_sharded_ddp "${STEPS[@]}"
}

section_s10c() {  # session 6, call 6 (issue 7): the stem with its max-pool backward done as a scatter of the output
  # gradient to the forward's indices, against the module's own backward, eager and compiled, one GPU
  local stem=docs/diagnostics/stem/stem_probe.py v
  mkdir -p "$OUT_DIR/diag"
  for v in "module" "scatter" "module --compile" "scatter --compile"; do
    run "s10-stem-maxpool-${v// --/-}" 0 150 "$PY" "$stem" --part stem --maxpool $v \
      --json "$OUT_DIR/diag/stem-maxpool-${v// --/-}.json"
  done
}

section_s11a() {  # session 7, call 1 (issue 4): the fairscale preset timed as fairscale's benchmark times it, ten
  # epochs of 117 steps (MNIST's 60,000 images over 2 ranks at 256), so that its spread (median and MAD over the
  # epochs) compares like for like with fairscale's; then ddp against fsdp_zero2 once more
  bench s11-sharding-2gpu-preset-epochs 0,1 420 "${TWO[@]}" oss_benchmark.py --preset fairscale \
    --strategy ddp,oss_ddp,oss_sharded_ddp --warmup-steps 10 --steps 1170 --steps-per-epoch 117
  bench s11-sharding-2gpu-bf16-256-fsdp2 0,1 120 "${TWO[@]}" oss_benchmark.py --strategy ddp,fsdp_zero2 \
    --warmup-steps 10 --steps 50
}

section_s11b() {  # session 7, call 2 (issues 7 and 2): does compiled 2-GPU scaling lose to the two ranks' different
  # cuDNN algorithm draws? One-GPU pairs and 2-GPU runs with cuDNN autotuning (per process) and without (cuDNN's
  # heuristics, the same algorithms in every process); then eager scaling without the buffer broadcast again
  local noopt=(--compile --compiled-ddp no_optimization --no-broadcast-buffers "${STEPS[@]}")
  pair "s11-native-1gpu-bf16-256-compile-gpu0 240 ddp_resnet50.py --compile ${STEPS[*]}" \
       "s11-native-1gpu-bf16-256-compile-gpu1 240 ddp_resnet50.py --compile ${STEPS[*]}"
  pair "s11-native-1gpu-bf16-256-compile-nobench-gpu0 200 ddp_resnet50.py --compile --no-cudnn-benchmark ${STEPS[*]}" \
       "s11-native-1gpu-bf16-256-compile-nobench-gpu1 200 ddp_resnet50.py --compile --no-cudnn-benchmark ${STEPS[*]}"
  bench s11-native-2gpu-bf16-256-compile-noopt-nobb 0,1 200 "${TWO[@]}" ddp_resnet50.py "${noopt[@]}"
  bench s11-native-2gpu-bf16-256-compile-noopt-nobb-nobench 0,1 200 "${TWO[@]}" ddp_resnet50.py "${noopt[@]}" \
    --no-cudnn-benchmark
  pair "s11-native-1gpu-bf16-256-gpu0 120 ddp_resnet50.py ${STEPS[*]}" \
       "s11-native-1gpu-bf16-256-gpu1 120 ddp_resnet50.py ${STEPS[*]}"
  bench s11-native-2gpu-bf16-256-nobb 0,1 120 "${TWO[@]}" ddp_resnet50.py --no-broadcast-buffers "${STEPS[@]}"
}

section_s11c() {  # session 7, call 3 (issue 7): the compiled 2-GPU runs of s11b again, and PyTorch's ddp_optimizer with
  # buckets of 50 MB (fewer graph pieces than with 25 MB, the earlier buckets' all-reduce still overlapped)
  local noopt=(--compile --compiled-ddp no_optimization --no-broadcast-buffers "${STEPS[@]}")
  bench s11-native-2gpu-bf16-256-compile-ddpopt-b50-nobb 0,1 200 "${TWO[@]}" ddp_resnet50.py --compile \
    --compiled-ddp ddp_optimizer --bucket-cap-mb 50 --no-broadcast-buffers "${STEPS[@]}"
  bench s11-native-2gpu-bf16-256-compile-noopt-nobb-b 0,1 150 "${TWO[@]}" ddp_resnet50.py "${noopt[@]}"
  bench s11-native-2gpu-bf16-256-nobb-b 0,1 120 "${TWO[@]}" ddp_resnet50.py --no-broadcast-buffers "${STEPS[@]}"
}

section_s11d() {  # session 7, call 4 (issue 7): ddp_optimizer with 50 MB buckets twice more, between one-GPU pairs
  local b50=(--compile --compiled-ddp ddp_optimizer --bucket-cap-mb 50 --no-broadcast-buffers "${STEPS[@]}")
  pair "s11-native-1gpu-bf16-256-compile-gpu0-b 150 ddp_resnet50.py --compile ${STEPS[*]}" \
       "s11-native-1gpu-bf16-256-compile-gpu1-b 150 ddp_resnet50.py --compile ${STEPS[*]}"
  bench s11-native-2gpu-bf16-256-compile-ddpopt-b50-nobb-b 0,1 150 "${TWO[@]}" ddp_resnet50.py "${b50[@]}"
  bench s11-native-2gpu-bf16-256-compile-ddpopt-b50-nobb-c 0,1 150 "${TWO[@]}" ddp_resnet50.py "${b50[@]}"
  pair "s11-native-1gpu-bf16-256-compile-gpu0-c 150 ddp_resnet50.py --compile ${STEPS[*]}" \
       "s11-native-1gpu-bf16-256-compile-gpu1-c 150 ddp_resnet50.py --compile ${STEPS[*]}"
}

section_s11e() {  # session 7, call 5 (issue 7): compiled autograd (--compiled-ddp python_reducer) traces DDP's reducer
  # into the compiled backward, but walks the autograd graph on the host every step (6,293 img/s, host-bound, in the
  # fifth session); captured in a CUDA graph that host walk runs once. Against the captured one-GPU pair and the
  # captured no_optimization run on the same machine
  local graphs=(--compile --cuda-graphs --warmup-steps 20 --steps 100)
  pair "s11-native-1gpu-bf16-256-compile-graphs-gpu0 150 ddp_resnet50.py ${graphs[*]}" \
       "s11-native-1gpu-bf16-256-compile-graphs-gpu1 150 ddp_resnet50.py ${graphs[*]}"
  bench s11-native-2gpu-bf16-256-compile-pyreducer-graphs-nobb 0,1 240 "${TWO[@]}" ddp_resnet50.py \
    --compiled-ddp python_reducer --no-broadcast-buffers "${graphs[@]}"
  bench s11-native-2gpu-bf16-256-compile-noopt-graphs-nobb 0,1 110 "${TWO[@]}" ddp_resnet50.py \
    --compiled-ddp no_optimization --no-broadcast-buffers "${graphs[@]}"
}

cores_near() {  # cores_near GPU: four cores of the GPU's own NUMA node (from sysfs), or nothing when unknown
  local bus list first
  bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i "$1" 2>/dev/null | tr 'A-F' 'a-f')
  list=$(cat "/sys/bus/pci/devices/${bus#0000}/local_cpulist" 2>/dev/null)  # nvidia-smi: 00000000:18:00.0
  first=${list%%[-,]*}
  [[ "$first" =~ ^[0-9]+$ ]] && echo "$((first + 4 * ($1 + 1)))-$((first + 4 * ($1 + 1) + 3))"
}

section_twins6() {  # session 4, call 2: the launch-bound twins on one GPU (issue 3), many short alternations
  # 32 per GPU is bound by the host, whose speed drifts: three rounds, each GPU running native then Lightning
  # (GPU 0) or Lightning then native (GPU 1) at the same time, each process on four cores of its GPU's node
  local steps=(--batch-size-per-device 32 --warmup-steps 10 --steps 200) round pin0=() pin1=() c
  c=$(cores_near 0) && [ -n "$c" ] && pin0=(taskset -c "$c")
  c=$(cores_near 1) && [ -n "$c" ] && pin1=(taskset -c "$c")
  echo "# twins6 pinning: GPU 0 ${pin0[*]:-none}, GPU 1 ${pin1[*]:-none}" >>"$OUT_DIR/commands.txt"
  for round in 1 2 3; do
    { bench "t6-native-1gpu-bf16-32-gpu0-r$round" 0 120 "${pin0[@]}" "$PY" ddp_resnet50.py "${steps[@]}"
      bench "t6-lightning-1gpu-bf16-32-gpu0-r$round" 0 150 "${pin0[@]}" "$PY" lightning/ddp_resnet50.py "${steps[@]}"
    } &
    { bench "t6-lightning-1gpu-bf16-32-gpu1-r$round" 1 150 "${pin1[@]}" "$PY" lightning/ddp_resnet50.py "${steps[@]}"
      bench "t6-native-1gpu-bf16-32-gpu1-r$round" 1 120 "${pin1[@]}" "$PY" ddp_resnet50.py "${steps[@]}"
    } &
    wait
  done
}

section_autotune5() {  # session 4, call 2: Inductor's autotuning on GPU 0 (issue 7) while GPU 1 runs the
  # compiled references and the compiled twins on one GPU (issues 3 and 7)
  local graphs=(--cuda-graphs --warmup-steps 20 --steps 100)
  bench a5-native-1gpu-bf16-256-autotune-graphs 0 420 "$PY" ddp_resnet50.py \
    --compile-mode max-autotune-no-cudagraphs "${graphs[@]}" &
  { bench a5-native-1gpu-bf16-256-compile-graphs 1 300 "$PY" ddp_resnet50.py --compile "${graphs[@]}"
    bench a5-native-1gpu-bf16-256-compile 1 300 "$PY" ddp_resnet50.py --compile "${STEPS[@]}"
    bench a5-lightning-1gpu-bf16-256-compile 1 300 "$PY" lightning/ddp_resnet50.py --compile "${STEPS[@]}"
  } &
  wait
}

section_oom() {
  # A batch that cannot fit in 141 GB: every rank must end, rank 0 writing status "oom".
  # torchrun exits 1 when a worker fails; the workers' own exit code (4, out of memory) is in the log.
  EXPECT_EXIT=1 bench native-2gpu-oom 0,1 120 "${TWO[@]}" ddp_resnet50.py --batch-size-per-device 4096 \
    --warmup-steps 1 --steps 1
}

for section in "${sections[@]}"; do
  declare -F "section_$section" >/dev/null || usage "no section $section"
done
nvidia-smi -L; nvidia-smi topo -m
"$PY" -c "import torch, torchvision; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', \
torch.cuda.nccl.version(), 'torchvision', torchvision.__version__)"
for section in "${sections[@]}"; do
  "section_$section"
done
"$PY" - "$RES" <<'EOF'
import json, pathlib, sys
rows = []
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try:
        r = json.loads(path.read_text())
    except ValueError:
        rows.append(f"{path.stem:44s} unreadable"); continue
    t, s, m = r.get("throughput") or {}, r.get("step_time_ms") or {}, r.get("memory") or {}
    mad = 100 * s["mad"] / s["median"] if s else float("nan")
    rows.append(f"{path.stem:44s} {r['status']:8s} {t.get('images_per_second', 0):9.0f} img/s "
                f"{t.get('images_per_second_per_device', 0):7.0f}/dev  median {s.get('median', 0):7.2f} ms "
                f"MAD {mad:4.1f}%  peak {m.get('peak_allocated_mib') or 0:8.0f} MiB")
print("\n".join(rows))
EOF
if [ -s "$OUT_DIR/failed.txt" ]; then
  echo "runs that did not end as expected:" >&2
  cat "$OUT_DIR/failed.txt" >&2
  exit 1
fi
