"""What ResNet-50's stem costs on the GPU, computed as torchvision computes it and as the scripts'
--space-to-depth-stem and --dense-max-pool-backward compute it.

Times the stem alone, forward and backward as in training (autocast, channels_last, batch 256 at 224 px, the input
not requiring a gradient), each iteration between CUDA events after a warm-up, and prints the median and MAD in ms.

    python experiments/stem/stem_probe.py --part conv|stem [--conv module|space-to-depth] \\
        [--maxpool module|dense] [--precision bf16|fp16] [--compile] [--json FILE]
    python experiments/stem/stem_probe.py --check   # CPU, float64: each replacement gives the module's results

--part conv times conv1 alone; stem times conv1, bn1, relu and maxpool (torchvision's resnet50 modules).
--conv space-to-depth and --maxpool dense are benchmark_extras.py's SpaceToDepthConv and DenseMaxPool, the
modules behind the scripts' options. One configuration per process: cuDNN keeps the algorithm it picked for a
shape for the life of the process.
"""
import pathlib
import sys

import torch
import torchvision

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import probe_common as common  # noqa: E402

extras = common.extras


def check():
    """On the CPU in float64: the dense max pool gives the module's output and gradient (ties included), and the
    space-to-depth convolution the 7x7 one's output and weight gradient, in both memory layouts."""
    torch.manual_seed(0)
    for layout in (torch.contiguous_format, torch.channels_last):
        for size in (30, 31):
            images = torch.relu(torch.randn(4, 8, size, size, dtype=torch.float64)).round(decimals=1)  # many ties
            images = images.contiguous(memory_format=layout)
            reference, candidate = (images.clone().requires_grad_(True) for _ in range(2))
            out_ref, out_new = torch.nn.MaxPool2d(3, 2, 1)(reference), extras.DenseMaxPool()(candidate)
            grad = torch.randn_like(out_ref)
            out_ref.backward(grad)
            out_new.backward(grad)
            assert torch.equal(out_ref, out_new), "dense max pool: forward differs"
            difference = (reference.grad - candidate.grad).abs().max().item()
            assert difference < 1e-12, f"dense max pool: gradient differs by {difference}"
            print(f"check dense max pool, {layout}, {size} px: forward equal, gradient max difference {difference:.1e}")
            conv = torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False).double()
            images = torch.randn(2, 3, 2 * size, 2 * size + 1, dtype=torch.float64).contiguous(memory_format=layout)
            out_ref, out_new = conv(images), extras.SpaceToDepthConv(conv)(images)
            grad = torch.randn_like(out_ref)
            (grad_ref,), (grad_new,) = (torch.autograd.grad(out, conv.weight, grad) for out in (out_ref, out_new))
            difference = max((out_ref - out_new).abs().max().item(), (grad_ref - grad_new).abs().max().item())
            assert difference < 1e-9, f"space to depth differs by {difference}"
            print(f"check space-to-depth convolution, {layout}, {tuple(images.shape)}: output and weight "
                  f"gradient max difference {difference:.1e}")


def main(argv=None):
    parser = common.OneLineArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["conv", "stem"], default="stem")
    parser.add_argument("--conv", choices=["module", "space-to-depth"], default="module")
    parser.add_argument("--maxpool", choices=["module", "dense"], default="module")
    parser.add_argument("--precision", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--batch", type=common.positive_int, default=256)
    parser.add_argument("--iterations", type=common.positive_int, default=100)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if common.ran_cpu_check(args, check, "the stem"):
        return 0
    torch.backends.cudnn.benchmark = True
    device, dtype = torch.device("cuda"), {"bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None)
    conv = extras.SpaceToDepthConv(model.conv1) if args.conv == "space-to-depth" else model.conv1
    maxpool = extras.DenseMaxPool() if args.maxpool == "dense" else model.maxpool
    stem = torch.nn.Sequential(*([conv] if args.part == "conv" else [conv, model.bn1, model.relu, maxpool]))
    stem = stem.to(device, memory_format=torch.channels_last)
    if args.compile:
        stem = torch.compile(stem)

    def iteration():
        with torch.autocast("cuda", dtype=dtype):
            out = stem(images)
        out.backward(grad_out)

    with common.fits_in_memory(f"--batch {args.batch}"):
        images = torch.randn(args.batch, 3, 224, 224, device=device).contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=dtype):
            shape = stem(images).shape
        grad_out = torch.randn(shape, device=device, dtype=dtype).contiguous(memory_format=torch.channels_last)
        for _ in range(10):  # the warm-up reaches the peak memory of the timed iterations
            iteration()
    stats = common.time_iterations(iteration, args.iterations, device)
    result = {"part": args.part, "conv": args.conv, "maxpool": args.maxpool, "precision": args.precision,
              "compile": args.compile, "batch": args.batch, "median_ms": stats["median"], "mad_ms": stats["mad"],
              "min_ms": stats["min"], "iterations": args.iterations, "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
    print(f"stem probe: part {args.part}, conv {args.conv}, max pool {args.maxpool}, {args.precision}, compile "
          f"{args.compile}: median {stats['median']:.3f} ms (MAD {stats['mad']:.3f}, min {stats['min']:.3f})")
    if args.json:
        common.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    common.run_guarded(main)
