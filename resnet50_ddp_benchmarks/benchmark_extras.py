"""The benchmark scripts' options that need the repository's package, imported only when one of them is given.

ddp_resnet50.py and lightning/ddp_resnet50.py add these options to their command line when one of them is given (or
--help asks, where the package is found); a script copied alone names them in one line of its --help and refuses
them. Every other option, DDP's and cuDNN's included, is the script's own: it needs only torch, torchvision and its
framework.

- the fastest mode's capture: the whole step captured in one CUDA graph (GraphedStep) and the fixed fp16 loss scale
  that fits a graph (FixedLossScaler); its tuning: torch.compile's mode and Inductor's coordinate-descent tuning;
- the computation options: the same ResNet-50 computed another way (space-to-depth stem, a dense max-pool
  backward, batch-norm statistics from sums), meant for compiled steps, and the batch norms fused into the
  convolutions with cuDNN's graphs (fused_batch_norm.py, which needs nvidia-cudnn-frontend and a GPU);
- PyTorch's DDP compression hooks, and the collective probe (collective_probe.py) after the timed steps.
"""
import math
import os

import torch
import torch.nn.functional as F

COMPUTATION_OPTIONS = {"space_to_depth_stem": ("stem_conv", "space_to_depth"),
                       "dense_max_pool_backward": ("max_pool_backward", "dense"),
                       "sums_batch_norm": ("batch_norm", "sums")}


def add_arguments(parser, defaults):
    """This module's options on a script's parser, with the defaults the script records when an option is not
    given (its EXTRA_DEFAULTS: the one place they live). The script lists their names in its PACKAGE_OPTIONS."""
    speed = parser.add_argument_group("the fastest mode's capture and tuning (the package's benchmark_extras.py)")
    speed.add_argument("--cuda-graphs", action="store_true",
                       help="capture the whole training step (forward, backward with DDP's all-reduce, optimizer step) "
                            "in one CUDA graph as the last warm-up step, then replay it")
    speed.add_argument("--loss-scale", default="dynamic",
                       help="fp16: dynamic (GradScaler, whose overflow flag the host reads every step) or a fixed "
                            "power of two S: the loss times S, the gradients times 1/S, no overflow check, no host "
                            "read (%(default)s)")
    speed.add_argument("--compile-mode", choices=["default", "reduce-overhead", "max-autotune",
                                                  "max-autotune-no-cudagraphs"],
                       help="torch.compile's mode (implies --compile); the max-autotune ones tune as the next option")
    speed.add_argument("--coordinate-descent-tuning", action="store_true",
                       help="Inductor tunes the launch settings of each kernel it generates (longer compilation)")
    ddp = parser.add_argument_group("DDP communication (the package's benchmark_extras.py)")
    ddp.add_argument("--comm-hook", choices=["none", "bf16_compress", "fp16_compress"], default=defaults["comm_hook"],
                     help="PyTorch's DDP compression hooks: each bucket all-reduced in bf16 or fp16 (half the bytes) "
                          "(%(default)s)")
    ddp.add_argument("--collective-probe", action="store_true",
                     help="after the timed steps, time all-reduce, broadcast, all-gather and reduce-scatter over a "
                          "sweep of sizes and record their fitted latency and bus bandwidth in the result "
                          "(the package's collective_probe.py; scaling_model.py reads them)")
    computation = parser.add_argument_group("computation options: the same model computed another way, for compiled "
                                            "steps (the package's benchmark_extras.py)")
    computation.add_argument("--space-to-depth-stem", action="store_true",
                             help="ResNet's 7x7 stride-2 first convolution as the equal 4x4 stride-1 convolution of "
                                  "the image cut into 2x2 blocks of 12 channels (padded to 16)")
    computation.add_argument("--dense-max-pool-backward", action="store_true",
                             help="the stem's max-pool gradient from strided reads of the windows that hold each "
                                  "input position and their saved argmax, instead of a gather through the indices")
    computation.add_argument("--sums-batch-norm", action="store_true",
                             help="each training batch norm's statistics from one pass of per-channel sums of x and "
                                  "x*x (shifted by the running mean) instead of Welford's update")
    computation.add_argument("--fused-batch-norm", action="store_true",
                             help="each bottleneck's bn1 and bn2 (+ ReLU) fused into the convolution after it, and "
                                  "its statistics into the convolution before it, forward and backward, with cuDNN's "
                                  "graph API (needs nvidia-cudnn-frontend and a GPU; a layer whose graph cuDNN refuses "
                                  "runs in PyTorch, and the result records which ran fused)")


def resolve_options(args, config, world_size, UsageError):
    """Check this module's options and record what runs in config, before any GPU work; bad input raises the calling
    script's UsageError (one line naming the broken rule, exit code 2)."""
    for option, (key, value) in COMPUTATION_OPTIONS.items():
        config[key] = value if config.pop(option, False) else "torchvision"
    cuda, fp16 = config["device"] == "cuda", config["precision"] == "fp16"
    if config.pop("fused_batch_norm", False):
        from resnet50_ddp_benchmarks import fused_batch_norm
        missing = fused_batch_norm.available() or (not cuda and "--fused-batch-norm needs --device cuda")
        if config["batch_norm"] != "torchvision" or missing:
            raise UsageError(missing or "--fused-batch-norm and --sums-batch-norm both replace the batch norms")
        config["batch_norm"] = "fused"
    if config["collective_probe"] and world_size < 2:
        raise UsageError("--collective-probe needs several ranks: it times the collectives between them")
    loss_scale = args.loss_scale
    if loss_scale != "dynamic":
        try:
            loss_scale = float(loss_scale)
        except ValueError:
            loss_scale = 0.0
        if not (fp16 and 1 <= loss_scale <= 2**24 and math.frexp(loss_scale)[0] == 0.5):
            raise UsageError("--loss-scale must be dynamic or a power of two from 1 to 2**24, with --precision fp16")
        config.update(loss_scale=loss_scale, grad_scaler=False)
    graphs, mode = config["cuda_graphs"], config["compile_mode"]
    for broken, rule in (
            (config["coordinate_descent_tuning"] and not config["compile"],
             "--coordinate-descent-tuning needs --compile: it tunes Inductor's kernels"),
            (config["comm_hook"] != "none" and graphs,
             "--comm-hook does not combine with --cuda-graphs: the hook copies each bucket back after the capture"),
            (graphs and not cuda, "--cuda-graphs needs --device cuda"),
            (graphs and mode in ("reduce-overhead", "max-autotune"),
             f"--cuda-graphs conflicts with --compile-mode {mode}, which captures CUDA graphs itself"),
            (graphs and config["grad_scaler"], "--cuda-graphs with fp16 needs a fixed --loss-scale (e.g. 1024): the "
             "dynamic GradScaler reads its overflow flag on the host every step"),
            (graphs and config["warmup_steps"] < (12 if world_size > 1 else 2),
             f"--cuda-graphs needs --warmup-steps >= {12 if world_size > 1 else 2}: the last warm-up step is the "
             f"capture" + (", after the 11 eager steps that DDP needs" if world_size > 1 else ""))):
        if broken:
            raise UsageError(rule)
    if graphs:
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"  # NCCL's watchdog must not poll captured work
    if config["compile"]:
        import torch._inductor.config as inductor_config
        inductor_config.coordinate_descent_tuning |= config["coordinate_descent_tuning"]
        # what runs: the option, TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1, or a max-autotune mode (which sets it)
        config["coordinate_descent_tuning"] = bool(inductor_config.coordinate_descent_tuning) or mode.startswith(
            "max-autotune")


def probe_collectives(run):
    """collective_probe.py's sweep over the run's process group, every rank taking part; rank 0's result keeps it."""
    from resnet50_ddp_benchmarks import collective_probe
    return collective_probe.probe_collectives(device=run.device)


def comm_hook(config):
    """The DDP communication hook --comm-hook names (None: DDP's own all-reduce)."""
    if config["comm_hook"] == "none":
        return None
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return getattr(default_hooks, f"{config['comm_hook']}_hook")


def unscale_gradients(parameters, loss_scale):
    """A fixed fp16 loss scale undone: every gradient times 1/S in one foreach multiply, nothing read on the host."""
    torch._foreach_mul_([p.grad for p in parameters if p.grad is not None], 1.0 / loss_scale)


class FixedLossScaler:
    """A fixed fp16 --loss-scale S in torch.amp.GradScaler's shape (ddp_resnet50.py's step and the twin's
    MixedPrecision plugin drive it): the loss times S, the gradients times 1/S before the step, no overflow check,
    nothing read on the host (so the step can be captured)."""

    def __init__(self, scale):
        self.scale_value = scale
        self.unscaled = set()  # the optimizers unscaled since their last step

    def scale(self, loss):
        return loss * self.scale_value

    def unscale_(self, optimizer):
        unscale_gradients([p for group in optimizer.param_groups for p in group["params"]], self.scale_value)
        self.unscaled.add(id(optimizer))

    def step(self, optimizer, *args, **kwargs):
        # Lightning leaves unscaling to an optimizer that claims it (fused SGD, which expects a dynamic scaler's
        # state): unscale first, as a GradScaler's step does
        if id(optimizer) not in self.unscaled:
            self.unscale_(optimizer)
        self.unscaled.discard(id(optimizer))
        return optimizer.step(*args, **kwargs)

    def update(self):
        pass  # the scale is fixed


class GraphedStep:
    """Eager warm-up steps on a side stream, the capture of one whole step as the last warm-up step, then replays:
    a replay launches all of the step's kernels at once, which is what a small batch needs."""

    def __init__(self, step, eager_steps):
        self.step, self.eager_steps = step, eager_steps
        self.stream, self.graph, self.static_loss = torch.cuda.Stream(), None, None

    def __call__(self):
        if self.graph is None and self.eager_steps > 0:
            self.eager_steps -= 1
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                loss = self.step()
            torch.cuda.current_stream().wait_stream(self.stream)
            return loss
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):  # records the step; nothing runs until replay
                self.static_loss = self.step()
        self.graph.replay()
        return self.static_loss.clone()

    def reset(self):
        """Free the captured graph (after a synchronize), before the process group is destroyed."""
        if self.graph is not None:
            torch.cuda.synchronize()
            self.graph.reset()
        self.graph = self.static_loss = None


class SpaceToDepthConv(torch.nn.Module):
    """ResNet's first convolution (7x7, stride 2, padding 3, no bias) computed as a 4x4 stride-1 convolution of
    the image cut into 2x2 blocks stacked as channels (space to depth): the same weight parameter, the same
    output up to rounding. cuDNN gets 12 input channels (padded to `channels`) and a dense 4x4 kernel instead of 3
    channels and a 7x7 stride-2 kernel."""

    def __init__(self, conv, channels=16):
        super().__init__()
        if (conv.kernel_size, conv.stride, conv.padding, conv.dilation, conv.groups, conv.bias) != \
                ((7, 7), (2, 2), (3, 3), (1, 1), 1, None):
            raise ValueError("space to depth is written for ResNet's 7x7 stride-2 stem convolution")
        if channels < 4 * conv.in_channels:
            raise ValueError(f"{channels} channels cannot hold 2x2 blocks of {conv.in_channels}")
        self.weight, self.channels = conv.weight, channels  # the model's own parameter

    def forward(self, images):
        n, c, h, w = images.shape
        if torch.is_autocast_enabled(images.device.type):  # cast before the copy below, not after
            images = images.to(torch.get_autocast_dtype(images.device.type))
        padded = F.pad(images, (3, 3 + w % 2, 3, 3 + h % 2))  # even sides; the extra row meets a zero tap
        hb, wb = padded.shape[2] // 2, padded.shape[3] // 2
        blocks = padded.reshape(n, c, hb, 2, wb, 2).permute(0, 2, 4, 3, 5, 1).reshape(n, hb, wb, 4 * c)
        blocks = F.pad(blocks, (0, self.channels - 4 * c)).permute(0, 3, 1, 2)  # channels_last, (dy, dx, c) order
        out_channels = self.weight.shape[0]
        kernel = F.pad(self.weight, (0, 1, 0, 1)).reshape(out_channels, c, 4, 2, 4, 2)  # tap 7 is zero
        kernel = kernel.permute(0, 2, 4, 3, 5, 1).reshape(out_channels, 4, 4, 4 * c)
        kernel = F.pad(kernel, (0, self.channels - 4 * c)).permute(0, 3, 1, 2)
        return F.conv2d(blocks, kernel)  # autocast casts the weight as it casts any convolution's


class DenseMaxPoolFunction(torch.autograd.Function):
    """ResNet's 3x3 stride-2 padding-1 max pool whose backward reads, for each input position, the (at most
    four) windows that can hold it through plain strided loads, and keeps a window's gradient where the
    window's saved argmax (an int8 code 0-8 of its position in the window) is this position: the gradient
    of PyTorch's own backward, ties included. Inductor lowers PyTorch's backward to indirect loads through
    the indices; this form fuses into one kernel with direct loads."""

    @staticmethod
    def forward(ctx, images):
        out, indices = torch.ops.aten.max_pool2d_with_indices(images, [3, 3], [2, 2], [1, 1])
        height_out, width_out, width = out.shape[2], out.shape[3], images.shape[3]
        rows = torch.arange(height_out, device=images.device).view(height_out, 1)
        cols = torch.arange(width_out, device=images.device).view(1, width_out)
        code = (indices // width - 2 * rows + 1) * 3 + (indices % width - 2 * cols + 1)
        ctx.save_for_backward(code.to(torch.int8))
        ctx.input_size = images.shape[2:]
        return out

    @staticmethod
    def backward(ctx, grad_out):
        n, c, height_out, width_out = grad_out.shape
        grads = F.pad(grad_out, (0, 1, 0, 1)).permute(0, 2, 3, 1)  # (n, H+1, W+1, c): a zero window past the end
        codes = F.pad(ctx.saved_tensors[0], (0, 1, 0, 1), value=-1).permute(0, 2, 3, 1)
        accumulate = torch.float64 if grad_out.dtype == torch.float64 else torch.float32
        parity = torch.arange(2, device=codes.device)  # a (rows) and b (columns) below
        total = None
        for dy in (0, 1):  # input row 2i + a lies in windows i (a = 0, 1) and i + 1 (a = 1 only)
            for dx in (0, 1):
                window = (slice(None), slice(dy, dy + height_out), None, slice(dx, dx + width_out), None)
                # the code input (2i + a, 2j + b) has in window (i + dy, j + dx), or -2: not in that window
                row, col = parity.view(1, 1, 2, 1, 1, 1) - 2 * dy + 1, parity.view(1, 1, 1, 1, 2, 1) - 2 * dx + 1
                expected = torch.where((row >= 0) & (col >= 0), row * 3 + col, -2)
                part = torch.where(codes[window] == expected, grads[window].to(accumulate), 0.0)
                total = part if total is None else total + part
        height, width = ctx.input_size
        grad_in = total.to(grad_out.dtype).reshape(n, 2 * height_out, 2 * width_out, c)[:, :height, :width]
        return grad_in.permute(0, 3, 1, 2)


class DenseMaxPool(torch.nn.Module):
    def forward(self, images):
        return DenseMaxPoolFunction.apply(images)


class SumsBatchNormFunction(torch.autograd.Function):
    """Training-mode batch norm of an (N, C, H, W) tensor whose statistics come from per-channel sums of
    d = x - shift and of d * d in one pass (shift: the running mean, so that the subtraction below loses little
    when the mean is large against the spread), instead of Welford's update with a division per element, which
    Inductor generates for PyTorch's batch norm. The backward is PyTorch's formula. Returns the output, the
    batch mean and the biased batch variance."""

    @staticmethod
    def forward(ctx, x, weight, bias, shift, eps):
        accumulate = torch.float64 if x.dtype == torch.float64 else torch.float32
        count = x.numel() // x.shape[1]
        d = x.to(accumulate) - shift.to(accumulate).view(1, -1, 1, 1)
        mean_d = d.sum((0, 2, 3)) / count
        var = ((d * d).sum((0, 2, 3)) / count - mean_d * mean_d).clamp_min(0)
        mean = mean_d + shift.to(accumulate)
        rstd = torch.rsqrt(var + eps)
        scale = rstd * weight.to(accumulate)
        out = (x.to(accumulate) - mean.view(1, -1, 1, 1)) * scale.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.mark_non_differentiable(mean, var)
        return out.to(x.dtype), mean, var

    @staticmethod
    def backward(ctx, grad_out, grad_mean, grad_var):
        x, weight, mean, rstd = ctx.saved_tensors
        accumulate, count = rstd.dtype, x.numel() // x.shape[1]
        g = grad_out.to(accumulate)
        x_hat = (x.to(accumulate) - mean.view(1, -1, 1, 1)) * rstd.view(1, -1, 1, 1)
        grad_bias, grad_weight = g.sum((0, 2, 3)), (g * x_hat).sum((0, 2, 3))
        grad_x = (g - (grad_bias / count).view(1, -1, 1, 1) - x_hat * (grad_weight / count).view(1, -1, 1, 1)) \
            * (rstd * weight.to(accumulate)).view(1, -1, 1, 1)
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), grad_bias.to(weight.dtype), None, None


class SumsBatchNorm2d(torch.nn.BatchNorm2d):
    """torch.nn.BatchNorm2d whose training forward is SumsBatchNormFunction; evaluation is PyTorch's."""

    @classmethod
    def replacing(cls, norm):
        """The same module object (its own parameters and buffers, under the same names), with this forward."""
        if type(norm) is not torch.nn.BatchNorm2d or not (norm.affine and norm.track_running_stats) \
                or norm.momentum is None:
            raise ValueError("sums batch norm replaces BatchNorm2d with affine parameters, running statistics "
                             "and a momentum (ResNet's)")
        norm.__class__ = cls  # the same object: nothing copied, nothing renamed
        return norm

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        out, mean, var = SumsBatchNormFunction.apply(x, self.weight, self.bias, self.running_mean, self.eps)
        count = x.numel() // x.shape[1]
        with torch.no_grad():  # PyTorch's update: the unbiased variance, momentum-weighted
            self.running_mean.lerp_(mean.to(self.running_mean.dtype), self.momentum)
            self.running_var.lerp_((var * count / max(count - 1, 1)).to(self.running_var.dtype), self.momentum)
            self.num_batches_tracked.add_(1)
        return out


def replace_batch_norms(model):
    """Every BatchNorm2d of `model` turned into a SumsBatchNorm2d, in place."""
    for module in model.modules():
        if type(module) is torch.nn.BatchNorm2d:
            SumsBatchNorm2d.replacing(module)
    return model


def apply_computation_options(model, config):
    """The model with its stem and batch norms computed as config says; its parameters, buffers and their names
    are unchanged."""
    if config["stem_conv"] == "space_to_depth":
        model.conv1 = SpaceToDepthConv(model.conv1)
    if config["max_pool_backward"] == "dense":
        model.maxpool = DenseMaxPool()
    if config["batch_norm"] == "sums":
        replace_batch_norms(model)
    if config["batch_norm"] == "fused":  # which layers ran fused, recorded in the result as the run finds them
        from resnet50_ddp_benchmarks import fused_batch_norm
        config["fused_layers"] = fused_batch_norm.fuse_batch_norms(model)
    return model
