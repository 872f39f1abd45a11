"""What ResNet-50's stem costs on the GPU, and whether cuDNN finds faster convolutions when it may time more of them.

The eager kernel profile of a 256-image step (../ddp-scaling/profile-1gpu-rank0.json) puts about 5 ms of its
54 ms in the stem: the 7x7 stride-2 convolution of the 3-channel input (cuDNN pads the input to 8 channels on
every call), its weight gradient, and the 3x3 max pool forward and backward. This probe times the stem alone,
forward and backward as in training (bf16 autocast, channels_last, batch 256 at 224 px, the input not requiring
a gradient), with CUDA events around each iteration after a warm-up, and prints the median and MAD in ms.

    python docs/diagnostics/stem/stem_probe.py --part conv|stem [--pad-channels 3|4|8] [--benchmark-limit N]
                                               [--conv module|space-to-depth] [--s2d-channels 12|16]
                                               [--maxpool module|scatter|dense] [--precision bf16|fp16]
                                               [--compile] [--json FILE]
    python docs/diagnostics/stem/stem_probe.py --check     # CPU: each replacement's output and gradient are the module's

--part conv times conv1 alone; stem times conv1, bn1, relu and maxpool (the model's own modules, taken from
torchvision's resnet50). --pad-channels gives the input, and conv1's weight, extra zero channels (what
MLPerf's ResNet-50 implementations feed their stem) to see what cuDNN's padding costs. --benchmark-limit
sets torch.backends.cudnn.benchmark_limit (PyTorch's default 10; 0 times every algorithm cuDNN offers).
--maxpool scatter replaces the max pool's backward (one slow kernel in the compiled profile) by a scatter-add of
the output gradient to the positions the forward's indices name: the same gradient, routed to the same input
element as PyTorch's own backward, computed as one pass over the output instead of a gather per input element.
--conv space-to-depth and --maxpool dense are the scripts' --space-to-depth-stem and --dense-max-pool-backward
(the harness's SpaceToDepthConv and DenseMaxPool, imported from ddp_resnet50.py); --s2d-channels 12 leaves the
blocks' 12 channels unpadded (the scripts pad them to 16, the default). One configuration per process: cuDNN
keeps the algorithm it picked for a shape for the life of the process.
"""
import pathlib
import sys

import torch
import torchvision

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
import ddp_resnet50 as bench  # noqa: E402  (the harness's median and MAD)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import probe_checks  # noqa: E402


class ScatterMaxPool(torch.autograd.Function):
    """3x3, stride 2, padding 1 max pool (ResNet's) whose backward scatters each output gradient to its argmax."""

    @staticmethod
    def forward(ctx, images):
        out, indices = torch.ops.aten.max_pool2d_with_indices(images, [3, 3], [2, 2], [1, 1])
        ctx.save_for_backward(indices)
        ctx.input_shape = images.shape
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (indices,) = ctx.saved_tensors
        n, c, h, w = ctx.input_shape
        layout = torch.channels_last if indices.is_contiguous(memory_format=torch.channels_last) and not \
            indices.is_contiguous() else torch.contiguous_format
        grad_in = torch.empty((n, c, h, w), dtype=grad_out.dtype, device=grad_out.device, memory_format=layout).zero_()
        grad_out = grad_out.contiguous(memory_format=layout)
        # H and W merge into one dimension in either layout (W's stride times W is H's stride)
        grad_in.view(n, c, h * w).scatter_add_(2, indices.view(n, c, -1), grad_out.view(n, c, -1))
        return grad_in


class ScatterMaxPoolModule(torch.nn.Module):
    def forward(self, images):
        return ScatterMaxPool.apply(images)


def check():
    """On the CPU in float64: the scatter and dense max pools give the module's output and gradient, ties
    included, and the space-to-depth convolution the 7x7 one's output and weight gradient."""
    torch.manual_seed(0)
    for layout in (torch.contiguous_format, torch.channels_last):
        for size in (30, 31):
            images = torch.relu(torch.randn(4, 8, size, size, dtype=torch.float64)).round(decimals=1)  # many ties
            images = images.contiguous(memory_format=layout)
            for name, pool in (("scatter", ScatterMaxPoolModule()), ("dense", bench.DenseMaxPool())):
                reference = images.clone().requires_grad_(True)
                candidate = images.clone().requires_grad_(True)
                out_ref = torch.nn.MaxPool2d(3, 2, 1)(reference)
                out_new = pool(candidate)
                grad = torch.randn_like(out_ref)
                out_ref.backward(grad)
                out_new.backward(grad)
                assert torch.equal(out_ref, out_new), f"{name}: forward differs"
                difference = (reference.grad - candidate.grad).abs().max().item()
                assert difference < 1e-12, f"{name}: gradient differs by {difference}"
                print(f"check {name} max pool, {layout}, {size} px: forward equal, gradient max difference "
                      f"{difference:.1e}")
            conv = torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False).double()
            images = torch.randn(2, 3, 2 * size, 2 * size + 1, dtype=torch.float64).contiguous(memory_format=layout)
            out_ref, out_new = conv(images), bench.SpaceToDepthConv(conv)(images)
            grad = torch.randn_like(out_ref)
            (grad_ref,), (grad_new,) = (torch.autograd.grad(out, conv.weight, grad) for out in (out_ref, out_new))
            difference = max((out_ref - out_new).abs().max().item(), (grad_ref - grad_new).abs().max().item())
            assert difference < 1e-9, f"space to depth differs by {difference}"
            print(f"check space-to-depth convolution, {layout}, {tuple(images.shape)}: output and weight "
                  f"gradient max difference {difference:.1e}")


def main():
    parser = bench.OneLineArgumentParser(description=__doc__.splitlines()[0])  # bad input: one line, exit 2
    parser.add_argument("--part", choices=["conv", "stem"], default="stem")
    parser.add_argument("--pad-channels", type=int, choices=[3, 4, 8], default=3)
    parser.add_argument("--benchmark-limit", type=bench.non_negative_int)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--maxpool", choices=["module", "scatter", "dense"], default="module")
    parser.add_argument("--conv", choices=["module", "space-to-depth"], default="module")
    parser.add_argument("--s2d-channels", type=int, choices=[12, 16], help="with --conv space-to-depth (default 16)")
    parser.add_argument("--precision", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--batch", type=bench.positive_int, default=256)
    parser.add_argument("--iterations", type=bench.positive_int, default=100)
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.conv == "space-to-depth" and args.pad_channels != 3:
        raise bench.UsageError("--conv space-to-depth takes the 3-channel image (no --pad-channels)")
    if args.s2d_channels and args.conv != "space-to-depth":
        raise bench.UsageError("--s2d-channels needs --conv space-to-depth")
    if args.conv == "space-to-depth":
        args.s2d_channels = args.s2d_channels or 16
    if probe_checks.ran_cpu_check(args, check, "the stem"):
        return

    torch.backends.cudnn.benchmark = True
    if args.benchmark_limit is not None:
        torch.backends.cudnn.benchmark_limit = args.benchmark_limit
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None)
    conv = model.conv1
    if args.pad_channels != 3:
        padded = torch.nn.Conv2d(args.pad_channels, 64, 7, 2, 3, bias=False)
        with torch.no_grad():
            padded.weight.zero_()
            padded.weight[:, :3] = conv.weight
        conv = padded
    if args.conv == "space-to-depth":
        conv = bench.SpaceToDepthConv(conv, channels=args.s2d_channels)
    maxpool = {"module": model.maxpool, "scatter": ScatterMaxPoolModule(), "dense": bench.DenseMaxPool()}[args.maxpool]
    modules = [conv] if args.part == "conv" else [conv, model.bn1, model.relu, maxpool]
    stem = torch.nn.Sequential(*modules).to(device, memory_format=torch.channels_last)
    if args.compile:
        stem = torch.compile(stem)

    def iteration():
        with torch.autocast("cuda", dtype=dtype):
            out = stem(images)
        out.backward(grad_out)

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    with probe_checks.fits_in_memory(f"--batch {args.batch}"):
        images = torch.randn(args.batch, 3, 224, 224, device=device)
        if args.pad_channels != 3:
            images = torch.cat([images, images.new_zeros(args.batch, args.pad_channels - 3, 224, 224)], 1)
        images = images.contiguous(memory_format=torch.channels_last)
        out_shape = stem(images).shape
        grad_out = torch.randn(out_shape, device=device, dtype=dtype).contiguous(
            memory_format=torch.channels_last)
        for _ in range(10):  # the warm-up reaches the peak memory of the timed iterations
            iteration()
    stats = probe_checks.time_iterations(iteration, args.iterations, device)
    median, mad, fastest = stats["median"], stats["mad"], stats["min"]
    result = {"part": args.part, "pad_channels": args.pad_channels, "compile": args.compile, "maxpool": args.maxpool,
              "conv": args.conv, "s2d_channels": args.s2d_channels,
              "precision": args.precision,
              "benchmark_limit": torch.backends.cudnn.benchmark_limit, "batch": args.batch,
              "median_ms": median, "mad_ms": mad, "min_ms": fastest, "iterations": args.iterations,
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version()}
    print(f"stem probe: part {args.part}, {args.pad_channels} input channels, conv {args.conv}"
          f"{f' ({args.s2d_channels} channels)' if args.s2d_channels else ''}, max pool {args.maxpool}, "
          f"{args.precision}, "
          f"compile {args.compile}, "
          f"benchmark_limit {result['benchmark_limit']}: median {median:.3f} ms (MAD {mad:.3f}, min {fastest:.3f})")
    if args.json:
        bench.write_json_atomically(args.json, result)


if __name__ == "__main__":
    bench.run_guarded(main)
