"""--fused-batch-norm: the batch norms inside ResNet-50's bottlenecks fused into the convolutions that read them, with
cuDNN's graph API (the package nvidia-cudnn-frontend, `import cudnn`), as MLPerf's ResNet-50 implementations run them.

In a bottleneck, conv2 reads ReLU(bn1(y1)) and conv3 reads ReLU(bn2(y2)), y being the convolution's raw output before
it. Each is one unit: ReLU(y * S + B) -> convolution, with S = gamma / sqrt(var + eps) and B = beta - mean * S from
y's batch statistics.

    forward   one graph: scale + bias + ReLU -> convolution -> its output and the output's per-channel sum and sum
              of squares (genstats: the next batch norm's statistics, with no pass of their own)
    backward  dgrad -> ReLU's backward, the mask recomputed from y * S + B (one graph, writing dr); the batch norm's
              backward from dr (one graph: dx, dgamma, dbeta); scale + bias + ReLU -> wgrad (one graph)

bn1's statistics come from one reduction of y1 in PyTorch; bn3, the shortcut's add and ReLU, the downsampling branch
and the stem are torchvision's. Each unit is a PyTorch custom operator (a fake implementation gives torch.compile its
shapes, so a compiled step calls it as one kernel). Graphs are built on a unit's first call, once per pattern, shape,
precision and GPU, and cached: the warm-up steps build them, before a CUDA graph's capture (--cuda-graphs), whose
replays then run them. A pattern cuDNN refuses (a precision, a shape, an architecture), and any input that is not a
channels_last fp16 or bf16 CUDA tensor, runs as the same computation in PyTorch's operators for that layer only;
LAYERS records per layer which of its four graphs ran fused. Evaluation mode is torchvision's. The model keeps its
parameters and buffers under their names, and the running statistics are updated as PyTorch's batch norm does.
"""
import atexit

import torch
import torch.nn.functional as F
from torchvision.models.resnet import Bottleneck

PATTERNS = ("forward", "dgrad_drelu", "dbn", "wgrad")
LAYERS = {}  # layer name -> {pattern: True where cuDNN's graph ran, False where PyTorch's operators did}
GRAPHS = {}  # (pattern, x's shape, W's shape, dtype, stride, padding, device) -> (graph, its tensors, S/B dtype) or None
HANDLES = {}  # device index -> cuDNN handle
REFUSALS = {}  # pattern -> cuDNN's first reason for refusing it, per scale/bias type (a record for the reader)


@atexit.register
def release():
    """The graphs and handles freed before the interpreter's teardown, where nanobind reports the cuDNN objects still
    alive as leaked."""
    GRAPHS.clear()
    HANDLES.clear()


def available():
    """None when the option can run here, else why not (one line)."""
    try:
        import cudnn  # noqa: F401
    except ImportError:
        return "--fused-batch-norm needs the package nvidia-cudnn-frontend (pip install '.[fused]')"
    if not torch.cuda.is_available():
        return "--fused-batch-norm needs a CUDA GPU: cuDNN's fused graphs run there"
    return None


def wide(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def layout(x):
    """The memory format a unit's outputs take after x's: channels_last when x's channels are innermost."""
    return torch.channels_last if x.dim() == 4 and x.stride(1) == 1 and x.shape[1] > 1 else torch.contiguous_format


def out_shape(x, weight, stride, padding):
    k = weight.shape[2]
    side = lambda size: (size + 2 * padding - k) // stride + 1  # noqa: E731
    return x.shape[0], weight.shape[0], side(x.shape[2]), side(x.shape[3])


def fold(gamma, beta, mean, invstd):
    """Batch norm as one scale and bias per channel."""
    scale = gamma.to(mean.dtype) * invstd
    return scale, beta.to(mean.dtype) - mean * scale


def channels(v):
    return v.reshape(1, -1, 1, 1)


# ---- cuDNN's graphs ------------------------------------------------------------------------------------------------

def handle(device):
    import cudnn
    if device.index not in HANDLES:
        with torch.cuda.device(device):
            HANDLES[device.index] = cudnn.create_handle()
    return HANDLES[device.index]


def nhwc(dim):
    """The strides of a channels_last (N, C, H, W) tensor."""
    n, c, h, w = dim
    return [c * h * w, 1, w * c, c]


def make_graph(cudnn, pattern, io, sb, xdim, wdim, ydim, stride, padding, device):
    """One pattern's graph, not yet built, and its tensors by name."""
    FLOAT = cudnn.data_type.FLOAT
    graph = cudnn.pygraph(io_data_type=io, intermediate_data_type=FLOAT, compute_data_type=FLOAT,
                          handle=handle(device))
    conv = dict(padding=[padding] * 2, stride=[stride] * 2, dilation=[1, 1])

    def tensor(name, dim, dtype=io):
        t[name] = graph.tensor(name=name, dim=list(dim), stride=nhwc(dim), data_type=dtype)
        return t[name]

    def output(name, value, dim, dtype=io):
        value.set_output(True).set_data_type(dtype).set_dim(list(dim)).set_stride(nhwc(dim))
        t[name] = value

    def activation():  # y * S + B (ReLU follows, or its backward)
        per_channel = [1, xdim[1], 1, 1]
        scaled = graph.scale(name="scale", input=tensor("x", xdim), scale=tensor("s", per_channel, sb))
        return graph.bias(name="bias", input=scaled, bias=tensor("b", per_channel, sb))

    t = {}
    if pattern == "forward":
        y = graph.conv_fprop(name="conv", image=graph.relu(name="relu", input=activation()), weight=tensor("w", wdim),
                             **conv)
        output("y", y, ydim)
        total, squares = graph.genstats(name="genstats", input=y)
        output("sum", total, [1, ydim[1], 1, 1], FLOAT)
        output("sqsum", squares, [1, ydim[1], 1, 1], FLOAT)
    elif pattern == "dgrad_drelu":
        da = graph.conv_dgrad(name="dgrad", loss=tensor("dy", ydim), filter=tensor("w", wdim), **conv)
        da.set_dim(list(xdim)).set_stride(nhwc(xdim)).set_data_type(FLOAT)
        output("dr", graph.relu_backward(name="drelu", loss=da, input=activation()), xdim)
    elif pattern == "dbn":
        per_channel = [1, xdim[1], 1, 1]
        dx, dgamma, dbeta = graph.batchnorm_backward(
            name="dbn", grad=tensor("dr", xdim), input=tensor("x", xdim), scale=tensor("gamma", per_channel, FLOAT),
            mean=tensor("mean", per_channel, FLOAT), inv_variance=tensor("invstd", per_channel, FLOAT))
        output("dx", dx, xdim)
        output("dgamma", dgamma, per_channel, FLOAT)
        output("dbeta", dbeta, per_channel, FLOAT)
    else:  # wgrad
        a = graph.relu(name="relu", input=activation())
        output("dw", graph.conv_wgrad(name="wgrad", image=a, loss=tensor("dy", ydim), **conv), wdim)
    return graph, t


def graph_for(pattern, x, weight, stride, padding):
    """The pattern's built graph for x and W, built on first use and cached: (graph, tensors, scale/bias dtype), or
    None where it cannot run fused (the inputs, or cuDNN refuses the pattern with scale and bias in fp32 and in the
    input's precision)."""
    if not (x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and layout(x) == torch.channels_last):
        return None
    key = (pattern, tuple(x.shape), tuple(weight.shape), x.dtype, stride, padding, x.device.index)
    if key not in GRAPHS:
        import cudnn
        io = {torch.float16: cudnn.data_type.HALF, torch.bfloat16: cudnn.data_type.BFLOAT16}[x.dtype]
        GRAPHS[key] = None
        for sb, sb_dtype in ((cudnn.data_type.FLOAT, torch.float32), (io, x.dtype)):
            try:
                graph, tensors = make_graph(cudnn, pattern, io, sb, x.shape, weight.shape,
                                            out_shape(x, weight, stride, padding), stride, padding, x.device)
                graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            except Exception as error:  # noqa: BLE001 - cuDNN offers no engine: the next type, else PyTorch's ops
                REFUSALS.setdefault(f"{pattern} {x.dtype} S/B {sb_dtype}", " ".join(str(error).split())[:300])
                continue
            GRAPHS[key] = graph, tensors, sb_dtype
            break
    return GRAPHS[key]


def run(entry, bound, device):
    """One built graph on the current stream, over tensors bound by name."""
    import cudnn
    graph, tensors, _ = entry
    workspace = torch.empty(max(1, graph.get_workspace_size()), dtype=torch.uint8, device=device)
    cudnn_handle = handle(device)
    cudnn.set_stream(cudnn_handle, torch.cuda.current_stream(device).cuda_stream)
    graph.execute({tensors[name]: value for name, value in bound.items()}, workspace, handle=cudnn_handle)


def ran(layer, pattern, entry):
    LAYERS.setdefault(layer, {})[pattern] = entry is not None
    return entry


def empty(shape, like, dtype=None, memory_format=None):
    return torch.empty(shape, dtype=dtype or like.dtype, device=like.device,
                       memory_format=memory_format or layout(like))


# ---- the unit as PyTorch operators ---------------------------------------------------------------------------------

@torch.library.custom_op("resnet50_ddp_benchmarks::bn_relu_conv", mutates_args=())
def bn_relu_conv(x: torch.Tensor, weight: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, mean: torch.Tensor,
                 invstd: torch.Tensor, stride: int, padding: int, layer: str) -> tuple[torch.Tensor, torch.Tensor,
                                                                                         torch.Tensor]:
    """conv(ReLU(x * S + B), W) in x's precision, and its per-channel sum and sum of squares (float32 at least)."""
    scale, bias = fold(gamma, beta, mean, invstd)
    w = weight.to(x.dtype).contiguous(memory_format=layout(x))
    y = empty(out_shape(x, weight, stride, padding), x)
    entry = ran(layer, "forward", graph_for("forward", x, weight, stride, padding))
    if entry is None:
        a = torch.relu(x.to(scale.dtype) * channels(scale) + channels(bias)).to(x.dtype)
        y.copy_(F.conv2d(a, w, None, stride, padding))
        wide_y = y.to(wide(x.dtype))
        return y, wide_y.sum((0, 2, 3)), (wide_y * wide_y).sum((0, 2, 3))
    total, squares = (torch.empty(y.shape[1], dtype=torch.float32, device=x.device) for _ in range(2))
    sb = entry[2]
    run(entry, {"x": x, "w": w, "s": scale.to(sb), "b": bias.to(sb), "y": y, "sum": total, "sqsum": squares},
        x.device)
    return y, total, squares


@bn_relu_conv.register_fake
def _(x, weight, gamma, beta, mean, invstd, stride, padding, layer):
    y = empty(out_shape(x, weight, stride, padding), x)
    return y, *(x.new_empty(weight.shape[0], dtype=wide(x.dtype)) for _ in range(2))


@torch.library.custom_op("resnet50_ddp_benchmarks::bn_relu_conv_backward", mutates_args=())
def bn_relu_conv_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, gamma: torch.Tensor,
                          beta: torch.Tensor, mean: torch.Tensor, invstd: torch.Tensor, stride: int, padding: int,
                          layer: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The unit's gradients dx (the batch statistics' part included), dW, dgamma and dbeta, from dy."""
    scale, bias = fold(gamma, beta, mean, invstd)
    w = weight.to(x.dtype).contiguous(memory_format=layout(x))
    count = x.numel() // x.shape[1]
    entry = ran(layer, "dgrad_drelu", graph_for("dgrad_drelu", x, weight, stride, padding))
    if entry is None:
        da = torch.nn.grad.conv2d_input(x.shape, w, dy, stride, padding).to(scale.dtype)
        dr = da * (x.to(scale.dtype) * channels(scale) + channels(bias) > 0)
    else:
        dr = empty(x.shape, x)
        run(entry, {"dy": dy, "w": w, "x": x, "s": scale.to(entry[2]), "b": bias.to(entry[2]), "dr": dr}, x.device)
    entry = ran(layer, "dbn", graph_for("dbn", dr, weight, stride, padding) if dr.dtype == x.dtype else None)
    if entry is None:
        dr = dr.to(scale.dtype)
        x_hat = (x.to(scale.dtype) - channels(mean)) * channels(invstd)
        dbeta, dgamma = dr.sum((0, 2, 3)), (dr * x_hat).sum((0, 2, 3))
        dx = channels(gamma.to(scale.dtype) * invstd) * (dr - channels(dbeta / count) - x_hat * channels(dgamma / count))
        dx = empty(x.shape, x).copy_(dx)
    else:
        dx, (dgamma, dbeta) = empty(x.shape, x), (torch.empty_like(mean, dtype=torch.float32) for _ in range(2))
        run(entry, {"dr": dr, "x": x, "gamma": gamma.float(), "mean": mean.float(), "invstd": invstd.float(), "dx": dx,
                    "dgamma": dgamma, "dbeta": dbeta}, x.device)
    entry = ran(layer, "wgrad", graph_for("wgrad", x, weight, stride, padding))
    if entry is None:
        a = torch.relu(x.to(scale.dtype) * channels(scale) + channels(bias)).to(x.dtype)
        dw = torch.nn.grad.conv2d_weight(a, weight.shape, dy, stride, padding)
    else:
        dw = empty(weight.shape, x)
        run(entry, {"x": x, "dy": dy, "s": scale.to(entry[2]), "b": bias.to(entry[2]), "dw": dw}, x.device)
    dweight = torch.empty_like(weight).copy_(dw)
    return dx, dweight, dgamma.to(gamma.dtype), dbeta.to(beta.dtype)


@bn_relu_conv_backward.register_fake
def _(dy, x, weight, gamma, beta, mean, invstd, stride, padding, layer):
    return empty(x.shape, x), torch.empty_like(weight), torch.empty_like(gamma), torch.empty_like(beta)


def save_unit(ctx, inputs, output):
    x, weight, gamma, beta, mean, invstd, stride, padding, layer = inputs
    ctx.save_for_backward(x, weight, gamma, beta, mean, invstd)
    ctx.conv = stride, padding, layer


def unit_backward(ctx, dy, _total, _squares):
    x = ctx.saved_tensors[0]
    dy = dy.contiguous(memory_format=layout(x))
    return *bn_relu_conv_backward(dy, *ctx.saved_tensors, *ctx.conv), None, None, None, None, None


bn_relu_conv.register_autograd(unit_backward, setup_context=save_unit)


# ---- the model -----------------------------------------------------------------------------------------------------

def batch_statistics(norm, y, total=None, squares=None):
    """norm's batch mean and 1 / sqrt(var + eps) for y (from its sum and sum of squares when given), and norm's
    running statistics updated as PyTorch's batch norm updates them (the unbiased variance, momentum-weighted)."""
    count = y.numel() // y.shape[1]
    with torch.no_grad():
        if total is None:
            var, mean = torch.var_mean(y.to(wide(y.dtype)), dim=(0, 2, 3), unbiased=False)
        else:
            mean = total / count
            var = (squares / count - mean * mean).clamp_min(0)
        norm.running_mean.lerp_(mean.to(norm.running_mean.dtype), norm.momentum)
        norm.running_var.lerp_((var * count / max(count - 1, 1)).to(norm.running_var.dtype), norm.momentum)
        norm.num_batches_tracked.add_(1)
        return mean, torch.rsqrt(var + norm.eps)


class FusedBottleneck(Bottleneck):
    """torchvision's Bottleneck whose training forward runs conv2 and conv3 as fused units; evaluation is
    torchvision's."""

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        identity = x if self.downsample is None else self.downsample(x)
        y1 = self.conv1(x)
        mean, invstd = batch_statistics(self.bn1, y1)
        y2, total, squares = bn_relu_conv(y1, self.conv2.weight, self.bn1.weight, self.bn1.bias, mean, invstd,
                                          self.conv2.stride[0], self.conv2.padding[0], self.fused_names[0])
        mean, invstd = batch_statistics(self.bn2, y2, total, squares)
        y3, _, _ = bn_relu_conv(y2, self.conv3.weight, self.bn2.weight, self.bn2.bias, mean, invstd,
                                self.conv3.stride[0], self.conv3.padding[0], self.fused_names[1])
        return torch.relu(self.bn3(y3) + identity)


def fuse_batch_norms(model):
    """Every Bottleneck of `model` turned into a FusedBottleneck, in place (the same objects: nothing copied or
    renamed). Returns LAYERS, which the run fills as its units first run."""
    for name, block in model.named_modules():
        if type(block) is not Bottleneck:
            continue
        convs, norms = (block.conv2, block.conv3), (block.bn1, block.bn2)
        if any(type(n) is not torch.nn.BatchNorm2d or not (n.affine and n.track_running_stats) or n.momentum is None
               for n in norms) or any(c.bias is not None or c.groups != 1 or c.dilation != (1, 1) for c in convs):
            raise ValueError("fused batch norm is written for torchvision's ResNet-50 bottlenecks")
        block.__class__ = FusedBottleneck
        block.fused_names = (f"{name}.conv2", f"{name}.conv3")
    return LAYERS
