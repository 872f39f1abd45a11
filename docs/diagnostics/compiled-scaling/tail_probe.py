"""What DDP adds after a compiled backward: the work no computation can hide in `--compiled-ddp no_optimization`.

With `--compile --compiled-ddp no_optimization` the whole backward is one compiled autograd node that hands back
every gradient at its end, so DDP's reducer sees all of them at once: it copies each gradient into its bucket
(scaled by 1/world size, one kernel per parameter) and all-reduces the buckets after the backward, with nothing
left to overlap. This probe times exactly that tail with DDP itself: a module whose backward returns ResNet-50's
161 gradients at once (precomputed tensors, cloned the way a compiled backward hands out fresh ones), once plain
and once wrapped in DDP as `ddp_resnet50.py` wraps the model (gradient views of the buckets, `--bucket-cap-mb`,
buffers not broadcast). The difference of the two medians (CUDA events around forward + backward, ranks aligned
by the all-reduce itself) is what DDP adds. The GPU work of an iteration is small (copies of 102 MB and one
all-reduce of it), so on an H200 the events measure the host's pace: the figure is DDP's host time for the tail,
with its GPU time hidden inside it (README.md beside this file: measured 3.7 ms with 25 MB buckets, 1.3 ms with
100 MB buckets). In the real compiled step the host runs 30 ms or more ahead of the GPU, so that host time
is hidden there; the tail's GPU time alone is not isolated by this probe.

    torchrun --nproc-per-node 2 docs/diagnostics/compiled-scaling/tail_probe.py [--hook none|bf16]
                                [--bucket-cap-mb MB] [--iterations N] [--json FILE]

--hook bf16 registers PyTorch's bf16_compress_hook (the gradients all-reduced in bfloat16, half the bytes).
--device cpu runs the same on gloo (the CI test; only --hook none there).
"""
import pathlib
import sys

import torch
import torch.distributed as dist
import torchvision
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
import ddp_resnet50 as bench  # noqa: E402  (the harness's median and MAD, its JSON writer and checks)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import probe_checks  # noqa: E402


class AllGradients(torch.autograd.Function):
    """Forward: a scalar that depends on every parameter. Backward: every parameter's gradient at once."""

    @staticmethod
    def forward(ctx, anchor, gradients, *parameters):
        ctx.gradients = gradients
        return anchor.sum() * 0

    @staticmethod
    def backward(ctx, grad_output):
        return (None, None, *(g.clone() for g in ctx.gradients))


class GradientSource(torch.nn.Module):
    """ResNet-50's parameters, in the model's order (DDP buckets them as it buckets the real model's)."""

    def __init__(self, device):
        super().__init__()
        self.net = torchvision.models.resnet50(weights=None).to(device)
        self.gradients = [torch.randn_like(p) for p in self.net.parameters()]

    def forward(self, anchor):
        return AllGradients.apply(anchor, self.gradients, *self.net.parameters())


def time_iterations(module, anchor, iterations, device):
    """Median and MAD (ms) of forward + backward, CUDA events on the GPU, the host clock on the CPU."""
    def iteration():
        module.zero_grad(set_to_none=True)
        module(anchor).backward()

    for _ in range(10):
        iteration()
    timer = bench.StepTimer(device, iterations)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    timer.mark()
    for _ in range(iterations):
        iteration()
        timer.mark()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return bench.summarize(timer.step_times_ms())


def main():
    parser = bench.OneLineArgumentParser(description=__doc__.splitlines()[0])  # bad input: one line, exit 2
    parser.add_argument("--hook", choices=["none", "bf16"], default="none")
    parser.add_argument("--bucket-cap-mb", type=bench.bucket_megabytes, default=25.0)
    parser.add_argument("--iterations", type=bench.positive_int, default=50)
    probe_checks.add_distributed_arguments(parser)
    args = parser.parse_args()
    probe_checks.check_distributed_launch(args, "the tail is what two or more ranks add")
    if args.device == "cpu" and args.hook == "bf16":
        raise bench.UsageError("--hook bf16 is for NCCL on the GPU (--device cpu runs gloo with --hook none)")

    rank, device = probe_checks.start_distributed(args.device)
    world_size = dist.get_world_size()
    torch.manual_seed(rank)  # each rank its own gradients (DDP broadcasts rank 0's parameters)
    source = GradientSource(device)
    anchor = torch.zeros(1, device=device, requires_grad=True)
    plain = time_iterations(source, anchor, args.iterations, device)

    wrapped = DistributedDataParallel(source, device_ids=[device.index] if device.type == "cuda" else None,
                                      bucket_cap_mb=args.bucket_cap_mb, gradient_as_bucket_view=True,
                                      broadcast_buffers=False)
    if args.hook == "bf16":
        wrapped.register_comm_hook(None, default_hooks.bf16_compress_hook)
    ddp = time_iterations(wrapped, anchor, args.iterations, device)
    # the gradients were averaged: every rank holds the same values afterwards
    checksum = torch.tensor([sum(p.grad.double().sum().item() for p in source.parameters())], device=device)
    gathered = [torch.zeros_like(checksum) for _ in range(world_size)]
    dist.all_gather(gathered, checksum)
    in_sync = all(torch.equal(gathered[0], other) for other in gathered)
    parameter_bytes = sum(p.numel() * p.element_size() for p in source.parameters())
    result = {"world_size": world_size, "hook": args.hook, "bucket_cap_mb": args.bucket_cap_mb,
              "parameters": len(list(source.parameters())), "gradient_bytes": parameter_bytes,
              "iterations": args.iterations, "plain_ms": plain, "ddp_ms": ddp,
              "tail_ms": ddp["median"] - plain["median"], "gradients_in_sync": in_sync,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))
              if device.type == "cuda" else None}
    if rank == 0:
        print(f"tail probe: {world_size} ranks, hook {args.hook}, buckets {args.bucket_cap_mb:g} MB: "
              f"plain {plain['median']:.3f} ms, DDP {ddp['median']:.3f} ms (MAD {ddp['mad']:.3f}), "
              f"tail {result['tail_ms']:.3f} ms, gradients in sync: {in_sync}", flush=True)
        if args.json:
            bench.write_json_atomically(args.json, result)
    dist.destroy_process_group()
    if not in_sync:
        sys.exit(1)


if __name__ == "__main__":
    bench.run_guarded(main)
