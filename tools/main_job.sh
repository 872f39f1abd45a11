#!/usr/bin/env bash
# The main job of `make bench`: the native DDP benchmark on every GPU of this machine through torchrun,
# or, where no CUDA GPU is visible, a small CPU smoke run that says it is one.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=$(date -u +%Y%m%dT%H%M%SZ)
gpus=$(python -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
mkdir -p runs
if [ "$gpus" -gt 0 ]; then
  echo "main job: ddp_resnet50.py on $gpus GPU(s), 256 images per GPU, default precision and memory format"
  torchrun --standalone --nproc-per-node "$gpus" ddp_resnet50.py --output "runs/main-${gpus}gpu-$stamp.json" "$@"
else
  echo "main job: no CUDA GPU visible, so this is a CPU smoke run (2 gloo processes, 32 px images):"
  echo "it proves the benchmark works here; its images/s say nothing about GPU training speed."
  torchrun --standalone --nproc-per-node 2 ddp_resnet50.py --device cpu --image-size 32 \
    --batch-size-per-device 4 --warmup-steps 2 --steps 5 --lr 0.01 --output "runs/main-cpu-smoke-$stamp.json" "$@"
fi
