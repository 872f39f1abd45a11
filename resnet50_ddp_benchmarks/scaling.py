"""The scaling model: a data-parallel strategy's step at N GPUs from one-GPU runs, a link and the model's structure
(scaling_model.py is its command line, its validation and its documents).

    step(N) = one-GPU step (the compute of its timed steps + the per-step overhead its wall clock shows)
            + straggler (each step waits for the slowest of N ranks: GPUs gpu_spread apart, each step as uneven as
              the one-GPU runs' steps)
            + exposed communication (each collective timed as alpha + size * factor / B in nccl-tests' convention)
            + the kernels data parallelism adds (copies, casts) and the SMs NCCL takes from the backward
            + the optimizer's change (a shard of it; another implementation than the one-GPU run's)

Gradient bytes, buckets, shards and buffers come from torchvision's model built on the meta device; the backward
window and the time each gradient becomes ready from a roofline over the model's operators, scaled to the
measured one-GPU step.
"""
import functools
import itertools
import math
import statistics
from dataclasses import dataclass

from resnet50_ddp_benchmarks.analysis import REPOSITORY, UsageError, is_number, load_json, rank_devices

STRATEGIES = ("ddp", "oss_ddp", "oss_sharded_ddp", "zero1", "zero1_overlap", "fsdp_zero2", "fsdp_zero3")
# NCCL's fixed start-up latency of a Simple-protocol ring or tree (us): nccl src/graph/tuning.cc, baseLat, as
# reproduced in PyTorch's torch/_inductor/comm_analysis.py. A link's latency at its reference size is split into
# this base and a per-step (hop) part, which grows with the ring's steps.
NCCL_BASE_US = 8.4
# NCCL channels (one SM each) on Hopper with NVLink: comm_analysis.py's _GPU_NCHANNELS heuristic.
NCCL_CHANNELS = 16


@dataclass(frozen=True)
class LinkPreset:
    bus_gbps: float
    hop_us: float
    source: str


# Bus bandwidth (nccl-tests' busbw, GB/s) and NCCL's Simple-protocol per-step latency (us, nccl tuning.cc hwLat,
# as in comm_analysis.py: NVLink ring 3.4, PCI 5.7, NET 14.0) of each link.
LINK_PRESETS = {
    "nvlink4": LinkPreset(370.0, 3.4, "NVLink 4 (H100/H200 SXM): 370 GB/s, the Hopper NVLink bus bandwidth of NCCL's "
                                      "topology model (nccl src/graph/topo.h, PyTorch comm_analysis.py); nccl-tests "
                                      "all_reduce_perf on 8 x H100 reports about 370 GB/s (ring), 475 on 8 x H200"),
    "ib-ndr400": LinkPreset(47.0, 14.0, "InfiniBand NDR 400 Gb/s: 46-48 GB/s per NIC in nccl-tests and ib_write_bw "
                                        "(line rate 50 GB/s)"),
    "pcie4": LinkPreset(24.0, 5.7, "PCIe 4.0 x16 with peer-to-peer: 24 GB/s, NCCL's PCI bandwidth for Gen4 x16 "
                                   "(nccl src/graph/topo.h; comm_analysis.py's _PCIE_INTRA_NODE_BW)"),
    "pcie5": LinkPreset(28.0, 5.7, "PCIe 5.0 consumer GPUs with peer-to-peer: about 28 GB/s measured between two "
                                   "GPUs (p2pBandwidthLatencyTest and nccl-tests on two PCIe 5.0 cards)"),
    "eth100": LinkPreset(11.5, 14.0, "100 Gb/s Ethernet (RoCE): 12.5 GB/s line rate, about 92 % of it payload at a "
                                     "4 KiB MTU"),
}
# NVIDIA's datasheets (SXM parts) by GPU name: SMs, HBM GB/s (a copy or an optimizer moving B bytes costs B / this),
# dense tensor-core TFLOP/s in 16 bits and in 32 bits (TF32; CUDA cores on the V100). A result records its GPU's
# peak; a published row takes it from here.
GPUS = {"H200": (132, 4800.0, 989.0, 494.0), "H100": (132, 3350.0, 989.0, 494.0),
        "A100 SXM4 80GB": (108, 2039.0, 312.0, 156.0), "A100": (108, 1555.0, 312.0, 156.0),
        "V100": (80, 900.0, 125.0, 15.7)}
KERNEL_PROFILE = REPOSITORY / "experiments" / "step-profile" / "data" / "profile-1gpu-rank0.json"

# Bytes each optimizer implementation moves per parameter byte and step (read and written), counted from
# PyTorch's kernels: fused SGD with momentum reads p, g, buf and writes p, buf; foreach runs mul_, add_, add_.
OPTIMIZER_BYTES = {("sgd", "fused"): 5, ("sgd", "foreach"): 8, ("adam", "fused"): 7, ("adam", "foreach"): 18,
                   ("adamw", "fused"): 7, ("adamw", "foreach"): 20, ("rmsprop", "foreach"): 18,
                   ("rmsprop", "fused"): 18}
# oss_benchmark.py runs Adam and AdamW fused, SGD and RMSprop foreach, zero1_overlap always foreach.
SUITE_IMPL = {"sgd": "foreach", "rmsprop": "foreach", "adam": "fused", "adamw": "fused"}


# ------------------------------------------------------------------------------------------------------- links

BUS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}
# Steps of a ring (chain for broadcast and reduce) of n ranks: the latency grows with them.
RING_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1, "reduce_scatter": lambda n: n - 1,
              "broadcast": lambda n: n - 1, "reduce": lambda n: n - 1}
KINDS = tuple(BUS_FACTORS)


@dataclass(frozen=True)
class Link:
    """A link's bus bandwidth (GB/s) and latency (us) per collective kind at `ranks` ranks."""
    name: str
    source: str
    bandwidth: dict
    latency: dict
    ranks: int = 2

    def base_and_hop(self, kind):
        latency = self.latency[kind]
        base = min(NCCL_BASE_US, latency)
        return base, (latency - base) / max(1, RING_STEPS[kind](self.ranks))

    def time_us(self, kind, size, n):
        base, hop = self.base_and_hop(kind)
        return base + hop * RING_STEPS[kind](n) + size * BUS_FACTORS[kind](n) / (self.bandwidth[kind] * 1e3)


def make_link(name, source, bus_gbps, hop_us):
    """A link of one bus bandwidth for every collective and NCCL's latency: its base plus hop_us per ring step."""
    latency = {kind: NCCL_BASE_US + hop_us * RING_STEPS[kind](2) for kind in KINDS}
    return Link(name, source, {kind: bus_gbps for kind in KINDS}, latency)


def preset_link(name):
    preset = LINK_PRESETS[name]
    return make_link(name, preset.source, preset.bus_gbps, preset.hop_us)


def given_link(bandwidth, latency):
    """--bandwidth GB/s --latency us: the latency of a 2-rank all-reduce; the other kinds take its per-step part."""
    hop = max(0.0, latency - NCCL_BASE_US) / RING_STEPS["all_reduce"](2)
    base = min(NCCL_BASE_US, latency)
    return Link(f"{bandwidth:g} GB/s, {latency:g} us", "given on the command line",
                {kind: bandwidth for kind in KINDS}, {kind: base + hop * RING_STEPS[kind](2) for kind in KINDS})


def probe_fit(probe, kind, origin):
    """(bus bandwidth GB/s, latency us) of one of a probe's fits, or one line saying why it cannot be used."""
    try:
        fit = probe["collectives"][kind]["fit"]
        bandwidth, latency = fit["bus_bandwidth_gbps"], fit["latency_us"]
    except (KeyError, TypeError):
        raise UsageError(f"{origin}: the probe has no {kind} fit") from None
    if not (is_number(bandwidth) and bandwidth > 0 and is_number(latency) and latency >= 0):
        raise UsageError(f"{origin}: the probe's {kind} fit (bus bandwidth {bandwidth!r} GB/s, latency {latency!r} "
                         f"us) is not a positive bandwidth and a latency of 0 or more")
    return bandwidth, latency


def probe_link(probe, origin):
    """The fits of a collective probe (reduce takes broadcast's: the probe times no reduce)."""
    world = probe.get("world_size") if isinstance(probe, dict) else None
    if not isinstance(world, int) or world < 2:
        raise UsageError(f"{origin}: the probe ran on {world!r} ranks, so it measured no link (run it on 2 or more)")
    fits = {kind: probe_fit(probe, kind, origin) for kind in ("all_reduce", "all_gather", "reduce_scatter",
                                                               "broadcast")}
    fits["reduce"] = fits["broadcast"]
    return Link(f"probe ({probe.get('backend')}, {world} ranks)", f"collective_probe.py: {origin}",
                {kind: fit[0] for kind, fit in fits.items()}, {kind: fit[1] for kind, fit in fits.items()}, world)


@dataclass(frozen=True)
class Topology:
    """GPUs in nodes of `per_node` joined by `intra`; nodes joined by `inter` through `nics` NICs each. Across nodes
    the ring runs at the slower of the intra-node bus bandwidth and the node's NICs together (each of NCCL's rings
    leaves a node through its own NIC), with NCCL's ring latency (the inter-node steps at the inter-node hop) or,
    for all-reduce, broadcast and reduce, its tree (a chain inside each node, a binary tree between nodes),
    whichever is shorter."""
    intra: Link
    inter: Link
    per_node: int = 8
    nics: int = 8

    def collective_ms(self, kind, size, n):
        if n < 2 or size <= 0:
            return 0.0
        if n <= self.per_node:
            return self.intra.time_us(kind, size, n) / 1e3
        nodes = math.ceil(n / self.per_node)
        bandwidth = min(self.intra.bandwidth[kind], self.nics * self.inter.bandwidth[kind])
        intra_base, intra_hop = self.intra.base_and_hop(kind)
        _, inter_hop = self.inter.base_and_hop(kind)
        inter_steps = RING_STEPS[kind](nodes)
        latency = intra_base + intra_hop * (RING_STEPS[kind](n) - inter_steps) + inter_hop * inter_steps
        if kind in ("all_reduce", "broadcast", "reduce"):
            depth = (self.per_node - 1) * intra_hop + math.ceil(math.log2(nodes)) * inter_hop
            latency = min(latency, intra_base + depth * (2 if kind == "all_reduce" else 1))
        return (latency + size * BUS_FACTORS[kind](n) / (bandwidth * 1e3)) / 1e3

    def describe(self):
        text = f"{self.intra.name} ({self.intra.source})"
        return text + (f"; between nodes of {self.per_node} GPUs: {self.inter.name} x {self.nics} NICs per node "
                       f"({self.inter.source})")


# ------------------------------------------------------------------------------------------- device-local costs

@dataclass(frozen=True)
class LocalCosts:
    """What one more small kernel (us), a copy (bytes copied per us) and an optimizer's traffic (HBM) cost on the
    device, and the share of its SMs NCCL's kernels take while they run."""
    kernel_us: float
    copy_gbps: float
    memory_gbps: float
    sm_share: float
    source: str

    def copy_ms(self, size, kernels=1):
        return (kernels * self.kernel_us + size / (self.copy_gbps * 1e3)) / 1e3


def datasheet(gpu_name):
    """(SMs, HBM GB/s, 16-bit TFLOP/s, 32-bit TFLOP/s) of a GPU by its name, or None."""
    name = str(gpu_name or "").replace("-", " ")
    return next((figures for key, figures in GPUS.items() if key in name), None)


@functools.lru_cache(maxsize=8)
def kernel_profile_costs(path, memory_gbps, sm_share):
    """From a one-GPU kernel profile: the shortest kernel kind issued at least 50 times a step, plus the compute
    stream's idle time per kernel (the GPU-side gap between kernels when the host runs ahead)."""
    profile = load_json(path, "kernel profile")
    try:
        stream = profile["streams"][str(profile["compute_stream"])]
        kernels = [v["ms_per_step"] / v["count_per_step"] for v in profile["compute_kernels_by_name"].values()
                   if v["count_per_step"] >= 50]
        kernel_us = (min(kernels) + profile["compute_idle_ms_per_step"] / stream["kernels_per_step"]) * 1e3
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError):
        raise UsageError(f"{path}: not a kernel profile of experiments/step-profile/ (no kernel counts)") from None
    where = path.relative_to(REPOSITORY) if path.is_relative_to(REPOSITORY) else path
    source = (f"{where}: {kernel_us:.2f} us per added kernel; HBM {memory_gbps:g} GB/s (datasheet), a copy moving "
              "each byte twice")
    return LocalCosts(kernel_us, memory_gbps / 2, memory_gbps, sm_share, source)


def probe_costs(probe, origin, sm_share):
    bandwidth, latency = probe_fit(probe, "local_copy", origin)
    return LocalCosts(latency, bandwidth, 2 * bandwidth, sm_share,
                      f"collective_probe.py local copy: {latency:.2f} us per copy, {bandwidth:.1f} GB/s ({origin})")


# ---------------------------------------------------------------------------------------- the model's structure

@dataclass(frozen=True)
class ModelFacts:
    """What the strategies move and when, from the model built on the meta device."""
    param_numels: tuple          # model order
    buffer_bytes: tuple          # (bytes, dtype) per buffer
    ready_order: tuple           # parameter indices in the order their gradients become ready
    ready_fraction: tuple        # per parameter (model order): share of the backward done when its gradient is ready
    backward_share: float        # the backward's share of a step (roofline over the traced operators)

    @property
    def param_bytes(self):
        return 4 * sum(self.param_numels)


@functools.lru_cache(maxsize=8)
def traced_ops(model_name, image_size, batch, channels_last):
    """(flops, bytes, is_backward) per operator of one fp32 training step on the meta device, and the operator
    index after which each parameter's gradient is ready."""
    import torch
    import torchvision
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import flop_registry

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.backward = [], False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if not is_view(func) and not func.__name__.startswith("empty"):
                flops = flop_registry[func._overloadpacket](*args, **kwargs, out_val=out) \
                    if func._overloadpacket in flop_registry else 0
                tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
                self.ops.append((flops, sum(t.numel() * t.element_size() for t in tensors), self.backward))
            return out

    with torch.device("meta"):
        model = torchvision.models.get_model(model_name, weights=None, num_classes=1000)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    images = torch.empty(batch, 3, image_size, image_size, device="meta").to(memory_format=memory_format)
    labels = torch.zeros(batch, dtype=torch.long, device="meta")
    params, ready, recorder = list(model.parameters()), {}, Recorder()
    def mark_ready(index):
        ready.setdefault(index, len(recorder.ops))

    for index, param in enumerate(params):
        param.register_post_accumulate_grad_hook(lambda p, i=index: mark_ready(i))
    with recorder:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        recorder.backward = True
        loss.backward()
    buffers = tuple((b.numel() * b.element_size(), str(b.dtype)) for b in model.buffers())
    return recorder.ops, ready, tuple(p.numel() for p in params), buffers


def is_view(func):
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


@functools.lru_cache(maxsize=16)
def model_facts(model_name, image_size, batch, channels_last, bytes_scale, peak_tflops, memory_gbps, kernel_us):
    """The traced step's roofline: each operator max(flops / peak, bytes / bandwidth) + one kernel's cost; without
    a peak (the CPU) time follows the FLOPs. bytes_scale: 0.5 for 16-bit activations (the trace is fp32)."""
    ops, ready, numels, buffers = traced_ops(model_name, image_size, batch, channels_last)
    if peak_tflops:
        cost = [max(f / (peak_tflops * 1e12), b * bytes_scale / (memory_gbps * 1e9)) + kernel_us * 1e-6
                for f, b, _ in ops]
    else:
        cost = [float(f) for f, _, _ in ops]
    first_backward = next(i for i, op in enumerate(ops) if op[2])
    elapsed = list(itertools.accumulate(cost))
    forward, total = elapsed[first_backward - 1], elapsed[-1]
    backward = total - forward
    fraction = tuple((elapsed[ready[i] - 1] - forward) / backward for i in range(len(numels)))
    optimizer = 5 * 4 * sum(numels) / (memory_gbps * 1e9) if peak_tflops else 0.0
    return ModelFacts(numels, buffers, tuple(sorted(ready, key=ready.get)), fraction, backward / (total + optimizer))


def ddp_buckets(facts, cap_bytes, first_cap_bytes=None):
    """DDP's buckets after its rebuild: gradients in the order they became ready, a bucket closed once it holds
    its cap or more. The scripts pass bucket_cap_mb explicitly, so DDP's first bucket has the same cap (its 1 MiB
    first bucket applies only when bucket_cap_mb is left at DDP's default)."""
    buckets, current, size = [], [], 0
    for index in facts.ready_order:
        current.append(index)
        size += 4 * facts.param_numels[index]
        if size >= (cap_bytes if buckets or first_cap_bytes is None else first_cap_bytes):
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def greedy_shards(numels, n, order):
    """Parameter elements per rank when each parameter in `order` goes to the rank holding the fewest so far."""
    totals = [0] * n
    owner = {}
    for index in order:
        rank = totals.index(min(totals))
        totals[rank] += numels[index]
        owner[index] = rank
    return totals, owner


def oss_shards(facts, n):
    """fairscale OSS.partition_parameters: model order, each to the least loaded rank."""
    return greedy_shards(facts.param_numels, n, range(len(facts.param_numels)))


def zero_shards(facts, n):
    """ZeroRedundancyOptimizer._partition_parameters: largest first, each to the least loaded rank."""
    order = sorted(range(len(facts.param_numels)), key=lambda i: -facts.param_numels[i])
    return greedy_shards(facts.param_numels, n, order)


def sharded_ddp_reduces(facts, n, buffer_elements):
    """fairscale ShardedDataParallel's reduce calls: parameters by increasing size go into their owner's bucket
    while it has room (fill + numel < its size, min(reduce_buffer_size, model size) elements); a bucket is reduced
    once all its gradients are in, every other gradient alone as it becomes ready. [(param indices, bytes)]."""
    _, owner = oss_shards(facts, n)
    capacity = min(buffer_elements, sum(facts.param_numels)) if n > 1 else 0
    fill, bucketed = [0] * n, {rank: [] for rank in range(n)}
    singles = []
    for index in sorted(range(len(facts.param_numels)), key=lambda i: facts.param_numels[i]):
        rank, numel = owner[index], facts.param_numels[index]
        if capacity and fill[rank] + numel < capacity:
            fill[rank] += numel
            bucketed[rank].append(index)
        else:
            singles.append([index])
    groups = [group for group in bucketed.values() if group] + singles
    return [(group, 4 * sum(facts.param_numels[i] for i in group)) for group in groups]


# -------------------------------------------------------------------------------------------- one-GPU baseline

@dataclass
class Baseline:
    """One-GPU runs of one workload: their mean throughput per GPU, step times per GPU and configuration, and how
    far apart GPUs run it (gpu_spread: the relative standard deviation of their img/s)."""
    paths: list
    results: list
    match: str = "given"
    gpu_spread: float = 0.0

    @property
    def config(self):
        return self.results[0]["config"]

    @property
    def images_per_second(self):
        """Per GPU: the mean over GPUs of each GPU's mean over its runs."""
        per_gpu = {}
        for result in self.results:
            per_gpu.setdefault(rank_devices(result)[0], []).append(result["throughput"]["images_per_second"])
        return statistics.fmean(statistics.fmean(values) for values in per_gpu.values())

    @property
    def step_ms(self):
        """The one-GPU step as its throughput sees it: timed steps plus the host's per-step overhead."""
        return 1e3 * self.config["batch_size_per_device"] / self.images_per_second

    def samples_per_gpu(self):
        """Timed step times (ms) pooled per GPU (by UUID)."""
        per_gpu = {}
        for result in self.results:
            per_gpu.setdefault(rank_devices(result)[0], []).extend(result["step_times_ms_per_rank"][0])
        return list(per_gpu.values())

    @property
    def compute_ms(self):
        """The median timed step (mean over GPUs): robust to the odd slow step, which the overhead then holds."""
        return statistics.fmean(statistics.median(s) for s in self.samples_per_gpu())


def figure_baseline(label, config, images_per_second, peak_tflops, spread):
    """A one-GPU step known only from its throughput (a published figure): no per-step overhead, no step-to-step
    jitter; GPUs `spread` apart."""
    step_ms = 1e3 * config["batch_size_per_device"] / images_per_second
    result = {"config": config, "efficiency": {"peak_tflops_per_device": peak_tflops},
              "hardware": {"ranks": [{"gpu_uuid": label}]}, "step_times_ms_per_rank": [[step_ms]],
              "throughput": {"images_per_second": images_per_second}}
    return Baseline([label], [result], "a published figure", spread)


def straggler_ms(baseline, n):
    """How much longer the slowest of n ranks' steps is than one rank's, on average. A rank's step is its GPU's
    median step plus that step's jitter (the baseline's steps less their GPU's median, pooled). On the GPUs the
    baseline measured, n of them (as --validate predicts a run from its own GPUs' runs), the medians are theirs and
    each GPU's own steps are drawn; on any other n GPUs each GPU's median is drawn from a normal distribution around
    the baseline's, of relative standard deviation baseline.gpu_spread."""
    import numpy as np
    from scipy.special import ndtr
    if n < 2:
        return 0.0
    samples = [np.sort(np.asarray(s, dtype=float)) for s in baseline.samples_per_gpu()]
    if len(samples) == n:
        grid = np.unique(np.concatenate(samples))
        cdf = np.prod([np.searchsorted(s, grid, side="right") / len(s) for s in samples], axis=0)
        mean = np.mean([s.mean() for s in samples])
    else:
        medians = [np.median(s) for s in samples]
        jitter = np.sort(np.concatenate([s - m for s, m in zip(samples, medians)]))
        values, counts = np.unique(jitter, return_counts=True)
        sigma = baseline.gpu_spread * np.mean(medians)
        if sigma > 0:  # the jitter's distribution on a fine grid, convolved with the normal's
            grid = np.linspace(values[0] - 8 * sigma, values[-1] + 8 * sigma, 4001)
            step, reach = grid[1] - grid[0], math.ceil(7 * sigma / (grid[1] - grid[0]))
            mass = np.bincount(np.rint((values - grid[0]) / step).astype(int), counts, len(grid)) / counts.sum()
            normal = np.diff(ndtr((np.arange(-reach, reach + 2) - 0.5) * step / sigma))
            one = np.cumsum(np.convolve(mass, normal, mode="same"))
        else:
            grid, one = values, np.cumsum(counts) / counts.sum()
        grid, cdf, mean = grid + np.mean(medians), one ** n, np.mean(medians) + jitter.mean()
    return float(np.sum(grid * np.diff(cdf, prepend=0.0)) - mean)


# ---------------------------------------------------------------------------------------------- the workload

@dataclass(frozen=True)
class Workload:
    """What runs on each rank and how the strategy is configured (from a result's config)."""
    model: str
    image_size: int
    batch: int
    precision: str
    channels_last: bool
    optimizer: str
    optimizer_impl: str
    bucket_cap_mb: float = 25.0
    first_bucket_mb: float = None  # DDP's first bucket: its cap, unless bucket_cap_mb was left at DDP's default
    broadcast_buffers: bool = True
    gradient_as_bucket_view: bool = True
    compiled_ddp: str = "eager"
    fsdp_units: str = "model"
    fsdp_param_dtype: str = "fp32"
    sharded_reduce_buffer: int = 2 ** 23


def workload_of(config, strategy=None):
    """The workload a result's config describes; strategy: the one to predict (another than the result's: its
    optimizer is run as oss_benchmark.py runs it)."""
    strategy = strategy or config.get("strategy", "ddp")
    optimizer = config.get("optimizer", "sgd")
    impl = config.get("optimizer_impl") or ("fused" if config.get("device") == "cuda" and
                                            not config.get("grad_scaler") else "foreach")
    if strategy not in (config.get("strategy", "ddp"), "ddp"):  # a sharding strategy as oss_benchmark.py runs it
        impl = "foreach" if strategy == "zero1_overlap" else SUITE_IMPL.get(optimizer, impl)
    compiled = "eager" if not config.get("compile") else config.get("compiled_ddp") or "ddp_optimizer"
    return Workload(
        model=config.get("model", "resnet50"), image_size=config["image_size"], batch=config["batch_size_per_device"],
        precision=config["precision"], channels_last=config.get("memory_format") == "channels_last",
        optimizer=optimizer, optimizer_impl=impl, bucket_cap_mb=config.get("bucket_cap_mb") or 25.0,
        first_bucket_mb=config.get("first_bucket_mb"),
        broadcast_buffers=config.get("broadcast_buffers") is not False,
        gradient_as_bucket_view=bool(config.get("gradient_as_bucket_view", True)), compiled_ddp=compiled,
        fsdp_units=config.get("fsdp_units") or "model", fsdp_param_dtype=config.get("fsdp_param_dtype") or "fp32",
        sharded_reduce_buffer=config.get("sharded_reduce_buffer", 2 ** 23))


def optimizer_ms(workload, facts, local, share=1.0):
    key = (workload.optimizer, workload.optimizer_impl)
    return share * OPTIMIZER_BYTES.get(key, 8) * facts.param_bytes / (local.memory_gbps * 1e6)


# ---------------------------------------------------------------------------------------------- the strategies

@dataclass
class Context:
    """Everything a strategy's terms need."""
    workload: Workload
    baseline_workload: Workload
    facts: ModelFacts
    topology: Topology
    local: LocalCosts
    n: int
    window_ms: float  # the backward's duration on one GPU

    def ready_ms(self, indices):
        if self.workload.compiled_ddp == "no_optimization":  # one backward graph: every gradient at its end
            return self.window_ms
        return self.window_ms * max(self.facts.ready_fraction[i] for i in indices)

    def comm(self, kind, size):
        return self.topology.collective_ms(kind, size, self.n)


def run_chain(context, events):
    """Collectives issued in order on one communication stream, each starting when its data is ready and the
    previous one is done: (the part that outlasts the backward, the part that overlaps it)."""
    clock, overlap = 0.0, 0.0
    window = context.window_ms
    for ready, kind, size in events:
        start = max(clock, ready)
        clock = start + context.comm(kind, size)
        overlap += max(0.0, min(clock, window) - min(start, window))
    return max(0.0, clock - window), overlap


def ddp_gradient_terms(context, extra=None):
    """DDP's buckets all-reduced as they fill (zero1_overlap: hook_with_zero_step steps each bucket's shards and
    broadcasts them once the last bucket's hook runs, at the end of the backward), the scaling of each gradient in
    its bucket (and the copies out of the buckets without gradient_as_bucket_view) and the SMs NCCL holds while it
    overlaps the backward."""
    facts, local, w = context.facts, context.local, context.workload
    buckets = [(bucket, 4 * sum(facts.param_numels[i] for i in bucket))
               for bucket in ddp_buckets(facts, w.bucket_cap_mb * 2 ** 20,
                                         w.first_bucket_mb and w.first_bucket_mb * 2 ** 20)]
    events = [(context.ready_ms(bucket), "all_reduce", size) for bucket, size in buckets]
    if extra == "zero_hook":  # at the last bucket's hook: each bucket's shard steps, then its N broadcasts
        events += [(context.window_ms, "broadcast", size / context.n) for _, size in buckets
                   for _ in range(context.n)]
    exposed, overlap = run_chain(context, events)
    copies = local.copy_ms(facts.param_bytes, len(facts.param_numels))
    return {"all-reduce": exposed, "bucket copies": copies * (1 if w.gradient_as_bucket_view else 2),
            "SM sharing": local.sm_share * overlap}


def buffer_broadcast_terms(context, per_buffer=False):
    """DDP broadcasts rank 0's buffers before each forward, coalesced by dtype into one call each and copied back
    one by one; ShardedDDP broadcasts each buffer alone, blocking."""
    if not context.workload.broadcast_buffers:
        return {}
    buffers = context.facts.buffer_bytes
    if per_buffer:
        return {"buffer broadcast": sum(context.comm("broadcast", size) for size, _ in buffers)}
    groups = {}
    for size, dtype in buffers:
        groups[dtype] = groups.get(dtype, 0) + size
    total = sum(groups.values())
    return {"buffer broadcast": sum(context.comm("broadcast", size) for size in groups.values()),
            "buffer copies": context.local.copy_ms(2 * total, len(buffers) + len(groups))}


def optimizer_terms(context, share):
    base = optimizer_ms(context.baseline_workload, context.facts, context.local)
    return {"optimizer": optimizer_ms(context.workload, context.facts, context.local, share) - base}


def parameter_broadcasts(context, shard_numels):
    return {"parameter broadcast": sum(context.comm("broadcast", 4 * numel) for numel in shard_numels)}


def terms_ddp(context):
    return {**ddp_gradient_terms(context), **buffer_broadcast_terms(context), **optimizer_terms(context, 1.0)}


def terms_zero1(context):
    shards, _ = zero_shards(context.facts, context.n)
    return {**terms_ddp(context), **parameter_broadcasts(context, shards),
            **optimizer_terms(context, 1 / context.n)}


def terms_zero1_overlap(context):
    return {**ddp_gradient_terms(context, extra="zero_hook"), **buffer_broadcast_terms(context),
            **optimizer_terms(context, 1 / context.n)}


def terms_oss_ddp(context):
    shards, _ = oss_shards(context.facts, context.n)
    return {**terms_ddp(context), **parameter_broadcasts(context, shards), **optimizer_terms(context, 1 / context.n)}


def terms_oss_sharded_ddp(context):
    """Each gradient scaled by 1/N in its hook, then reduced to its owner: alone when large, in its owner's
    bucket when small (the bucket leaves once its last gradient is in); OSS's broadcasts after the step."""
    facts, local = context.facts, context.local
    reduces = sharded_ddp_reduces(facts, context.n, context.workload.sharded_reduce_buffer)
    events = sorted((context.ready_ms(group), "reduce", size) for group, size in reduces)
    exposed, overlap = run_chain(context, events)
    shards, _ = oss_shards(facts, context.n)
    return {"reduce": exposed, "bucket copies": local.copy_ms(facts.param_bytes, len(facts.param_numels)),
            "SM sharing": local.sm_share * overlap, **buffer_broadcast_terms(context, per_buffer=True),
            **parameter_broadcasts(context, shards), **optimizer_terms(context, 1 / context.n)}


def terms_fsdp(context, zero3):
    """FSDP2 with the whole model as one unit: its parameters all-gathered before the forward (and, resharded,
    again before the backward), its gradients reduce-scattered after the backward, nothing to overlap with;
    each side copies into and out of the flat communication buffers."""
    facts, local, n = context.facts, context.local, context.n
    size = facts.param_bytes / (2 if context.workload.fsdp_param_dtype == "compute" else 1)
    gathers = 2 if zero3 else 1
    copies = gathers * (local.copy_ms(size / n) + local.copy_ms(size)) + local.copy_ms(facts.param_bytes) \
        + local.copy_ms(facts.param_bytes / n)
    return {"all-gather": gathers * context.comm("all_gather", size),
            "reduce-scatter": context.comm("reduce_scatter", facts.param_bytes), "bucket copies": copies,
            **optimizer_terms(context, 1 / n)}


STRATEGY_TERMS = {"ddp": terms_ddp, "zero1": terms_zero1, "zero1_overlap": terms_zero1_overlap,
                  "oss_ddp": terms_oss_ddp, "oss_sharded_ddp": terms_oss_sharded_ddp,
                  "fsdp_zero2": lambda c: terms_fsdp(c, False), "fsdp_zero3": lambda c: terms_fsdp(c, True)}
COMMUNICATION = ("all-reduce", "reduce", "all-gather", "reduce-scatter", "parameter broadcast", "buffer broadcast")
OVERHEAD = ("bucket copies", "buffer copies", "SM sharing", "optimizer")


# --------------------------------------------------------------------------------------------------- prediction

@dataclass
class Prediction:
    strategy: str
    n: int
    step_ms: float
    efficiency: float
    images_per_second: float
    terms: dict


def facts_for(workload, baseline, local):
    result = baseline.results[0]
    peak = (result.get("efficiency") or {}).get("peak_tflops_per_device") if result["config"]["device"] == "cuda" \
        else None
    scale = 0.5 if workload.precision in ("bf16", "fp16") else 1.0
    return model_facts(workload.model, workload.image_size, workload.batch, workload.channels_last, scale,
                       peak, local.memory_gbps, local.kernel_us)


def predict(strategy, n, baseline, workload, topology, local):
    """The predicted step of `strategy` on n ranks, with each term (ms)."""
    facts = facts_for(workload, baseline, local)
    compute = baseline.compute_ms
    context = Context(workload, workload_of(baseline.config), facts, topology, local, n, facts.backward_share * compute)
    terms = {"compute": compute, "per-step overhead": baseline.step_ms - compute,
             "straggler": straggler_ms(baseline, n)}
    extra = STRATEGY_TERMS[strategy](context) if n > 1 else {}
    if n == 1:
        extra = optimizer_terms(context, 1.0) if strategy != "ddp" else {}
    terms.update(extra)
    step = sum(terms.values())
    efficiency = baseline.step_ms / step
    return Prediction(strategy, n, step, efficiency, n * baseline.images_per_second * efficiency, terms)
