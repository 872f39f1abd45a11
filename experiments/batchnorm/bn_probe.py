"""What ResNet-50's 53 batch norms cost in a compiled step, with PyTorch's batch norm and with the scripts'
--sums-batch-norm.

The compiled kernel profile (../step-profile/data/profile-1gpu-compile-cdt-rank0.json) shows the forward batch-norm
statistics kernels (Inductor's Welford reduction over N, H and W of a channels_last tensor) reading their input at about
2.4 TB/s, where the normalisation kernels that follow read and write at 3.5-4.4 TB/s. This probe times batch
norm followed by ReLU, forward and backward as in training (channels_last, batch 256, fp16 or bf16 input as
autocast hands it over, fp32 parameters), compiled, for each of the twelve batch-norm shapes of ResNet-50 at
224 px, with CUDA events around each iteration after a warm-up, and sums the medians weighted by how many batch
norms of that shape the model has (53 in all; the model's adds before some ReLUs are left out).

    python experiments/batchnorm/bn_probe.py --batch-norm torchvision|sums [--precision fp16|bf16] \\
        [--coordinate-descent-tuning] [--json FILE]
    python experiments/batchnorm/bn_probe.py --check   # CPU, float64: sums batch norm is PyTorch's

--batch-norm sums is benchmark_extras.py's SumsBatchNorm2d, behind the scripts' --sums-batch-norm: statistics
from one pass of per-channel sums of x and x*x (shifted by the running mean) instead of Welford's update.
"""
import copy
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import probe_common as common  # noqa: E402

extras = common.extras

# (channels, height = width, how many of ResNet-50's batch norms have this shape at 224 px)
SHAPES = [(64, 112, 1), (64, 56, 6), (256, 56, 4), (128, 56, 1), (128, 28, 7), (512, 28, 5), (256, 28, 1),
          (256, 14, 11), (1024, 14, 7), (512, 14, 1), (512, 7, 5), (2048, 7, 4)]


def norm_and_relu(channels, form):
    norm = torch.nn.BatchNorm2d(channels)
    if form == "sums":
        norm = extras.SumsBatchNorm2d.replacing(norm)
    return torch.nn.Sequential(norm, torch.nn.ReLU(inplace=True))


def randomized(channels, mean):
    """PyTorch's batch norm + ReLU with its weight, bias and running statistics drawn at random (with the initial
    weight 1 and bias 0 a mishandled weight or bias would go unseen), the running mean near `mean`."""
    module = norm_and_relu(channels, "torchvision")
    with torch.no_grad():
        module[0].weight.uniform_(0.5, 1.5)
        module[0].bias.uniform_(-1.0, 1.0)
        module[0].running_mean.uniform_(-1.0, 1.0).add_(mean)
        module[0].running_var.uniform_(0.5, 2.0)
    return module


def as_form(module, form):
    module = copy.deepcopy(module)
    if form == "sums":
        extras.SumsBatchNorm2d.replacing(module[0])
    return module


def check():
    """On the CPU: in float64, eager and compiled, both memory layouts, the sums batch norm's output, input and
    parameter gradients and running statistics are PyTorch's; in float32, with a mean of 1000 against a spread
    of 3 and the running mean near it, its output is within 1e-4 of PyTorch's computed in float64; unshifted,
    the sums of x and x * x missed by 7e-2 (the variance loses its digits to the mean's square)."""
    torch.manual_seed(0)
    names = ("output", "input gradient", "weight gradient", "bias gradient", "running mean", "running variance")
    for layout in (torch.contiguous_format, torch.channels_last):
        for offset in (0.0, 1000.0):
            x = (torch.randn(4, 6, 5, 7, dtype=torch.float64) * 3 + offset).contiguous(memory_format=layout)
            grad = torch.randn_like(x)
            base = randomized(6, offset).double()
            runs = {}
            for form in ("torchvision", "sums"):
                for compiled in (False, True):
                    module, inputs = as_form(base, form), x.clone().requires_grad_(True)
                    run = torch.compile(module) if compiled else module
                    for _ in range(2):  # the second call sees the updated running statistics
                        out = run(inputs)
                    out.backward(grad)
                    runs[form, compiled] = (out, inputs.grad, module[0].weight.grad, module[0].bias.grad,
                                            module[0].running_mean, module[0].running_var)
            for key, values in runs.items():
                for name, want, got in zip(names, runs["torchvision", False], values):
                    if not torch.allclose(want, got, rtol=1e-9, atol=1e-9 * max(1.0, offset)):
                        raise SystemExit(f"check failed: {name} of {key} differs by {(want - got).abs().max()}")
    x = torch.randn(4, 6, 5, 7) * 3 + 1000
    base = randomized(6, 1000.0)
    want = as_form(base, "torchvision").double()(x.double())
    difference = (as_form(base, "sums")(x).double() - want).abs().max().item()
    if difference > 1e-4:
        raise SystemExit(f"check failed: float32 output differs from float64's by {difference:.1e}")
    print("check: the sums batch norm gives PyTorch's output, gradients and running statistics (float64, eager "
          f"and compiled, both layouts); float32 at a mean of 1000: {difference:.1e} from float64")


def main(argv=None):
    parser = common.OneLineArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-norm", choices=["torchvision", "sums"], default="torchvision")
    parser.add_argument("--precision", choices=["bf16", "fp16"], default="fp16")
    parser.add_argument("--coordinate-descent-tuning", action="store_true")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--batch", type=common.positive_int, default=256)
    parser.add_argument("--iterations", type=common.positive_int, default=50)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if common.ran_cpu_check(args, check, "batch norms"):
        return 0
    if args.coordinate_descent_tuning:
        torch._inductor.config.coordinate_descent_tuning = True
    device, dtype = torch.device("cuda"), {"bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    torch.manual_seed(0)
    shapes, total_ms = [], 0.0
    for channels, size, count in SHAPES:
        module = torch.compile(norm_and_relu(channels, args.batch_norm).to(device))
        with common.fits_in_memory(f"--batch {args.batch}"):
            x = torch.randn(args.batch, channels, size, size, device=device, dtype=dtype).contiguous(
                memory_format=torch.channels_last).requires_grad_(True)
            grad = torch.randn_like(x)
            for _ in range(5):
                module(x).backward(grad)
        stats = common.time_iterations(lambda: module(x).backward(grad), args.iterations, device)
        total_ms += count * stats["median"]
        shapes.append({"channels": channels, "size": size, "count": count, "median_ms": stats["median"],
                       "mad_ms": stats["mad"], "min_ms": stats["min"]})
        print(f"  {channels:5d} x {size:3d} x {size:3d} (x{count:2d}): median {stats['median']:.4f} ms "
              f"(MAD {stats['mad']:.4f})", flush=True)
    result = {"batch_norm": args.batch_norm, "precision": args.precision, "batch": args.batch,
              "coordinate_descent_tuning": args.coordinate_descent_tuning, "iterations": args.iterations,
              "weighted_ms_per_step": total_ms, "shapes": shapes, "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__}
    print(f"batch-norm probe: {args.batch_norm}, {args.precision}, coordinate descent "
          f"{args.coordinate_descent_tuning}: the 53 batch norms + ReLU, forward and backward, {total_ms:.3f} ms")
    if args.json:
        common.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    common.run_guarded(main)
