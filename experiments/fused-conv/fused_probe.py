"""Batch norm fused into ResNet-50's convolutions with cuDNN's graph API, one layer at a time, against the same
layer as Inductor compiles it and against the bare convolution.

A bottleneck convolution whose input is the previous convolution's raw output x (before its batch norm) is one
unit: a = ReLU(BN(x)) = ReLU(x * S + B) with S = gamma / sqrt(var + eps), B = beta - mean * S; y = conv(a, W).

    fused forward   one cuDNN graph: scale + bias + ReLU -> convolution -> per-channel sum and sum of squares of y
                    (genstats: the next batch norm's statistics, so that no pass over y is needed for them)
    fused backward  the data gradient with ReLU's mask and the batch-norm backward (dgrad + drelu + dbn: dx,
                    dgamma, dbeta) in each of the splits of DGRAD_VARIANTS that cuDNN offers an engine for (the
                    fastest one counts), and the weight gradient with scale + bias + ReLU on its input (wgrad); the
                    patterns cuDNN refuses are recorded with its reason
    compiled        torch.compile of the unfused ops: BN (training) -> ReLU -> conv2d, forward, and its backward
                    (autograd.grad); "compiled same ops": scale + bias + ReLU -> conv2d -> sums, forward
    bare            F.conv2d, and aten.convolution_backward (dgrad + wgrad) on the activation

Every distinct convolution of ResNet-50's bottlenecks at 224 px (22 shapes, 52 convolutions), batch 256,
channels_last; each time is the median of --iterations single iterations between CUDA events, queued behind a GPU
sleep so that the host's launch time stays out, rotating over --rotate input sets after a warm-up. Every output of
the fused graphs (the statistics and all gradients too) is checked against PyTorch in float64 on fresh random
inputs: relative error ||out - ref|| / ||ref||, passing under 8 units of rounding of the precision.

    python experiments/fused-conv/fused_probe.py --precision fp16 --json FILE [--shapes 0,3,7] [--batch 256]
    python experiments/fused-conv/fused_probe.py --table FILE   # the README's tables of a probe's JSON
    python experiments/fused-conv/fused_probe.py --check   # CPU: the shapes and the unit's algebra, no cuDNN

Needs the package nvidia-cudnn-frontend (import cudnn) and a CUDA GPU; --check needs neither.
"""
import argparse
import functools
import itertools
import pathlib
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import probe_common as common  # noqa: E402

EPS = 1e-5
# (in channels, out channels, kernel, stride, input size, how many of ResNet-50's bottleneck convolutions)
SHAPES = [(64, 64, 1, 1, 56, 1), (64, 64, 3, 1, 56, 3), (64, 256, 1, 1, 56, 4), (256, 64, 1, 1, 56, 2),
          (256, 128, 1, 1, 56, 1), (128, 128, 3, 2, 56, 1), (128, 512, 1, 1, 28, 4), (256, 512, 1, 2, 56, 1),
          (512, 128, 1, 1, 28, 3), (128, 128, 3, 1, 28, 3), (512, 256, 1, 1, 28, 1), (256, 256, 3, 2, 28, 1),
          (256, 1024, 1, 1, 14, 6), (512, 1024, 1, 2, 28, 1), (1024, 256, 1, 1, 14, 5), (256, 256, 3, 1, 14, 5),
          (1024, 512, 1, 1, 14, 1), (512, 512, 3, 2, 14, 1), (512, 2048, 1, 1, 7, 3), (1024, 2048, 1, 2, 14, 1),
          (2048, 512, 1, 1, 7, 2), (512, 512, 3, 1, 7, 2)]
# of those, the convolutions whose input is BN + ReLU of a convolution's output (each block's 3x3 and last 1x1), by
# shape index: they can take the fused prologue; a block's first 1x1 and the downsampling ones read ReLU(BN(y) +
# shortcut), which is written anyway as the next block's shortcut
PROLOGUE = {1: 3, 2: 3, 5: 1, 6: 4, 9: 3, 11: 1, 12: 6, 15: 5, 17: 1, 18: 3, 21: 2}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
UNIT_ROUNDING = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
SLEEP_CYCLES = 150_000_000  # ~75 ms at 2 GHz: the host queues the timed iterations behind it


def out_size(shape):
    cin, cout, k, stride, size, _ = shape
    return (size + 2 * (k // 2) - k) // stride + 1


def two_numbers(shape, batch, element=2):
    """FLOPs of the three convolutions and the fewest bytes each way must move (each input read once, each output
    written once; a strided 1x1 convolution reads only the pixels it samples): fused forward reads x and W, writes y
    (the sums are 2 x C floats); fused backward reads dy twice (dgrad, wgrad), x for ReLU's mask and dbn, x again
    for wgrad, W, and writes dx and dW. Inductor's unfused forward, as this probe counts its passes, reads x twice
    (statistics, normalisation), writes a and the convolution reads it back, writes y; its backward reads dy twice
    and a (wgrad), writes da, reads da, x and a twice more (the reduction and the apply pass) and writes dx."""
    cin, cout, k, stride, size, _ = shape
    osize = out_size(shape)
    x, y, w = batch * cin * size * size * element, batch * cout * osize * osize * element, cout * cin * k * k * element
    sampled = x if k > 1 else batch * cin * osize * osize * element
    flops = 2 * batch * osize * osize * cout * cin * k * k
    return {"flops_fwd": flops, "flops_bwd": 2 * flops, "bytes_fused_fwd": sampled + w + y,
            "bytes_fused_bwd": 2 * y + x + sampled + w + x + w, "bytes_unfused_fwd": 2 * x + x + sampled + w + y,
            "bytes_unfused_bwd": 2 * y + sampled + w + x + w + 2 * (3 * x) + x}


# ---- the unit in PyTorch: what Inductor compiles, and the float64 reference -------------------------------------

def unit(x, weight, gamma, beta, stride, padding):
    """BN (training, batch statistics) -> ReLU -> convolution, as the model runs it."""
    return F.conv2d(F.relu(F.batch_norm(x, None, None, gamma, beta, training=True, eps=EPS)), weight, None,
                    stride, padding)


def same_ops(x, weight, scale, bias, stride, padding):
    """The fused forward graph's computation in PyTorch ops: y and its per-channel sum and sum of squares."""
    wide = torch.promote_types(x.dtype, torch.float32)
    y = F.conv2d(torch.relu(x.to(wide) * scale + bias).to(x.dtype), weight, None, stride, padding)
    yf = y.to(wide)
    return y, yf.sum((0, 2, 3)), (yf * yf).sum((0, 2, 3))


def folded(x, gamma, beta):
    """Batch statistics of x in float32 at least (as the previous convolution's sums give them), and BN as scale +
    bias."""
    wide = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(wide)
    mean, var = xf.mean((0, 2, 3)), xf.var((0, 2, 3), unbiased=False)
    invstd = torch.rsqrt(var + EPS)
    scale = gamma.to(wide) * invstd
    return mean, invstd, scale, beta.to(wide) - mean * scale


def decomposed_backward(x, weight, gamma, mean, invstd, scale, bias, dy, stride, padding):
    """The unit's backward as the fused graphs compute it: dgrad, ReLU's mask recomputed from x * S + B, the batch
    norm's backward from the saved mean and inverse deviation; wgrad on ReLU(x * S + B). Returns dx, dgamma, dbeta,
    dW."""
    shape4 = lambda v: v.reshape(1, -1, 1, 1)  # noqa: E731
    pre = x * shape4(scale) + shape4(bias)
    da = torch.nn.grad.conv2d_input(x.shape, weight, dy, stride, padding)
    dr = da * (pre > 0)
    xhat = (x - shape4(mean)) * shape4(invstd)
    dbeta, dgamma = dr.sum((0, 2, 3)), (dr * xhat).sum((0, 2, 3))
    count = x.numel() / x.shape[1]
    dx = shape4(gamma * invstd) * (dr - shape4(dbeta / count) - xhat * shape4(dgamma / count))
    dw = torch.nn.grad.conv2d_weight(torch.relu(pre), weight.shape, dy, stride, padding)
    return dx, dgamma, dbeta, dw


def relative_error(got, want):
    want = want.double()
    error = ((got.double().reshape(want.shape) - want).norm() / want.norm()).item()
    return error if error == error and error != float("inf") else float("inf")


def check():
    """On the CPU, in float64, without cuDNN: the shape table is ResNet-50's bottleneck convolutions (torchvision's
    model, traced on the meta device), and the fused graphs' decomposition of the unit's backward (BN folded into
    scale + bias, ReLU's mask recomputed from x * S + B, BN's backward from the saved statistics, wgrad on the
    recomputed activation) is autograd's, for a 1x1, a 3x3 and a strided shape."""
    import torchvision
    seen, prologue = {}, {}

    def record(name, module, inputs, output):
        x = inputs[0]
        key = (module.in_channels, module.out_channels, module.kernel_size[0], module.stride[0], x.shape[-1])
        seen[key] = seen.get(key, 0) + 1
        if name.endswith(("conv2", "conv3")):  # their input is BN + ReLU of the convolution before
            prologue[key] = prologue.get(key, 0) + 1

    model = torchvision.models.resnet50().to("meta")
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Conv2d) and name != "conv1":
            module.register_forward_hook(functools.partial(record, name))
    with torch.no_grad():
        model(torch.empty(1, 3, 224, 224, device="meta"))
    table = {shape[:5]: shape[5] for shape in SHAPES}
    if seen != table or prologue != {SHAPES[index][:5]: count for index, count in PROLOGUE.items()}:
        differ = sorted(set(seen.items()) ^ set(table.items()))
        raise SystemExit(f"check failed: the shape table is not ResNet-50's: {differ or 'PROLOGUE'}")
    torch.manual_seed(0)
    worst = 0.0
    for cin, cout, k, stride, size in ((6, 8, 1, 1, 5), (6, 4, 3, 1, 5), (6, 8, 3, 2, 7)):
        x = (torch.randn(3, cin, size, size, dtype=torch.float64) * 2 + 0.5).requires_grad_(True)
        weight = (torch.randn(cout, cin, k, k, dtype=torch.float64) / (cin * k * k) ** 0.5).requires_grad_(True)
        gamma = torch.empty(cin, dtype=torch.float64).uniform_(0.5, 1.5).requires_grad_(True)
        beta = torch.empty(cin, dtype=torch.float64).uniform_(-0.5, 0.5).requires_grad_(True)
        y = unit(x, weight, gamma, beta, stride, k // 2)
        dy = torch.randn_like(y)
        want = torch.autograd.grad(y, (x, gamma, beta, weight), dy)
        with torch.no_grad():
            mean, invstd, scale, bias = folded(x, gamma, beta)
            got_y, total, squares = same_ops(x, weight, scale.reshape(1, -1, 1, 1), bias.reshape(1, -1, 1, 1),
                                             stride, k // 2)
            got = decomposed_backward(x, weight, gamma, mean, invstd, scale, bias, dy, stride, k // 2)
            # dgrad_drelu_sums: dr and its two sums from the graph, the rest from apply_dbn
            c4 = lambda v: v.reshape(1, -1, 1, 1)  # noqa: E731
            dr = torch.nn.grad.conv2d_input(x.shape, weight, dy, stride, k // 2) * (x * c4(scale) + c4(bias) > 0)
            dx, dgamma = apply_dbn(dr, x, c4(dr.sum((0, 2, 3))), c4((dr * x).sum((0, 2, 3))), c4(gamma), c4(mean),
                                   c4(invstd))
        pairs = [(got_y, y), (total, y.sum((0, 2, 3))), (squares, (y * y).sum((0, 2, 3))), *zip(got, want),
                 (dx, want[0]), (dgamma, want[1])]
        worst = max(worst, *(relative_error(a, b) for a, b in pairs))
    if worst > 1e-12:
        raise SystemExit(f"check failed: the decomposed unit differs from autograd's by {worst:.1e}")
    print(f"check: 22 shapes = ResNet-50's {sum(table.values())} bottleneck convolutions; the folded forward and "
          f"the decomposed backward are autograd's to {worst:.1e} (float64)")


# ---- cuDNN graphs --------------------------------------------------------------------------------------------------

def channels_last_stride(dim):
    n, c, h, w = dim
    return [c * h * w, 1, w * c, c]


class Graphs:
    """Builds the fused graphs of one shape and precision; a pattern cuDNN refuses is recorded, not raised."""

    def __init__(self, cudnn, handle, io, batch, shape):
        self.cudnn, self.handle, self.io, self.shape = cudnn, handle, io, shape
        cin, cout, k, stride, size, _ = shape
        osize = out_size(shape)
        self.xdim, self.ydim, self.wdim = [batch, cin, size, size], [batch, cout, osize, osize], [cout, cin, k, k]
        self.conv = dict(padding=[k // 2] * 2, stride=[stride] * 2, dilation=[1, 1])

    def new(self):
        FLOAT = self.cudnn.data_type.FLOAT
        return self.cudnn.pygraph(io_data_type=self.io, intermediate_data_type=FLOAT, compute_data_type=FLOAT,
                                  handle=self.handle)

    def tensor(self, graph, name, dim, dtype):
        return graph.tensor(name=name, dim=dim, stride=channels_last_stride(dim), data_type=dtype)

    def channel(self, graph, name, channels, dtype):
        return self.tensor(graph, name, [1, channels, 1, 1], dtype)

    def output(self, tensor, dim, dtype):
        tensor.set_output(True).set_data_type(dtype).set_dim(dim).set_stride(channels_last_stride(dim))

    def activation(self, graph, t, sb):
        """ReLU(x * S + B) inside the graph."""
        cin = self.xdim[1]
        t["s"], t["b"] = self.channel(graph, "s", cin, sb), self.channel(graph, "b", cin, sb)
        scaled = graph.scale(name="scale", input=t["x"], scale=t["s"])
        return graph.bias(name="bias", input=scaled, bias=t["b"])

    def forward(self, sb):
        graph, t, FLOAT = self.new(), {}, self.cudnn.data_type.FLOAT
        t["x"], t["w"] = self.tensor(graph, "x", self.xdim, self.io), self.tensor(graph, "w", self.wdim, self.io)
        a = graph.relu(name="relu", input=self.activation(graph, t, sb))
        t["y"] = graph.conv_fprop(name="conv", image=a, weight=t["w"], **self.conv)
        self.output(t["y"], self.ydim, self.io)
        t["sum"], t["sqsum"] = graph.genstats(name="genstats", input=t["y"])
        for name in ("sum", "sqsum"):
            self.output(t[name], [1, self.ydim[1], 1, 1], FLOAT)
        return [(graph, t)]

    def dgrad_part(self, graph, t, sb, drelu):
        """dgrad of dy through W, then (drelu) ReLU's backward with the mask recomputed from x * S + B."""
        FLOAT = self.cudnn.data_type.FLOAT
        t["dy"], t["w"] = self.tensor(graph, "dy", self.ydim, self.io), self.tensor(graph, "w", self.wdim, self.io)
        da = graph.conv_dgrad(name="dgrad", loss=t["dy"], filter=t["w"], **self.conv)
        da.set_dim(self.xdim).set_stride(channels_last_stride(self.xdim)).set_data_type(FLOAT)
        if not drelu:
            return da
        t["x"] = self.tensor(graph, "x", self.xdim, self.io)
        return graph.relu_backward(name="drelu", loss=da, input=self.activation(graph, t, sb))

    def dbn_part(self, graph, t, grad):
        FLOAT, cin = self.cudnn.data_type.FLOAT, self.xdim[1]
        if "x" not in t:
            t["x"] = self.tensor(graph, "x", self.xdim, self.io)
        for name in ("gamma", "mean", "invstd"):
            t[name] = self.channel(graph, name, cin, FLOAT)
        t["dx"], t["dgamma"], t["dbeta"] = graph.batchnorm_backward(
            name="dbn", grad=grad, input=t["x"], scale=t["gamma"], mean=t["mean"], inv_variance=t["invstd"])
        self.output(t["dx"], self.xdim, self.io)
        for name in ("dgamma", "dbeta"):
            self.output(t[name], [1, cin, 1, 1], FLOAT)

    def dgrad_drelu_dbn(self, sb):
        """One graph: dgrad -> drelu -> dbn."""
        graph, t = self.new(), {}
        self.dbn_part(graph, t, self.dgrad_part(graph, t, sb, drelu=True))
        return [(graph, t)]

    def dgrad_drelu__dbn(self, sb):
        """Two graphs: dgrad -> drelu (writes dr), then dbn reading dr."""
        first, t1 = self.new(), {}
        dr = self.dgrad_part(first, t1, sb, drelu=True)
        t1["dr"] = dr
        self.output(dr, self.xdim, self.io)
        second, t2 = self.new(), {}
        t2["dr"] = self.tensor(second, "dr", self.xdim, self.io)
        self.dbn_part(second, t2, t2["dr"])
        return [(first, t1), (second, t2)]

    def dgrad__drelu_dbn(self, sb):
        """Two graphs: dgrad (writes da), then drelu -> dbn reading da."""
        first, t1 = self.new(), {}
        t1["da"] = self.dgrad_part(first, t1, sb, drelu=False)
        self.output(t1["da"], self.xdim, self.io)
        second, t2 = self.new(), {}
        t2["da"], t2["x"] = self.tensor(second, "da", self.xdim, self.io), self.tensor(second, "x", self.xdim, self.io)
        dr = second.relu_backward(name="drelu", loss=t2["da"], input=self.activation(second, t2, sb))
        self.dbn_part(second, t2, dr)
        return [(first, t1), (second, t2)]

    def dgrad_drelu_sums(self, sb):
        """One graph: dgrad -> drelu (writes dr) with the batch-norm backward's two sums in its epilogue, sum(dr)
        = dbeta and sum(dr * x); the elementwise rest of dbn (dx from dr, x and the sums) is left to apply_dbn."""
        graph, t, FLOAT = self.new(), {}, self.cudnn.data_type.FLOAT
        add, cin = self.cudnn.reduction_mode.ADD, self.xdim[1]
        t["dr"] = self.dgrad_part(graph, t, sb, drelu=True)
        self.output(t["dr"], self.xdim, self.io)
        t["dbeta"] = graph.reduction(name="sum_dr", input=t["dr"], mode=add)
        t["drx"] = graph.reduction(name="sum_drx", input=graph.mul(name="drx", a=t["dr"], b=t["x"]), mode=add)
        for name in ("dbeta", "drx"):
            self.output(t[name], [1, cin, 1, 1], FLOAT)
        return [(graph, t)]

    def wgrad(self, sb):
        graph, t = self.new(), {}
        t["x"], t["dy"] = self.tensor(graph, "x", self.xdim, self.io), self.tensor(graph, "dy", self.ydim, self.io)
        a = graph.relu(name="relu", input=self.activation(graph, t, sb))
        t["dw"] = graph.conv_wgrad(name="wgrad", image=a, loss=t["dy"], **self.conv)
        self.output(t["dw"], self.wdim, self.io)
        return [(graph, t)]


def first_line(error):
    """An exception as one line of at most 400 characters (cuDNN's refusals name the engine's reason late)."""
    return f"{type(error).__name__}: {' '.join(str(error).split())}"[:400]


def plan_name(graph):
    try:
        return str(graph.get_plan_name_at_index(graph._plan_index))
    except Exception as error:  # the name is a record, not a need
        return first_line(error)


def built(cudnn, make, sb_types):
    """The first scale/bias precision for which cuDNN builds every graph of `make`: (graphs, record)."""
    refusals = []
    for sb in sb_types:
        try:
            graphs = make(sb)
            plans = []
            for graph, _ in graphs:
                graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
                plans.append(plan_name(graph))
        except Exception as error:  # cuDNN says why it refuses in its exception; keep the first line
            refusals.append(f"scale/bias {sb.name}: {first_line(error)}")
            continue
        return graphs, {"fused": True, "graphs": len(graphs), "scale_bias": sb.name, "plans": plans,
                        "refused_first": refusals}
    return None, {"fused": False, "refused": refusals}


def apply_dbn(dr, x, dbeta, drx, gamma, mean, invstd):
    """The batch-norm backward's elementwise part from the sums of dgrad_drelu_sums' epilogue: dx and dgamma."""
    count = x.numel() / x.shape[1]
    dgamma = invstd * (drx - mean * dbeta)
    wide = torch.promote_types(x.dtype, torch.float32)
    xhat = (x.to(wide) - mean) * invstd
    dx = gamma * invstd * (dr.to(wide) - dbeta / count - xhat * (dgamma / count))
    return dx.to(x.dtype), dgamma


def runner(cudnn, handle, graphs, bindings, after=None):
    """A call that executes `graphs` (each with its workspace) on `bindings` (name -> tensor), then `after` on the
    bindings (its result is the call's)."""
    steps = []
    for graph, t in graphs:
        workspace = torch.empty(max(1, graph.get_workspace_size()), dtype=torch.uint8, device="cuda")
        pack = {tensor: bindings[name] for name, tensor in t.items() if name in bindings}
        steps.append((graph, pack, workspace))

    def run():
        for graph, pack, workspace in steps:
            graph.execute(pack, workspace, handle=handle)
        if after is not None:
            b = bindings
            return after(b["dr"], b["x"], b["dbeta"], b["drx"], b["gamma"], b["mean"], b["invstd"])
        return None
    return run


# ---- timing ----------------------------------------------------------------------------------------------------

def gpu_times(calls, iterations, warmup):
    """Median and spread of single iterations (CUDA events), cycling over `calls` (one per input set), after a
    warm-up, queued behind a GPU sleep so that the events time the GPU and not the host's launches."""
    for call in itertools.islice(itertools.cycle(calls), warmup):
        call()
    torch.cuda.synchronize()
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(iterations + 1)]
    torch.cuda._sleep(SLEEP_CYCLES)
    marks[0].record()
    for index, call in zip(range(iterations), itertools.cycle(calls)):
        call()
        marks[index + 1].record()
    torch.cuda.synchronize()
    stats = common.summarize([a.elapsed_time(b) for a, b in zip(marks, marks[1:])])
    return {"median_ms": stats["median"], "mad_ms": stats["mad"], "min_ms": stats["min"]}


def ceilings():
    """Measured device ceilings: a 1 GiB device-to-device copy (bytes read + written) and an 8192^3 fp16 product."""
    source = torch.empty(1 << 29, dtype=torch.float16, device="cuda").normal_()
    target = torch.empty_like(source)
    copy = gpu_times([lambda: target.copy_(source)], 20, 3)["median_ms"]
    a = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    b = torch.randn_like(a)
    product = gpu_times([lambda: a @ b], 20, 3)["median_ms"]
    del source, target, a, b
    return {"copy_GBps": 2 * (1 << 30) / copy / 1e6, "matmul_fp16_TFLOPs": 2 * 8192 ** 3 / product / 1e9}


# ---- one shape ---------------------------------------------------------------------------------------------------

def inputs(shape, batch, dtype, seed):
    """x (the previous convolution's raw output: random, not zero-mean), W, gamma, beta, dy, channels_last."""
    cin, cout, k, stride, size, _ = shape
    generator = torch.Generator(device="cuda").manual_seed(seed)
    draw = lambda *size: torch.randn(*size, device="cuda", generator=generator)  # noqa: E731
    cl = lambda v: v.to(dtype).contiguous(memory_format=torch.channels_last)  # noqa: E731
    osize = out_size(shape)
    x = cl(draw(batch, cin, size, size) * 2 + 0.5)
    weight = cl(draw(cout, cin, k, k) / (cin * k * k) ** 0.5 + 0.01)
    gamma = torch.rand(cin, device="cuda", generator=generator) + 0.5
    beta = torch.rand(cin, device="cuda", generator=generator) - 0.5
    return x, weight, gamma, beta, cl(draw(batch, cout, osize, osize))


def bindings_of(x, weight, gamma, beta, dy, sb_dtype):
    mean, invstd, scale, bias = folded(x, gamma, beta)
    c = lambda v, dtype=torch.float32: v.to(dtype).reshape(1, -1, 1, 1).contiguous(  # noqa: E731
        memory_format=torch.channels_last)
    cout, osize = dy.shape[1], dy.shape[-1]
    empty = lambda *size, dtype=x.dtype: torch.full(size, float("nan"), dtype=dtype, device="cuda").contiguous(  # noqa
        memory_format=torch.channels_last)
    return {"x": x, "w": weight, "dy": dy, "s": c(scale, sb_dtype), "b": c(bias, sb_dtype), "gamma": c(gamma),
            "mean": c(mean), "invstd": c(invstd), "y": empty(dy.shape[0], cout, osize, osize),
            "sum": empty(1, cout, 1, 1, dtype=torch.float32), "sqsum": empty(1, cout, 1, 1, dtype=torch.float32),
            "dr": empty(*x.shape), "da": empty(*x.shape), "dx": empty(*x.shape),
            "drx": empty(1, x.shape[1], 1, 1, dtype=torch.float32),
            "dgamma": empty(1, x.shape[1], 1, 1, dtype=torch.float32),
            "dbeta": empty(1, x.shape[1], 1, 1, dtype=torch.float32), "dw": empty(*weight.shape)}


DGRAD_VARIANTS = ("dgrad_drelu_dbn", "dgrad_drelu__dbn", "dgrad__drelu_dbn", "dgrad_drelu_sums")


def probe_shape(cudnn, handle, shape, batch, precision, args):
    dtype, io = DTYPES[precision], {"fp16": cudnn.data_type.HALF, "bf16": cudnn.data_type.BFLOAT16}[precision]
    cin, cout, k, stride, size, count = shape
    padding = k // 2
    graphs = Graphs(cudnn, handle, io, batch, shape)
    result = {"shape": {"in": cin, "out": cout, "kernel": k, "stride": stride, "size": size, "count": count},
              **two_numbers(shape, batch), "patterns": {}, "times": {}, "check": {}}
    fused = {}  # pattern -> (graphs, after)
    for pattern in ("forward", *DGRAD_VARIANTS, "wgrad"):
        made, result["patterns"][pattern] = built(cudnn, getattr(graphs, pattern), [cudnn.data_type.FLOAT, io])
        if made is not None:
            after = torch.compile(apply_dbn, dynamic=False) if pattern == "dgrad_drelu_sums" else None
            fused[pattern] = (made, after)
    if not fused and precision != "fp16":
        return result  # nothing fused in this precision: no baselines to compare against
    sb_of = lambda pattern: dtype if result["patterns"][pattern]["scale_bias"] != "FLOAT" else torch.float32  # noqa
    call = lambda pattern, s: runner(cudnn, handle, fused[pattern][0], bindings_of(*s, sb_of(pattern)),  # noqa
                                     fused[pattern][1])

    # numerics: fresh inputs, every output of every fused graph against float64
    tolerance = 8 * UNIT_ROUNDING[precision]
    check_set = inputs(shape, batch, dtype, seed=1000 + 7 * SHAPES.index(shape))
    x, weight, gamma, beta, dy = check_set
    x64, w64 = x.double().requires_grad_(True), weight.double().requires_grad_(True)
    g64, b64 = gamma.double().requires_grad_(True), beta.double().requires_grad_(True)
    y64 = unit(x64, w64, g64, b64, stride, padding)
    grads64 = dict(zip(("dx", "dw", "dgamma", "dbeta"), torch.autograd.grad(y64, (x64, w64, g64, b64), dy.double())))
    del y64, x64, w64

    def judge(pattern, name, got, want):
        error = relative_error(got.reshape(want.shape), want)
        result["check"][f"{pattern}.{name}"] = {"relative_error": error, "pass": error <= tolerance}

    for pattern, (made, after) in fused.items():
        bound = bindings_of(*check_set, sb_of(pattern))
        out = runner(cudnn, handle, made, bound, after)()
        torch.cuda.synchronize()
        if out is not None:
            bound["dx"], bound["dgamma"] = out
        if pattern == "forward":
            with torch.no_grad():
                s64, b64 = bound["s"].double(), bound["b"].double()
                want_y = F.conv2d(torch.relu(x.double() * s64 + b64), weight.double(), None, stride, padding)
            judge(pattern, "y", bound["y"], want_y)
            judge(pattern, "sum", bound["sum"], want_y.sum((0, 2, 3)))
            judge(pattern, "sqsum", bound["sqsum"], (want_y * want_y).sum((0, 2, 3)))
            del want_y
        for name in ("dx", "dgamma", "dbeta") if pattern in DGRAD_VARIANTS else ("dw",) if pattern == "wgrad" else ():
            judge(pattern, name, bound[name], grads64[name])
        del bound
    del grads64
    result["check_tolerance"] = tolerance

    # timing: --rotate input sets
    sets = [inputs(shape, batch, dtype, seed=s) for s in range(args.rotate)]
    times = result["times"]
    for pattern in fused:
        times[pattern] = gpu_times([call(pattern, s) for s in sets], args.iterations, args.warmup)
    if "forward" in fused:
        times["fused_fwd"] = times["forward"]
    dgrads = [p for p in DGRAD_VARIANTS if p in fused]
    if dgrads and "wgrad" in fused:
        best = min(dgrads, key=lambda p: times[p]["median_ms"])  # the fastest way cuDNN offers, per shape
        both = [(call(best, s), call("wgrad", s)) for s in sets]
        times["fused_bwd"] = gpu_times([lambda pair=pair: (pair[0](), pair[1]()) for pair in both],
                                       args.iterations, args.warmup)
        times["fused_bwd"]["dgrad"] = best

    compiled_unit = torch.compile(functools.partial(unit, stride=stride, padding=padding), dynamic=False)
    compiled_same = torch.compile(functools.partial(same_ops, stride=stride, padding=padding), dynamic=False)
    leaves = [(x.requires_grad_(True), weight.requires_grad_(True), gamma.requires_grad_(True),
               beta.requires_grad_(True), dy) for x, weight, gamma, beta, dy in sets]
    times["compiled_fwd"] = gpu_times([lambda s=s: compiled_unit(*s[:4]) for s in leaves], args.iterations,
                                      args.warmup)
    outputs = [compiled_unit(*s[:4]) for s in leaves]
    try:
        times["compiled_bwd"] = gpu_times([lambda s=s, y=y: torch.autograd.grad(y, s[:4], s[4], retain_graph=True)
                                           for s, y in zip(leaves, outputs)], args.iterations, args.warmup)
        times["compiled_bwd"]["how"] = "autograd.grad with retain_graph"
    except Exception as error:  # a backward that cannot run twice: forward + backward, less the forward
        both = gpu_times([lambda s=s: torch.autograd.grad(compiled_unit(*s[:4]), s[:4], s[4]) for s in leaves],
                         args.iterations, args.warmup)
        times["compiled_bwd"] = {"median_ms": both["median_ms"] - times["compiled_fwd"]["median_ms"],
                                 "how": f"forward+backward less forward ({first_line(error)})"}
    del outputs
    with torch.no_grad():
        folded_sets = [(s[0].detach(), s[1].detach(), *[v.reshape(1, -1, 1, 1) for v in folded(s[0], s[2], s[3])[2:]])
                       for s in leaves]
        times["compiled_same_fwd"] = gpu_times([lambda s=s: compiled_same(*s) for s in folded_sets],
                                               args.iterations, args.warmup)
        times["bare_fwd"] = gpu_times([lambda s=s: F.conv2d(s[0], s[1], None, stride, padding) for s in leaves],
                                      args.iterations, args.warmup)
        activations = [torch.relu(s[0] * s[2] + s[3]).to(dtype).contiguous(memory_format=torch.channels_last)
                       for s in folded_sets]
        times["bare_bwd"] = gpu_times([lambda s=s, a=a: torch.ops.aten.convolution_backward(
            s[4], a, s[1], None, [stride] * 2, [padding] * 2, [1, 1], False, [0, 0], 1, [True, True, False])
            for s, a in zip(leaves, activations)], args.iterations, args.warmup)
        # the compiled baseline's own error on the same check inputs, for scale
        x, weight = check_set[0].detach(), check_set[1].detach()
        _, _, scale, bias = [v.reshape(1, -1, 1, 1) for v in folded(x, check_set[2].detach(), check_set[3].detach())]
        want = F.conv2d(torch.relu(x.double() * scale.double() + bias.double()), weight.double(), None, stride,
                        padding)
        result["compiled_check"] = {"y": relative_error(compiled_same(x, weight, scale, bias)[0], want)}
    return result


def totals(shapes):
    """Each time summed over ResNet-50's 52 bottleneck convolutions (a shape counts as often as the model has it),
    over the shapes that have it."""
    out = {}
    for key in ("fused_fwd", "compiled_fwd", "compiled_same_fwd", "bare_fwd", "fused_bwd", "compiled_bwd",
                "bare_bwd", *DGRAD_VARIANTS, "wgrad"):
        have = [s for s in shapes if key in s["times"]]
        out[key] = {"ms": sum(s["shape"]["count"] * s["times"][key]["median_ms"] for s in have),
                    "shapes": len(have)}
    return out


def table(path):
    """The README's table from a probe's JSON: per shape, the floor of the two numbers at the measured ceilings,
    the medians (ms) forward and backward, the way the fastest fused dgrad ran, the float64 check; then the totals
    over the 52 convolutions."""
    import json
    result = json.loads(pathlib.Path(path).read_text())
    bandwidth, rate = result["ceilings"]["copy_GBps"] * 1e6, result["ceilings"]["matmul_fp16_TFLOPs"] * 1e9
    ms = lambda one, key: f"{one['times'][key]['median_ms']:.3f}" if key in one["times"] else "refused"  # noqa
    print(f"{result['gpu']}, {result['precision']}, batch {result['batch']}, torch {result['torch']}, cuDNN "
          f"{result['cudnn_backend']}, frontend {result['cudnn_frontend']}; ceilings: copy "
          f"{result['ceilings']['copy_GBps']:.0f} GB/s, fp16 product {result['ceilings']['matmul_fp16_TFLOPs']:.0f} "
          f"TFLOP/s\n")
    print("| shape (in→out, kernel/stride @ size) ×count | GFLOP fwd, fused MB fwd / bwd | floor fwd / bwd "
          "| fwd fused | compiled | same ops | bare "
          "| bwd fused | of it: dgrad+drelu, dbn | wgrad | compiled | bare | float64 check (worst) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    floors, sums = [0.0, 0.0], dict.fromkeys(("flops_fwd", "bytes_fused_fwd", "bytes_fused_bwd", "bytes_unfused_fwd",
                                                "bytes_unfused_bwd"), 0)
    for one in result["shapes"]:
        shape, numbers = one["shape"], two_numbers(SHAPES[one["index"]], result["batch"])
        floor = [max(numbers[f"flops_{way}"] / rate, numbers[f"bytes_fused_{way}"] / bandwidth)
                 for way in ("fwd", "bwd")]
        floors = [total + shape["count"] * part for total, part in zip(floors, floor)]
        for key in sums:
            sums[key] += shape["count"] * numbers[key]
        worst = max((value["relative_error"] for value in one["check"].values()), default=float("nan"))
        passed = all(value["pass"] for value in one["check"].values()) and bool(one["check"])
        print(f"| {shape['in']}→{shape['out']}, {shape['kernel']}×{shape['kernel']}/{shape['stride']} @ "
              f"{shape['size']} ×{shape['count']} | {numbers['flops_fwd'] / 1e9:.1f}, "
              f"{numbers['bytes_fused_fwd'] / 1e6:.0f} / {numbers['bytes_fused_bwd'] / 1e6:.0f} | "
              f"{floor[0]:.3f} / {floor[1]:.3f} | {ms(one, 'fused_fwd')} | "
              f"{ms(one, 'compiled_fwd')} | {ms(one, 'compiled_same_fwd')} | {ms(one, 'bare_fwd')} | "
              f"{ms(one, 'fused_bwd')} | {ms(one, 'dgrad_drelu__dbn')} | {ms(one, 'wgrad')} | "
              f"{ms(one, 'compiled_bwd')} | {ms(one, 'bare_bwd')} | {'pass' if passed else 'FAIL'} ({worst:.1e}) |")
    t = {key: value["ms"] for key, value in result["totals"].items()}
    total = lambda key: f"{t[key]:.2f}" if result["totals"][key]["shapes"] == len(result["shapes"]) else "–"  # noqa
    print(f"| **52 convolutions** | {sums['flops_fwd'] / 1e9:.0f}, {sums['bytes_fused_fwd'] / 1e6:.0f} / "
          f"{sums['bytes_fused_bwd'] / 1e6:.0f} | {floors[0]:.2f} / {floors[1]:.2f} | **{total('fused_fwd')}** | "
          f"{total('compiled_fwd')} | {total('compiled_same_fwd')} | {total('bare_fwd')} | **{total('fused_bwd')}** | "
          f"{total('dgrad_drelu__dbn')} | {total('wgrad')} | {total('compiled_bwd')} | {total('bare_bwd')} | |")
    print(f"\n- the unfused passes, as two_numbers counts them, move {sums['bytes_unfused_fwd'] / 1e6:.0f} MB forward "
          f"and {sums['bytes_unfused_bwd'] / 1e6:.0f} MB backward")
    if all(key in one["times"] for one in result["shapes"] for key in ("fused_fwd", "fused_bwd")):
        saved = lambda counts, way: sum(counts.get(one["index"], 0) * (  # noqa: E731
            one["times"][f"compiled_{way}"]["median_ms"] - one["times"][f"fused_{way}"]["median_ms"])
            for one in result["shapes"])
        every = {one["index"]: one["shape"]["count"] for one in result["shapes"]}
        print(f"- fused forward + backward {t['fused_fwd'] + t['fused_bwd']:.2f} ms against compiled "
              f"{t['compiled_fwd'] + t['compiled_bwd']:.2f} ms: {saved(every, 'fwd') + saved(every, 'bwd'):.2f} ms "
              f"less over the 52; over the {sum(PROLOGUE.values())} that can take the prologue "
              f"{saved(PROLOGUE, 'fwd'):.2f} ms forward, {saved(PROLOGUE, 'bwd'):.2f} ms backward, "
              f"{saved(PROLOGUE, 'fwd') + saved(PROLOGUE, 'bwd'):.2f} ms in all")
    for pattern in DGRAD_VARIANTS[2:]:
        have = [one for one in result["shapes"] if pattern in one["times"] and "dgrad_drelu__dbn" in one["times"]]
        if have:
            weighted = lambda key: sum(one["shape"]["count"] * one["times"][key]["median_ms"] for one in have)  # noqa
            print(f"- {pattern} over the {len(have)} shapes it ran ({sum(one['shape']['count'] for one in have)} "
                  f"convolutions): {weighted(pattern):.2f} ms, dgrad_drelu__dbn over the same "
                  f"{weighted('dgrad_drelu__dbn'):.2f} ms")
    for pattern in ("forward", *DGRAD_VARIANTS, "wgrad"):
        records = [one["patterns"][pattern] for one in result["shapes"]]
        fused = [record for record in records if record["fused"]]
        kinds = sorted({record["scale_bias"] for record in fused})
        reasons = sorted({reason.split(":")[1].strip() + (" (kernel compilation)" if "compilation" in reason else "")
                          for record in records for reason in record.get("refused", [])})
        print(f"- {pattern}: fused for {len(fused)} of {len(records)} shapes"
              + (f" (scale and bias in {', '.join(kinds)})" if kinds else "")
              + (f"; refused: {'; '.join(reasons)}" if reasons else ""))


def parse_shapes(text):
    if text == "all":
        return list(range(len(SHAPES)))
    try:
        chosen = [int(part) for part in text.split(",")]
    except ValueError:
        chosen = [-1]
    if not chosen or any(not 0 <= index < len(SHAPES) for index in chosen):
        raise argparse.ArgumentTypeError(f"must be 'all' or shape indices 0-{len(SHAPES) - 1} joined by commas, "
                                         f"got {text}")
    return chosen


def main(argv=None):
    parser = common.OneLineArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=sorted(DTYPES), default="fp16")
    parser.add_argument("--shapes", type=parse_shapes, default="all")
    parser.add_argument("--batch", type=common.positive_int, default=256)
    parser.add_argument("--iterations", type=common.positive_int, default=50)
    parser.add_argument("--warmup", type=common.positive_int, default=5)
    parser.add_argument("--rotate", type=common.positive_int, default=3)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--table", metavar="JSON", help="print the README's table of a probe's JSON and stop")
    args = parser.parse_args(argv)
    if args.table:
        table(args.table)
        return 0
    if common.ran_cpu_check(args, check, "cuDNN's fused convolution graphs"):
        return 0
    try:
        import cudnn
    except ImportError as error:
        raise common.UsageError(f"needs the package nvidia-cudnn-frontend (import cudnn: {error})") from None
    for name in ("recompile_limit", "cache_size_limit"):  # a compile for each shape, not eager after 8
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    torch.backends.cudnn.benchmark = True
    handle = cudnn.create_handle()
    cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    result = {"precision": args.precision, "batch": args.batch, "iterations": args.iterations,
              "warmup": args.warmup, "rotate": args.rotate, "gpu": torch.cuda.get_device_name(),
              "torch": torch.__version__, "cuda": torch.version.cuda, "torch_cudnn": torch.backends.cudnn.version(),
              "cudnn_backend": cudnn.backend_version(), "cudnn_frontend": cudnn.__version__,
              "ceilings": ceilings(), "shapes": []}
    print(f"{result['gpu']}, torch {result['torch']}, cuDNN {result['cudnn_backend']}, frontend "
          f"{result['cudnn_frontend']}; copy {result['ceilings']['copy_GBps']:.0f} GB/s, fp16 product "
          f"{result['ceilings']['matmul_fp16_TFLOPs']:.0f} TFLOP/s", flush=True)
    for index in args.shapes:
        shape, started = SHAPES[index], time.perf_counter()
        with common.fits_in_memory(f"--batch {args.batch}"):
            one = probe_shape(cudnn, handle, shape, args.batch, args.precision, args)
        one["index"], one["seconds"] = index, time.perf_counter() - started
        result["shapes"].append(one)
        result["totals"] = totals(result["shapes"])
        if args.json:
            common.write_json(args.json, result)
        t = {key: value["median_ms"] for key, value in one["times"].items()}
        failed = [name for name, value in one["check"].items() if not value["pass"]]
        print(f"[{index:2d}] {shape[0]:4d}->{shape[1]:4d} {shape[2]}x{shape[2]}/{shape[3]} @{shape[4]:3d} x{shape[5]}: "
              + " ".join(f"{key} {value:.3f}" for key, value in t.items())
              + f" | best dgrad {one['times'].get('fused_bwd', {}).get('dgrad')} | check "
              + (f"FAIL {','.join(failed)}" if failed else f"ok ({len(one['check'])} outputs)")
              + f" {one['seconds']:.0f}s", flush=True)
        torch.cuda.empty_cache()
    print("totals over the 52 convolutions (ms):", {k: round(v["ms"], 3) for k, v in result["totals"].items()})
    return 0


if __name__ == "__main__":
    common.run_guarded(main)
