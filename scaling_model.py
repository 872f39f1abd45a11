"""Predict a data-parallel strategy's step time at N GPUs from one-GPU runs and a measured or preset link, and check
the predictions against the committed multi-rank runs and against published measurements.

    python scaling_model.py RESULT.json [RESULT.json ...] --gpus 2,8,64,512 --link nvlink4
    python scaling_model.py RESULT.json --gpus 2 --probe probe.json      # the link collective_probe.py measured
    python scaling_model.py RESULT.json --gpus 2 --bandwidth 10 --latency 25
    python scaling_model.py --validate results/ --json validation.json --plot validation.png
    python scaling_model.py --check-doc docs/scaling.md    # exit 1 when a generated block is stale (--update-doc)

RESULT: one-GPU results of ddp_resnet50.py or its Lightning twin (one per GPU, e.g. a run on each GPU of a node).
For each strategy (ddp, oss_ddp, oss_sharded_ddp, zero1, zero1_overlap, fsdp_zero2, fsdp_zero3):

    step(N) = one-GPU step (the compute of its timed steps + the per-step overhead its wall clock shows)
            + straggler (each step waits for the slowest of N ranks: GPUs as far apart as the committed one-GPU
              runs of the workload, each step as uneven as the given runs' steps)
            + exposed communication (each collective timed as alpha + size * factor / B in nccl-tests' convention)
            + the kernels data parallelism adds (copies, casts) and the SMs NCCL takes from the backward
            + the optimizer's change (a shard of it; another implementation than the one-GPU run's)

Gradient bytes, buckets, shards and buffers come from torchvision's model built on the meta device; the backward
window and the time each gradient becomes ready from a roofline over the model's operators, scaled to the
measured one-GPU step. Links come from a collective probe or a preset (each with its source); per-kernel costs
from the probe's local copy or the committed one-GPU kernel profile. Multi-rank results are never fitted to:
--validate predicts each committed multi-rank run from its one-GPU counterpart, and each published measurement
(docs/published/) from its published one-GPU figure and link, and reports the error in percentage points of
efficiency (img/s over N times the one-GPU img/s) beside the error of a constant efficiency.
Exit codes: 0 ok (and --check-doc: the document is current), 1 a stale document, 2 bad input (one line).
"""

import argparse
import functools
import io
import itertools
import math
import pathlib
import re
import statistics
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "lib"))
from analysis import (OneLineArgumentParser, UsageError, check_documents, document_problem,  # noqa: E402
                      find_result_files, is_comparison, is_harness_cost, is_number, load_json, rank_devices,
                      read_json, run_cli, update_documents, write_atomically, write_json_atomically)

PROG = "scaling_model.py"
ROOT = pathlib.Path(__file__).resolve().parent
STRATEGIES = ("ddp", "oss_ddp", "oss_sharded_ddp", "zero1", "zero1_overlap", "fsdp_zero2", "fsdp_zero3")
ONE_GPU_BENCHMARKS = ("ddp_resnet50.py", "lightning/ddp_resnet50.py")
BENCHMARKS = (*ONE_GPU_BENCHMARKS, "oss_benchmark.py")

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
KERNEL_PROFILE = ROOT / "experiments" / "step-profile" / "data" / "profile-1gpu-rank0.json"
PUBLISHED = ROOT / "docs" / "published" / "resnet50_multi_gpu.json"

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
    source = (f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {kernel_us:.2f} us per added kernel;"
              f" HBM {memory_gbps:g} GB/s (datasheet), a copy moving each byte twice")
    return LocalCosts(kernel_us, memory_gbps / 2, memory_gbps, sm_share, source)


def probe_costs(probe, origin, sm_share):
    bandwidth, latency = probe_fit(probe, "local_copy", origin)
    return LocalCosts(latency, bandwidth, 2 * bandwidth, sm_share,
                      f"collective_probe.py local copy: {latency:.2f} us per copy, {bandwidth:.1f} GB/s ({origin})")


# ---------------------------------------------------------------------------------------- the model's structure

@dataclass(frozen=True)
class ModelFacts:
    """What the strategies move and when, from the model built on the meta device."""
    name: str
    param_numels: tuple          # model order
    buffer_bytes: tuple          # (bytes, dtype) per buffer
    ready_order: tuple           # parameter indices in the order their gradients become ready
    ready_fraction: tuple        # per parameter (model order): share of the backward done when its gradient is ready
    backward_share: float        # the backward's share of a step (roofline over the traced operators)
    forward_ops: int
    backward_ops: int

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
    return ModelFacts(model_name, numels, buffers, tuple(sorted(ready, key=ready.get)), fraction,
                      backward / (total + optimizer), first_backward, len(ops) - first_backward)


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
    """One-GPU runs of one workload: their mean throughput per GPU, step times per GPU and configuration.
    gpu_spread: how far apart GPUs run it (the relative standard deviation of their img/s); None: as far apart as
    the committed one-GPU runs of the workload (gpu_spread())."""
    paths: list
    results: list
    match: str = "given"
    gpu_spread: float = None

    @property
    def config(self):
        return self.results[0]["config"]

    @property
    def batch(self):
        return self.config["batch_size_per_device"]

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
        return 1e3 * self.batch / self.images_per_second

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

    @property
    def spread(self):
        if self.gpu_spread is None:
            self.gpu_spread = gpu_spread(self.results[0])[0]
        return self.gpu_spread


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
    the baseline's, of relative standard deviation baseline.spread."""
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
        sigma = baseline.spread * np.mean(medians)
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


# ------------------------------------------------------------------------------------------------- reading input

def one_gpu_result(path):
    """A one-GPU run that the model can start from, or one line saying why not."""
    result = load_json(path, "result")
    problem = document_problem(result)
    if problem:
        raise UsageError(f"{path}: {problem}")
    world = world_size(result)
    if world != 1:
        raise UsageError(f"{path}: a {world}-rank result; the model starts from one-GPU runs "
                         f"(multi-rank results are for --validate)")
    if result.get("benchmark") not in ONE_GPU_BENCHMARKS:
        raise UsageError(f"{path}: a one-rank {result.get('benchmark')} run wraps the model in its strategy; "
                         f"start from a ddp_resnet50.py one-GPU run of the same workload")
    if result.get("status") != "ok" or not result.get("step_times_ms_per_rank"):
        raise UsageError(f"{path}: status {result.get('status')!r}, no timed steps to start from")
    return result


def baseline_of(paths):
    results = [one_gpu_result(path) for path in paths]
    keys = {workload_key(r) for r in results}
    if len(keys) > 1:
        raise UsageError("the one-GPU results ran different workloads: give runs of one workload")
    return Baseline([str(p) for p in paths], results)


WORKLOAD_DEFAULTS = {"model": "resnet50", "memory_format": "contiguous", "compile": False, "compile_mode": None,
                     "coordinate_descent_tuning": False, "cuda_graphs": False, "loss_scale": None,
                     "grad_scaler": False, "stem_conv": "torchvision", "max_pool_backward": "torchvision",
                     "batch_norm": "torchvision", "cudnn_benchmark": True, "tf32": True, "cudnn_deterministic": False,
                     "cpu_threads_per_rank": None}


# Environment variables that change what is computed (not where caches live)
COMPUTE_ENVIRONMENT = re.compile(r"TORCHINDUCTOR_(?!CACHE_DIR|FX_GRAPH_CACHE|AUTOGRAD_CACHE)|TORCH_CUDNN_")


def workload_key(result):
    """What one rank computes: the configuration and compute-changing environment a one-GPU counterpart must
    share with a multi-rank run (an unset option and its default are the same)."""
    config = result["config"]
    keys = ("device", "image_size", "batch_size_per_device", "precision", *WORKLOAD_DEFAULTS)
    values = tuple((key, config.get(key) if config.get(key) is not None else WORKLOAD_DEFAULTS.get(key))
                   for key in keys)
    environment = ((result.get("software") or {}).get("environment") or {}).items()
    return values + tuple(sorted((k, v) for k, v in environment if COMPUTE_ENVIRONMENT.match(k)))


def local_costs(baseline, probe, args):
    """Per-kernel and copy costs: the probe's local copy, else the kernel profile (GPU) with the HBM datasheet."""
    result = baseline.results[0]
    cuda = result["config"]["device"] == "cuda"
    sms = ((result.get("hardware") or {}).get("ranks") or [{}])[0].get("multiprocessors")
    # NCCL's channels hold SMs while they run; on the CPU the scripts give each rank cpu_count // ranks threads, so
    # every core computes and gloo's threads take their whole time from the computation.
    sm_share = (NCCL_CHANNELS / sms if sms else 0.0) if cuda else 1.0
    if isinstance(probe, dict) and isinstance(probe.get("collectives"), dict) and "local_copy" in probe["collectives"]:
        return probe_costs(probe, args.probe, sm_share)
    if not cuda:
        raise UsageError("a CPU run needs a probe (--probe, or its result's collective_probe): the per-copy cost "
                         "and copy bandwidth come from its local copy")
    name = ((result.get("hardware") or {}).get("ranks") or [{}])[0].get("gpu_name")
    memory = args.memory_bandwidth or (datasheet(name) or [None] * 2)[1]
    if memory is None:
        raise UsageError(f"no HBM bandwidth known for {name!r}: give --memory-bandwidth GB/s")
    return kernel_profile_costs(pathlib.Path(args.kernel_profile), memory, sm_share)


def topology_of(args, probe):
    if probe is not None:
        intra = probe_link(probe, args.probe)
    elif args.bandwidth is not None:
        intra = given_link(args.bandwidth, args.latency)
    else:
        intra = preset_link(args.link)
    return Topology(intra, preset_link(args.inter_node_link), args.gpus_per_node, args.nics_per_node or
                    args.gpus_per_node)


def read_probe(path):
    data = load_json(path, "probe")
    probe = data.get("collective_probe", data) if isinstance(data, dict) else None
    if not isinstance(probe, dict) or not str(probe.get("schema", "")).startswith("collective_probe/"):
        raise UsageError(f"{path}: no collective_probe.py output (nor a result holding one)")
    return probe


# ---------------------------------------------------------------------------------------------------- printing

def describe_terms(prediction, names):
    parts = [f"{name} {100 * prediction.terms[name] / prediction.step_ms:.2f}" for name in names
             if abs(prediction.terms.get(name, 0.0)) >= 5e-4]
    return ", ".join(parts) or "-"


def prediction_table(predictions, basis=None):
    """A Markdown table of the predictions; basis: a function of a prediction saying what it rests on (a column)."""
    lines = ["| strategy | GPUs | step ms | img/s | efficiency | compute % | per-step overhead % | straggler % | "
             "exposed communication % | added kernels and optimizer % |" + (" basis |" if basis else ""),
             "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if basis else "")]
    for p in predictions:
        share = {name: 100 * p.terms[name] / p.step_ms for name in ("compute", "per-step overhead", "straggler")}
        lines.append(f"| {p.strategy} | {p.n} | {p.step_ms:.2f} | {p.images_per_second:,.0f} | "
                     f"{100 * p.efficiency:.1f} % | {share['compute']:.1f} | {share['per-step overhead']:.2f} | "
                     f"{share['straggler']:.2f} | {describe_terms(p, COMMUNICATION)} | {describe_terms(p, OVERHEAD)} |"
                     + (f" {basis(p)} |" if basis else ""))
    return "\n".join(lines)


def workload_line(baseline):
    c = baseline.config
    mode = "compiled" if c.get("compile") else "eager"
    mode += ", captured" if c.get("cuda_graphs") else ""
    return (f"{c.get('model', 'resnet50')}, {c['image_size']} px, {c['batch_size_per_device']} images per GPU, "
            f"{c['precision']}, {mode}, {c.get('optimizer', 'sgd')}: one GPU {baseline.images_per_second:,.0f} "
            f"img/s, {baseline.step_ms:.2f} ms a step ({', '.join(baseline.paths)})")


# --------------------------------------------------------------------------------------------------- validation

def read_results(folders):
    """([(path, result)] of every valid result under the folders, [{path, reason}] of every other file), paths
    relative to the repository."""
    for folder in folders:
        if not pathlib.Path(folder).is_dir():
            raise UsageError(f"--validate {folder}: not a folder")
    loaded, skipped = [], []
    for path in find_result_files(folders):
        document, problem = read_result(str(pathlib.Path(path).resolve()))
        if problem:
            skipped.append({"path": relative(path), "reason": problem})
        else:
            loaded.append((relative(path), document))
    return loaded, skipped


@functools.lru_cache(maxsize=None)
def read_result(path):
    """(a valid result, None) or (None, why the file is none), read once."""
    document, problem = read_json(path)
    if problem is None:
        problem = ("a comparison (compare.py), not a result" if is_comparison(document) else
                   "a harness-cost measurement, not a result" if is_harness_cost(document) else
                   document_problem(document))
    return (None, problem) if problem else (document, None)


def relative(path):
    path = pathlib.Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def world_size(result):
    return (result.get("world") or {}).get("world_size", 1)


def machine_kind(path):
    """A campaign folder's machine kind: nvidia-h200-x2-2026-11-30b -> nvidia-h200-x2."""
    folder = pathlib.PurePath(path).parent.name
    return re.sub(r"-\d{4}-\d{2}-\d{2}[a-z]?$", "", folder)


def can_start_from(result):
    return (world_size(result) == 1 and result["benchmark"] in ONE_GPU_BENCHMARKS and result.get("status") == "ok"
            and bool(result.get("step_times_ms_per_rank")))


@functools.lru_cache(maxsize=1)
def committed_one_gpu_runs():
    """{(benchmark, workload_key): [(path, result)]} of every committed one-GPU run the model can start from."""
    runs = {}
    for path, result in read_results([ROOT / "results"])[0]:
        if can_start_from(result):
            runs.setdefault((result["benchmark"], workload_key(result)), []).append((path, result))
    return runs


def gpu_spread(result):
    """How far apart GPUs run a result's benchmark and workload: the relative standard deviation of each GPU's
    mean img/s over the committed one-GPU runs of them (0 where fewer than 3 GPUs ran it), the GPUs, the runs, and
    the fastest GPU's mean over the slowest's less 1."""
    per_gpu = {}
    for _, run in committed_one_gpu_runs().get((result["benchmark"], workload_key(result)), []):
        per_gpu.setdefault(rank_devices(run)[0], []).append(run["throughput"]["images_per_second"])
    means = [statistics.fmean(rates) for rates in per_gpu.values()]
    spread = statistics.stdev(means) / statistics.fmean(means) if len(means) >= 3 else 0.0
    return spread, len(means), sum(map(len, per_gpu.values())), max(means) / min(means) - 1 if means else 0.0


def find_counterpart(path, result, same):
    """The one-GPU runs of the same workload (`same`: all of them) a multi-rank run is measured against: on its own
    GPUs (same folder first), else in its folder, else on its machine kind. Lightning runs prefer Lightning's."""
    own = result["benchmark"] if result["benchmark"] in ONE_GPU_BENCHMARKS else "ddp_resnet50.py"
    folder, uuids = str(pathlib.PurePath(path).parent), set(rank_devices(result))
    levels = (("same GPUs, same folder", lambda p, r: rank_devices(r)[0] in uuids and str(pathlib.PurePath(p).parent)
               == folder), ("same GPUs, another folder", lambda p, r: rank_devices(r)[0] in uuids),
              ("other GPUs, same folder", lambda p, r: str(pathlib.PurePath(p).parent) == folder),
              ("other GPUs, same machine kind", lambda p, r: machine_kind(p) == machine_kind(path)))
    for match, accept in levels:
        for pool, note in (([(p, r) for p, r in same if r["benchmark"] == own], ""), (same, ", ddp_resnet50.py")):
            runs = [(p, r) for p, r in pool if accept(p, r)]
            if runs:
                covered = {rank_devices(r)[0] for _, r in runs} & uuids
                share = f" ({len(covered)} of {len(uuids)})" if match.startswith("same") and covered < uuids else ""
                note = note if own != "ddp_resnet50.py" else ""
                return Baseline([p for p, _ in runs], [r for _, r in runs], match + share + note)
    return None


POWER_CAP = ("the power cap: compiled one-GPU steps already run at the GPU's power limit, so the power NCCL and "
             "the links add costs clock (no one-GPU figure gives it)")
# The mechanisms a run can have that the model has no term for: a short name (the tables') and what it costs.
NOT_MODELLED = {
    "host-bound": "the one-GPU step is the host's pace, not the GPU's (its runs' median host lead under 1 ms)",
    "OSS's device sync": "fairscale OSS synchronises the device before its broadcasts: the host's run-ahead is lost",
    "ShardedDDP's host work": "ShardedDDP's blocking per-buffer broadcasts and Python gradient hooks cost host time",
    "FSDP2's host work": "FSDP2's per-parameter host work each step",
    "Lightning's side stream": "Lightning builds DDP on a side stream",
    "Lightning's SIGTERM check": "Lightning's per-step SIGTERM check synchronises the host",
    "a communication hook": "a DDP communication hook: the backward waits for each all-reduce's copy back",
    "the power cap": POWER_CAP,
    "a CUDA graph": "a kernel's cost inside a CUDA graph (the per-kernel cost comes from an uncaptured profile)",
    "the DDP optimizer": "the compiled graph split at each bucket (TorchDynamo's DDP optimizer): the breaks cost "
                         "host time and fusion",
    "the Python reducer": "compiled autograd's Python reducer"}


def host_leads(results):
    """Median host lead (ms) of each run that recorded it: how far the host ran ahead of the GPU."""
    return [statistics.median(lead) for r in results for lead in r.get("host_lead_ms_per_rank") or [] if lead]


def not_modelled(result, baseline, workload_leads=()):
    """The mechanisms (NOT_MODELLED's names) a run's configuration has and the model has no term for, decided from
    the configs and the one-GPU runs alone. workload_leads: host leads of every one-GPU run of the workload, for
    counterparts that predate the host lead's record."""
    config, strategy = result["config"], result.get("strategy")
    leads = host_leads(baseline.results) or list(workload_leads)
    found = {"host-bound": bool(leads) and statistics.median(leads) < 1.0,
             "OSS's device sync": strategy == "oss_ddp",
             "ShardedDDP's host work": strategy == "oss_sharded_ddp",
             "FSDP2's host work": strategy in ("fsdp_zero2", "fsdp_zero3"),
             "Lightning's side stream": result.get("benchmark") == "lightning/ddp_resnet50.py"
             and config.get("lightning_ddp_side_stream") is not False,
             "Lightning's SIGTERM check": bool(config.get("lightning_sigterm_sync")),
             "a communication hook": config.get("comm_hook") not in (None, "none"),
             "the power cap": bool(config.get("compile")),
             "a CUDA graph": bool(config.get("cuda_graphs")),
             "the DDP optimizer": bool(config.get("compile")) and config.get("compiled_ddp") in (None, "ddp_optimizer"),
             "the Python reducer": config.get("compiled_ddp") == "python_reducer"}
    return [name for name, present in found.items() if present]


def cannot_predict(path, result):
    if world_size(result) < 2:
        return None
    if result.get("status") != "ok" or not result.get("throughput", {}).get("images_per_second"):
        return f"status {result.get('status')!r}: no throughput"
    strategy = result.get("strategy")
    if result["benchmark"] not in BENCHMARKS or strategy not in (*STRATEGIES, "lightning_ddp"):
        return f"strategy {strategy!r} of {result['benchmark']} is not modelled"
    if strategy.startswith("fsdp") and result["config"].get("fsdp_units", "model") != "model":
        return f"FSDP2 in {result['config']['fsdp_units']} units: only one unit (the whole model) is modelled"
    return None


def validate_run(path, result, baseline, args, workload_leads):
    n = world_size(result)
    strategy = "ddp" if result["strategy"] == "lightning_ddp" else result["strategy"]
    probe = result.get("collective_probe")
    link = probe_link(probe, "the run's collective_probe") if probe else preset_link(args.link or "nvlink4")
    topology = Topology(link, preset_link(args.inter_node_link), args.gpus_per_node, args.nics_per_node or
                        args.gpus_per_node)
    local = local_costs(baseline, probe, argparse.Namespace(**{**vars(args), "probe": "the run's probe"}))
    prediction = predict(strategy, n, baseline, workload_of(result["config"], strategy), topology, local)
    measured = result["throughput"]["images_per_second"] / (n * baseline.images_per_second)
    missing = not_modelled(result, baseline, workload_leads)
    return {"path": path, "benchmark": result["benchmark"], "strategy": result["strategy"], "gpus": n,
            "nodes": len((result.get("hardware") or {}).get("hostnames") or []) or 1,
            "mode": run_mode(result["config"]), "measured": round(100 * measured, 3),
            "predicted": round(100 * prediction.efficiency, 3),
            "error": round(100 * (prediction.efficiency - measured), 3),
            "measured_images_per_second": round(result["throughput"]["images_per_second"], 1),
            "predicted_images_per_second": round(prediction.images_per_second, 1),
            "one_gpu_runs": baseline.paths, "one_gpu_match": baseline.match,
            "one_gpu_images_per_second": round(baseline.images_per_second, 1),
            "like_for_like": baseline.match.startswith("same GPUs"), "covered": not missing,
            "not_modelled": missing, "terms_ms": {k: round(v, 4) for k, v in prediction.terms.items()}}


def run_mode(config):
    mode = "compiled" if config.get("compile") else "eager"
    if config.get("compile"):
        mode += f" ({config.get('compiled_ddp') or 'ddp_optimizer'})"
    return mode + (", captured" if config.get("cuda_graphs") else "")


def validate(folders, args):
    """Every multi-rank result under the folders predicted from its one-GPU counterpart, and every row of the
    published table from its one-GPU figure and link; each beside a constant efficiency (summarise_validation)."""
    loaded, skipped = read_results(folders)
    workloads, runs = {}, []
    for path, result in loaded:
        if can_start_from(result):
            workloads.setdefault(workload_key(result), []).append((path, result))
    for path, result in loaded:
        if world_size(result) < 2:
            continue
        reason, same = cannot_predict(path, result), workloads.get(workload_key(result), [])
        baseline = None if reason else find_counterpart(path, result, same)
        if reason or baseline is None:
            skipped.append({"path": path, "reason": reason or "no one-GPU run of this workload"})
            continue
        try:
            runs.append(validate_run(path, result, baseline, args, host_leads(r for _, r in same)))
        except UsageError as error:  # e.g. a CPU run without a probe, a probe that cannot be used
            skipped.append({"path": path, "reason": str(error)})
    if not runs:
        multi = sum(world_size(r) > 1 for _, r in loaded)
        reasons = "; ".join(f"{count} x {reason}" for reason, count in
                            Counter(s["reason"] for s in skipped).most_common(3))
        raise UsageError(f"--validate {' '.join(map(str, folders))}: nothing validated: {len(loaded)} results "
                         f"({multi} multi-rank), {len(skipped)} file{'s' * (len(skipped) != 1)} skipped" + (f" ({reasons})" if reasons else ""))
    published, published_skipped = validate_published(PUBLISHED)
    return summarise_validation(runs, skipped, published, published_skipped)


# Published precisions: (the model's precision, the datasheet's peak column). TF32 is fp32 storage with TF32 math.
PRECISIONS = {"fp32": ("fp32", 3), "tf32": ("fp32", 3), "amp fp16": ("fp16", 2)}
DEFAULT_PAIR = ("results/nvidia-h200-x2-2026-11-30b/s4-native-1gpu-bf16-256-gpu0.json",
                "results/nvidia-h200-x2-2026-11-30b/s4-native-1gpu-bf16-256-gpu1.json")


def published_problem(row):
    """Why the model cannot predict a published row honestly, or None."""
    if "parameter_server" in row["implementation"] or "parameter server" in row["implementation"]:
        return "parameter servers, not an all-reduce: the model has no term for them"
    if row["batch_per_gpu"] is None:
        return "batch per GPU not known, so neither is the step the communication overlaps"
    if row["link_gbytes_per_second"] is None:
        return "the link is not stated"
    if datasheet(row["gpu"]) is None or row["precision"] not in PRECISIONS:
        return f"no datasheet figures for the {row['gpu']} in {row['precision']}"
    if not (row["gpus"] >= 2 and row["nodes"] >= 1 and all(is_number(row[key]) and row[key] > 0 for key in (
            "batch_per_gpu", "link_gbytes_per_second", "one_gpu_images_per_second", "n_gpu_images_per_second"))):
        return "not a multi-GPU row with positive figures"
    return None


def predict_published(row, spread):
    """A published row predicted from its one-GPU figure and link, as PyTorch's DDP with its defaults would run it:
    the step is the one-GPU figure's (batch / img/s), the roofline and copies the GPU's datasheet's, the per-kernel
    cost the H200 profile's, the link's bus bandwidth its published line rate (one port per node between nodes)."""
    sms, memory, *peaks = datasheet(row["gpu"])
    precision, column = PRECISIONS[row["precision"]]
    config = {"device": "cuda", "model": "resnet50", "image_size": 224, "batch_size_per_device": row["batch_per_gpu"],
              "precision": precision, "memory_format": "channels_last", "optimizer": "sgd", "optimizer_impl": "foreach", "bucket_cap_mb": 25.0,
              "first_bucket_mb": 1.0, "broadcast_buffers": True, "gradient_as_bucket_view": False}
    baseline = figure_baseline(row["source"], config, row["one_gpu_images_per_second"], peaks[column - 2], spread)
    bandwidth, hop = row["link_gbytes_per_second"], LINK_PRESETS["pcie4" if "PCIe" in row["link"] else "nvlink4"]
    intra = make_link(row["link"], row["link_basis"], bandwidth, hop.hop_us)
    network = make_link(row["link"], row["link_basis"], bandwidth, LINK_PRESETS["ib-ndr400"].hop_us)
    local = kernel_profile_costs(KERNEL_PROFILE, memory, NCCL_CHANNELS / sms)
    return predict("ddp", row["gpus"], baseline, workload_of(config), Topology(intra, network, row["gpus_per_node"], 1),
                   local)


def validate_published(path):
    """([every predicted row of the published table], [{row, organisation, gpu, gpus, nodes, reason} of the
    others]); the straggler spread: the committed eager step's."""
    document = load_json(path, "table of published measurements")
    rows = document.get("rows") if isinstance(document, dict) else None
    if not isinstance(rows, list):
        raise UsageError(f"{path}: no rows of published measurements")
    spread = gpu_spread(one_gpu_result(ROOT / DEFAULT_PAIR[0]))[0]
    predicted, skipped = [], []
    for index, row in enumerate(rows, 1):
        try:
            problem = published_problem(row)
            described = {"row": index, "organisation": row["organisation"], "gpu": row["gpu"], "gpus": row["gpus"],
                         "nodes": row["nodes"]}
        except (KeyError, TypeError):
            skipped.append({"row": index, "reason": "a field is missing or malformed"})
            continue
        if problem:
            skipped.append({**described, "reason": problem})
            continue
        prediction = predict_published(row, spread)
        measured = row["n_gpu_images_per_second"] / (row["gpus"] * row["one_gpu_images_per_second"])
        predicted.append({**described, "source": row["source"], "precision": row["precision"],
                          "batch": row["batch_per_gpu"], "link_gbps": row["link_gbytes_per_second"],
                          "one_gpu_images_per_second": row["one_gpu_images_per_second"],
                          "measured": round(100 * measured, 3), "predicted": round(100 * prediction.efficiency, 3),
                          "error": round(100 * (prediction.efficiency - measured), 3),
                          "terms_ms": {k: round(v, 4) for k, v in prediction.terms.items()}})
    return predicted, skipped


def errors(rows, constant):
    """The model's and the constant's absolute errors over rows (points), and the GPU and node counts they span."""
    model, fixed = [abs(r["error"]) for r in rows], [abs(constant - r["measured"]) for r in rows]
    return {"runs": len(rows), "gpus": sorted({r["gpus"] for r in rows}), "nodes": sorted({r["nodes"] for r in rows}),
            "max_abs_error_pp": round(max(model), 3), "mean_abs_error_pp": round(statistics.fmean(model), 3),
            "baseline_max_abs_error_pp": round(max(fixed), 3),
            "baseline_mean_abs_error_pp": round(statistics.fmean(fixed), 3)}


def summarise_validation(runs, skipped, published, published_skipped):
    """The errors of the model and of a constant efficiency (the baseline: the mean measured efficiency of the
    in-sample runs in the model's scope, or of every predicted run where none is) over each set of runs, and per
    group of in-sample runs."""
    in_scope = [r for r in runs if r["covered"] and r["like_for_like"]]
    fitted, which = (in_scope, "in the model's scope") if in_scope else (runs, "every predicted run")
    constant = round(statistics.fmean(r["measured"] for r in fitted), 3)
    for row in (*runs, *published):
        row["baseline_error"] = round(constant - row["measured"], 3)
    sets = {"in sample, in the model's scope": in_scope,
            "in sample, outside it": [r for r in runs if not r["covered"] and r["like_for_like"]],
            "in sample, one-GPU runs on other GPUs": [r for r in runs if not r["like_for_like"]],
            "in sample, every predicted run": runs,
            "published, one node": [r for r in published if r["nodes"] == 1],
            "published, across nodes": [r for r in published if r["nodes"] > 1],
            "published, every predicted row": published}
    groups = {}
    for run in runs:
        name = ("" if run["covered"] else "outside the scope: ") + run_group(run) + (
            "" if run["like_for_like"] else " (one-GPU runs on other GPUs)")
        groups.setdefault(name, []).append(run)
    return {"model": PROG,
            "units": {"measured": "% efficiency: img/s over N x the one-GPU img/s (in sample: of the same GPUs)",
                      "predicted": "% efficiency", "error": "percentage points (predicted - measured)",
                      "baseline_error": "percentage points (the constant - measured)"},
            "constant_efficiency": {"value": constant, "fitted_to": f"the mean measured efficiency of {len(fitted)} "
                                    f"in-sample runs ({which})"},
            "sets": {name: errors(rows, constant) for name, rows in sets.items() if rows},
            "groups": {name: errors(rows, constant) for name, rows in sorted(groups.items())},
            "max_abs_error_pp": round(max((abs(r["error"]) for r in in_scope), default=0.0), 3),
            "covered_runs": len(in_scope), "predicted_runs": len(runs), "runs": runs, "skipped": skipped,
            "published": {"table": relative(PUBLISHED), "rows": published, "skipped": published_skipped}}


def run_group(run):
    if run["benchmark"] == "oss_benchmark.py":
        return f"oss_benchmark.py {run['strategy']}"
    return f"{'Lightning' if run['benchmark'].startswith('lightning') else 'native'} DDP, {run['mode']}"


def span(values):
    return f"{values[0]}" if values[0] == values[-1] else f"{values[0]}-{values[-1]}"


def errors_table(v, sets):
    lines = [f"| runs | n | GPUs | nodes | model: max abs error, points | mean | constant "
             f"{v['constant_efficiency']['value']:.2f} %: max | mean |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {name} | {s['runs']} | {span(s['gpus'])} | {span(s['nodes'])} | {s['max_abs_error_pp']:.2f} | "
              f"{s['mean_abs_error_pp']:.2f} | {s['baseline_max_abs_error_pp']:.2f} | "
              f"{s['baseline_mean_abs_error_pp']:.2f} |" for name, s in sets.items()]
    return "\n".join(lines)


def skipped_line(v):
    counts = Counter(s["reason"] for s in v["skipped"])
    return (f"Skipped in sample: {len(v['skipped'])} files (" + "; ".join(
        f"{count} x {reason}" for reason, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) + "); "
        f"published: {len(v['published']['skipped'])} rows (" + "; ".join(
            f"rows {', '.join(str(s['row']) for s in v['published']['skipped'] if s['reason'] == reason)}: {reason}"
            for reason in dict.fromkeys(s["reason"] for s in v["published"]["skipped"])) + ").")


# ------------------------------------------------------------------------------------------------------ the plot

def plot_predicted_against_measured(validation, path):
    """Predicted against measured efficiency of each validated run and published row (a validation dict as
    --validate writes it), saved to path (PNG, SVG or PDF by its suffix), written atomically."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(6.4, 6.0))
    runs, rows = validation["runs"], (validation.get("published") or {}).get("rows") or []
    values = [r[key] for r in (*runs, *rows) for key in ("measured", "predicted")]
    low, high = (min(values) - 1, max(values) + 1) if values else (90, 101)
    axes.fill_between([low, high], [low - 1, high - 1], [low + 1, high + 1], color="0.9", label="within 1 point")
    axes.plot([low, high], [low, high], color="0.5", linewidth=0.8)
    for chosen, marker, label in (([r for r in runs if r["covered"]], "o", "in sample, in the model's scope"),
                                  ([r for r in runs if not r["covered"]], "x", "in sample, outside it"),
                                  (rows, "^", "published")):
        axes.scatter([r["measured"] for r in chosen], [r["predicted"] for r in chosen], marker=marker, s=18,
                     label=f"{label} ({len(chosen)})")
    axes.set(xlim=(low, high), ylim=(low, high), xlabel="measured efficiency (%)",
             ylabel="predicted efficiency (%)",
             title=f"{len(runs)} runs, {len(rows)} published rows; in scope: max |error| "
                   f"{validation['max_abs_error_pp']:.2f} points")
    axes.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    image = io.BytesIO()
    try:
        figure.savefig(image, format=pathlib.Path(path).suffix[1:].lower())
    finally:
        plt.close(figure)
    write_output(path, lambda: write_atomically(path, image.getvalue()))


# -------------------------------------------------------------------------------------------------- command line

def parse_arguments(argv):
    parser = OneLineArgumentParser(prog=PROG, description=__doc__.split("\n")[0], allow_abbrev=False,
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add("results", nargs="*", help="one-GPU result JSON files of one workload (one per GPU)")
    add("--gpus", default="2,8,64,512", help="the GPU counts to predict, comma-separated")
    add("--strategies", default=",".join(STRATEGIES), help="the strategies to predict, comma-separated")
    link = parser.add_mutually_exclusive_group()
    link.add_argument("--link", choices=sorted(LINK_PRESETS), help="the link between a node's GPUs, from a preset")
    link.add_argument("--bandwidth", type=float, help="the link's bus bandwidth, GB/s (with --latency)")
    link.add_argument("--probe", help="collective_probe.py's JSON (or a result holding one): the measured link")
    add("--latency", type=float, help="with --bandwidth: a 2-rank all-reduce's latency, us")
    add("--inter-node-link", choices=sorted(LINK_PRESETS), default="ib-ndr400", help="the link between nodes")
    add("--gpus-per-node", type=int, default=8, help="GPUs joined by --link in each node")
    add("--nics-per-node", type=int, help="inter-node NICs per node (default: one per GPU)")
    add("--memory-bandwidth", type=float, help="the GPU's HBM bandwidth, GB/s (default: its datasheet's)")
    add("--kernel-profile", default=str(KERNEL_PROFILE), help="one-GPU kernel profile giving a kernel's cost")
    add("--gpu-spread", type=float, help="how far apart GPUs run the step: the relative standard deviation of their "
                                         "img/s, %% (default: the committed one-GPU runs' of the workload)")
    add("--json", help="write the predictions (or the validation) to this JSON file")
    add("--validate", nargs="+", metavar="FOLDER", help="predict every multi-rank result under these folders, and "
                                                        "the published measurements in docs/published/")
    add("--plot", help="with --validate: plot predicted against measured to this image file")
    add("--check-doc", metavar="MARKDOWN", help="exit 1 if a generated block of this document is stale")
    add("--update-doc", metavar="MARKDOWN", help="regenerate the generated blocks of this document in place")
    return parser.parse_args(argv)


def check_arguments(args):
    """Every bad option refused in one line before any work, the outputs included: (GPU counts, strategies)."""
    modes = [bool(args.results), bool(args.validate), bool(args.check_doc), bool(args.update_doc)]
    if sum(modes) != 1:
        raise UsageError("give one-GPU RESULT files, or one of --validate, --check-doc, --update-doc")
    if (args.bandwidth is None) != (args.latency is None):
        raise UsageError("--bandwidth and --latency go together")
    if args.bandwidth is not None and not (0 < args.bandwidth < math.inf and 0 <= args.latency < math.inf):
        raise UsageError("--bandwidth must be positive and --latency not negative")
    if args.gpus_per_node < 1 or (args.nics_per_node is not None and args.nics_per_node < 1):
        raise UsageError("--gpus-per-node and --nics-per-node must be positive")
    for name in ("memory_bandwidth", "gpu_spread"):
        value = getattr(args, name)
        if value is not None and not (0 <= value < math.inf and (value > 0 or name == "gpu_spread")):
            raise UsageError(f"--{name.replace('_', '-')} must be a {'positive' if name == 'memory_bandwidth' else 'non-negative'} number")
    if args.plot and not args.validate:
        raise UsageError("--plot goes with --validate")
    if args.results and args.link is None and args.bandwidth is None and args.probe is None:
        raise UsageError("give the link: --link PRESET, --bandwidth GB/s --latency us, or --probe FILE")
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path:
            check_output(option, path)
    return parse_counts(args.gpus), parse_strategies(args.strategies)


def check_output(option, path):
    """Refuse an output that cannot be written, before the work: a folder that is not there or takes no file, a
    plot format matplotlib does not write."""
    path = pathlib.Path(path)
    if path.is_dir() or not path.parent.is_dir():
        raise UsageError(f"{option} {path}: {'a folder' if path.is_dir() else 'its folder does not exist'}")
    try:
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as error:
        raise UsageError(f"{option} {path}: its folder takes no new file ({error.strerror or error})") from None
    if option == "--plot":
        from matplotlib.figure import Figure
        formats = Figure().canvas.get_supported_filetypes()
        if path.suffix[1:].lower() not in formats:
            raise UsageError(f"--plot {path}: give a file ending in .{', .'.join(sorted(formats))}")


def write_output(path, write):
    """Run write(), an output's atomic write; a failure (a full disk, a folder gone) in one line."""
    try:
        write()
    except OSError as error:
        raise UsageError(f"{path}: not written ({error.strerror or error})") from None


def parse_counts(text):
    if not re.fullmatch(r"\s*\d{1,7}(\s*,\s*\d{1,7})*\s*", text or ""):
        raise UsageError(f"--gpus {text!r}: give GPU counts such as 2,8,64,512")
    counts = [int(part) for part in text.split(",")]
    if min(counts) < 1:
        raise UsageError("--gpus: every count must be at least 1")
    return counts


def parse_strategies(text):
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in chosen if name not in STRATEGIES]
    if unknown or not chosen:
        raise UsageError(f"--strategies: {', '.join(unknown) or 'none'} not among {', '.join(STRATEGIES)}")
    return chosen


def predictions_of(args, counts, strategies):
    probe = read_probe(args.probe) if args.probe else None
    baseline = baseline_of(args.results)
    topology, local = topology_of(args, probe), local_costs(baseline, probe, args)
    if args.gpu_spread is not None:
        baseline.gpu_spread = args.gpu_spread / 100
    predictions = [predict(strategy, n, baseline, workload_of(baseline.config, strategy), topology, local)
                   for strategy in strategies for n in counts]
    return baseline, topology, local, predictions


def main_predict(args, counts, strategies):
    baseline, topology, local, predictions = predictions_of(args, counts, strategies)
    print(workload_line(baseline))
    print(f"link: {topology.describe()}")
    print(f"per-kernel and copy costs: {local.source}; GPU-to-GPU spread {100 * baseline.spread:.2f} %")
    print(prediction_table(predictions))
    if args.json:
        write_output(args.json, lambda: write_json_atomically(args.json, {
            "model": PROG, "one_gpu_runs": baseline.paths, "link": topology.describe(), "local_costs": local.source,
            "gpu_spread": baseline.spread,
            "predictions": [{"strategy": p.strategy, "gpus": p.n, "step_ms": round(p.step_ms, 4),
                             "images_per_second": round(p.images_per_second, 1),
                             "efficiency": round(p.efficiency, 5),
                             "terms_ms": {k: round(v, 4) for k, v in p.terms.items()}} for p in predictions]}))
    return 0


def main_validate(args):
    validation = validate(args.validate, args)
    print(errors_table(validation, validation["sets"]))
    print(skipped_line(validation))
    if args.json:
        write_output(args.json, lambda: write_json_atomically(args.json, validation))
    if args.plot:
        plot_predicted_against_measured(validation, args.plot)
    return 0

# ------------------------------------------------------------------------------------ docs/scaling.md's tables

# A run of the fastest mode (the predictions start from the median run of its workload) and a compiled run.
FASTEST = "results/nvidia-h200-2026-12-01d/native-1gpu-fp16ls-256-best.json"
COMPILED = "results/nvidia-h200-x2-2026-11-30e/s10-native-1gpu-bf16-256-compile-gpu0.json"
DOC_COUNTS = "2,8,16,64,512"
# fairscale's benchmarks/oss.py on two consumer GPUs over PCIe with NCCL_P2P_DISABLE=1: each rank's img/s
SEED_RATES = {"ddp": 1795, "oss_ddp": 1645, "oss_sharded_ddp": 1468}
# fairscale's benchmark: ResNet-101 on 28 px MNIST, 256 images per rank, fp32, RMSprop (foreach, two state
# tensors), DistributedDataParallel with PyTorch's defaults (bucket_cap_mb left at its default, so DDP's first
# bucket is 1 MiB; no bucket views; buffers broadcast), ShardedDDP's default 2**23-element reduce buffer.
SEED_CONFIG = {"benchmark": "oss_benchmark.py", "strategy": "ddp", "device": "cuda", "model": "resnet101",
               "image_size": 28, "batch_size_per_device": 256, "precision": "fp32", "memory_format": "contiguous",
               "optimizer": "rmsprop", "optimizer_impl": "foreach", "bucket_cap_mb": 25.0, "first_bucket_mb": 1.0,
               "broadcast_buffers": True, "gradient_as_bucket_view": False, "sharded_reduce_buffer": 2 ** 23}
# The seed's GPUs are not named: the roofline and copies assume an RTX 3090's datasheet (35.6 TFLOP/s fp32,
# 936 GB/s, 82 SMs) and NCCL's two channels over shared memory; the kernel cost is the H200 profile's.
SEED_GPU = {"peak_tflops": 35.6, "memory_gbps": 936.0, "sms": 82, "channels": 2}
# PCIe without peer-to-peer: NCCL stages every transfer through host memory. PyTorch's comm_analysis.py profile
# for PCIe: about 10 GB/s effective bus bandwidth, 15 us base and 60 us per ring step (a 2-rank all-reduce: 135 us).
SEED_LINK = {"bandwidth": 10.0, "latency": 135.0}


def doc_arguments(**changes):
    """The command line's defaults, for the sections' fixed commands."""
    return argparse.Namespace(**{**vars(parse_arguments([])), **changes})


def section_predictions(paths, title):
    args = doc_arguments(results=list(paths), link="nvlink4", gpus=DOC_COUNTS)
    baseline, _, _, predictions = predictions_of(args, parse_counts(DOC_COUNTS), list(STRATEGIES))
    spread, gpus, runs, _ = gpu_spread(baseline.results[0])
    at_two = {p.strategy: p for p in predictions if p.n == 2}
    command = f"python scaling_model.py {' '.join(paths)} --gpus {DOC_COUNTS} --link nvlink4"
    return "\n".join([f"{title}: `{command}` (nodes of 8 GPUs on NVLink 4, joined by InfiniBand NDR 400, one NIC "
                      f"per GPU). {workload_line(baseline)}. GPU-to-GPU spread {100 * spread:.2f} % (the relative "
                      f"standard deviation of the mean img/s of {gpus} GPUs over {runs} committed one-GPU runs of "
                      f"this workload).", "", prediction_table(predictions, lambda p: basis(p, baseline, at_two[p.strategy]))])


def basis(prediction, baseline, at_two):
    """What a prediction rests on: in-sample runs of its strategy, GPU count and mode in the model's scope, or an
    extrapolation: the mechanisms the model lacks for it, else the loss that grows most from its 2-GPU prediction
    (at_two) and the assumption that decides it."""
    mode = run_mode(baseline.config)
    checked = [r for r in committed_validation()["runs"] if r["covered"] and r["like_for_like"] and r["mode"] == mode
               and r["gpus"] == prediction.n and r["strategy"].replace("lightning_", "") == prediction.strategy]
    if checked:
        worst = max(abs(r["error"]) for r in checked)
        return f"validated: {len(checked)} run{'s' * (len(checked) > 1)} in sample, max abs error {worst:.2f} points"
    benchmark = baseline.results[0]["benchmark"] if prediction.strategy == "ddp" else "oss_benchmark.py"
    missing = not_modelled({"config": baseline.config, "strategy": prediction.strategy, "benchmark": benchmark},
                           baseline)
    if missing:
        return f"extrapolation, outside the model's scope: {', '.join(missing)}"
    if prediction.n == at_two.n:
        return "not checked: no in-sample run of this strategy in this mode"
    grown = {k: v - at_two.terms.get(k, 0.0) for k, v in prediction.terms.items() if k not in ("compute",
                                                                                               "per-step overhead")}
    largest = max(grown, key=grown.get)
    return f"extrapolation: {largest} grows most ({ASSUMPTIONS.get(largest, ASSUMPTIONS['link'])})"


# What decides a prediction's largest loss.
ASSUMPTIONS = {"straggler": "GPUs as far apart as the committed one-GPU runs, steps as uneven",
               "bucket copies": "the one-GPU profile's cost per kernel", "buffer copies": "the one-GPU profile's cost "
               "per kernel", "SM sharing": "NCCL's 16 channels' share of the SMs",
               "link": "the link presets' bus bandwidth, NCCL's latency model"}


def section_model_inputs(_=None):
    """The figures the model takes from the model's structure, the profile and the committed one-GPU runs."""
    baseline = baseline_of([ROOT / path for path in DEFAULT_PAIR])
    local = local_costs(baseline, None, doc_arguments())
    facts = facts_for(workload_of(baseline.config), baseline, local)
    rows = ["| input | value |", "|---|---|",
            f"| ResNet-50 (torchvision, meta device) | {sum(facts.param_numels):,} parameters in "
            f"{len(facts.param_numels)} tensors, {len(facts.buffer_bytes)} buffers |",
            f"| DDP's buckets at 25 MB | {len(ddp_buckets(facts, 25 * 2 ** 20))} |",
            f"| the backward's share of the default eager step (roofline) | {100 * facts.backward_share:.0f} % |",
            f"| a kernel's cost (the one-GPU profile) | {local.kernel_us:.2f} us |"]
    for name, path in (("the default eager step", DEFAULT_PAIR[0]), ("compiled", COMPILED),
                       ("the fastest mode", FASTEST)):
        spread, gpus, runs, extent = gpu_spread(one_gpu_result(ROOT / path))
        rows.append(f"| GPU-to-GPU spread, {name} | {100 * spread:.2f} % ({gpus} GPUs, {runs} runs; the fastest GPU "
                    f"{100 * extent:.1f} % faster than the slowest) |")
    return "\n".join(rows)


def section_predictions_default(_=None):
    return section_predictions(DEFAULT_PAIR, "The default eager step")


def median_run(reference):
    """The committed one-GPU run of reference's benchmark and workload with the median img/s (the lower middle one
    of an even count), and the img/s of them all."""
    result = one_gpu_result(ROOT / reference)
    key = (result["benchmark"], workload_key(result))
    runs = sorted((r["throughput"]["images_per_second"], p) for p, r in committed_one_gpu_runs()[key])
    return runs[(len(runs) - 1) // 2][1], [rate for rate, _ in runs]


def section_predictions_fastest(_=None):
    path, rates = median_run(FASTEST)
    return section_predictions([path], f"The fastest mode (compiled and captured), from the median of the "
                                       f"{len(rates)} committed runs of its workload ({min(rates):,.0f}-"
                                       f"{max(rates):,.0f} img/s)")


def section_nics(_=None):
    """DDP and the sharded strategies past one node with fewer NICs per node."""
    rows = ["| NICs per node | strategy | 64 GPUs: efficiency | exposed communication % | 512 GPUs: efficiency | "
            "exposed communication % |", "|---|---|---|---|---|---|"]
    for nics in (8, 2, 1):
        args = doc_arguments(results=list(DEFAULT_PAIR), link="nvlink4", nics_per_node=nics)
        for strategy in ("ddp", "zero1", "fsdp_zero2", "fsdp_zero3"):
            _, _, _, (at64, at512) = predictions_of(args, [64, 512], [strategy])
            rows.append(f"| {nics} | {strategy} | {100 * at64.efficiency:.1f} % | {describe_terms(at64, COMMUNICATION)}"
                        f" | {100 * at512.efficiency:.1f} % | {describe_terms(at512, COMMUNICATION)} |")
    command = (f"python scaling_model.py {' '.join(DEFAULT_PAIR)} --gpus 64,512 --link nvlink4 "
               f"--strategies ddp,zero1,fsdp_zero2,fsdp_zero3 --nics-per-node N")
    return f"`{command}` for N = 8, 2, 1:\n\n" + "\n".join(rows)


@functools.lru_cache(maxsize=1)
def committed_validation():
    return validate([ROOT / "results"], doc_arguments())


LOSS_GROUPS = (("eager, DDP's defaults (buffers broadcast, bucket views, 25 MB)",
                lambda r, c: r["mode"] == "eager" and c["bb"] and c["bv"] and c["cap"] == 25),
               ("eager, `--no-broadcast-buffers`", lambda r, c: r["mode"] == "eager" and not c["bb"]),
               ("eager, without bucket views (PyTorch's default)", lambda r, c: r["mode"] == "eager" and not c["bv"]),
               ("compiled, one graph (`no_optimization`)", lambda r, c: r["mode"].startswith("compiled (no_opt")))


def run_options(path):
    config = load_json(ROOT / path, "result")["config"]
    return {"bb": config.get("broadcast_buffers") is not False, "bv": bool(config.get("gradient_as_bucket_view")),
            "cap": config.get("bucket_cap_mb") or 25}


def section_two_gpu_losses(_=None):
    """What the model says each group of measured 2-GPU DDP runs loses to, in ms a step."""
    runs = [r for r in committed_validation()["runs"] if r["like_for_like"] and r["strategy"] in ("ddp",
            "lightning_ddp") and set(r["not_modelled"]) <= {"the power cap"}]
    rows = ["| runs (2 GPUs, 256 images per GPU, DDP) | n | measured loss, ms a step | predicted loss | "
            "on the link | straggler | DDP's added kernels | SM sharing | unexplained (mean) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for label, accept in LOSS_GROUPS:
        chosen = [r for r in runs if accept(r, run_options(r["path"])) and "256" in r["path"]]
        if not chosen:
            continue
        measured = [one_gpu_ms(r) * (100 / r["measured"] - 1) for r in chosen]
        parts = [statistics.fmean(loss_parts(r)[i] for r in chosen) for i in range(5)]
        predicted = sum(parts)
        rows.append(f"| {label} | {len(chosen)} | {min(measured):.2f}-{max(measured):.2f} | {predicted:.2f} | "
                    + " | ".join(f"{part:.2f}" for part in parts[:4])
                    + f" | {statistics.fmean(measured) - predicted:+.2f} |")
    return ("The DDP runs of `--validate results` in the model's scope, and the compiled ones that lack only the "
            "power cap, each against the one-GPU runs of its own GPUs (\"on the link\": the exposed all-reduce and "
            "the buffer broadcast; the optimizer's term is 0 for native DDP):\n\n" + "\n".join(rows))


def one_gpu_ms(run):
    terms = run["terms_ms"]
    return terms["compute"] + terms["per-step overhead"]


def loss_parts(run):
    t = run["terms_ms"]
    link = sum(t.get(name, 0.0) for name in COMMUNICATION)
    kernels = t.get("bucket copies", 0.0) + t.get("buffer copies", 0.0)
    return link, t["straggler"], kernels, t.get("SM sharing", 0.0), t.get("optimizer", 0.0)


def seed_baseline(compute_ms):
    """The seed's one-GPU step, known only through their vanilla DDP figure (no one-GPU run of theirs exists)."""
    return figure_baseline("fairscale's benchmarks/oss.py, vanilla DDP", SEED_CONFIG,
                           1e3 * SEED_CONFIG["batch_size_per_device"] / compute_ms, SEED_GPU["peak_tflops"], 0.0)


def seed_predictions(bandwidth, latency):
    """The seed's three strategies at 2 GPUs on a link: the one-GPU step solved from their vanilla DDP figure."""
    topology = Topology(given_link(bandwidth, latency), preset_link("ib-ndr400"))
    local = LocalCosts(kernel_profile_costs(KERNEL_PROFILE, SEED_GPU["memory_gbps"], 0).kernel_us,
                       SEED_GPU["memory_gbps"] / 2, SEED_GPU["memory_gbps"], SEED_GPU["channels"] / SEED_GPU["sms"],
                       "the H200 profile's kernel cost, an RTX 3090's memory bandwidth")
    target = 1e3 * SEED_CONFIG["batch_size_per_device"] / SEED_RATES["ddp"]
    compute = target
    for _ in range(50):  # the one-GPU step whose predicted DDP step is the seed's vanilla step
        ddp = predict("ddp", 2, seed_baseline(compute), workload_of(SEED_CONFIG, "ddp"), topology, local)
        compute += target - ddp.step_ms
    baseline = seed_baseline(compute)
    return {strategy: predict(strategy, 2, baseline, workload_of(SEED_CONFIG, strategy), topology, local)
            for strategy in SEED_RATES}


def section_seed(_=None):
    rows = ["| link (bus bandwidth, 2-rank all-reduce latency) | DDP img/s | OSS + DDP | OSS + ShardedDDP | "
            "OSS + DDP vs DDP | ShardedDDP vs DDP | what OSS + ShardedDDP adds, ms a step |",
            "|---|---|---|---|---|---|---|"]
    seed = SEED_RATES
    rows.append(f"| measured by the fairscale user | {seed['ddp']:,} | {seed['oss_ddp']:,} | "
                f"{seed['oss_sharded_ddp']:,} | {seed['oss_ddp'] / seed['ddp']:.3f} | "
                f"{seed['oss_sharded_ddp'] / seed['ddp']:.3f} | - |")
    for bandwidth, latency in ((SEED_LINK["bandwidth"], SEED_LINK["latency"]), (5.0, 135.0), (24.0, 20.0)):
        p = seed_predictions(bandwidth, latency)
        rate = {k: v.images_per_second / 2 for k, v in p.items()}
        added = {name: p["oss_sharded_ddp"].terms.get(name, 0.0) - p["ddp"].terms.get(name, 0.0)
                 for name in (*COMMUNICATION, *OVERHEAD)}
        parts = ", ".join(f"{name} {value:+.1f}" for name, value in added.items() if abs(value) >= 0.05)
        rows.append(f"| {bandwidth:g} GB/s, {latency:g} us | {rate['ddp']:,.0f} | {rate['oss_ddp']:,.0f} | "
                    f"{rate['oss_sharded_ddp']:,.0f} | {rate['oss_ddp'] / rate['ddp']:.3f} | "
                    f"{rate['oss_sharded_ddp'] / rate['ddp']:.3f} | {parts} |")
    return ("Per rank, as fairscale's benchmark reports (the one-GPU step is solved from the measured DDP figure, so "
            "the DDP column is that figure by construction):\n\n" + "\n".join(rows))


def section_validation_summary(_=None):
    v = committed_validation()
    scope, published = v["sets"]["in sample, in the model's scope"], v["sets"]["published, every predicted row"]
    gpu_names = sorted({next(key for key in GPUS if datasheet(key) == datasheet(r["gpu"])) for r in
                        v["published"]["rows"]})
    return "\n".join([
        f"`python scaling_model.py --validate results --json validation.json`. Validated in sample: "
        f"{scope['runs']} runs in the model's scope, each with {span(scope['gpus'])} GPUs on {span(scope['nodes'])} "
        f"node (this project's H200s, NVLink); out of sample: {published['runs']} published rows with "
        f"{span(published['gpus'])} GPUs on {span(published['nodes'])} nodes ({', '.join(gpu_names)}), of "
        f"{published['runs'] + len(v['published']['skipped'])} in `{v['published']['table']}`. The constant is "
        f"{v['constant_efficiency']['fitted_to']}, {v['constant_efficiency']['value']:.2f} %, predicted for every run "
        f"and row.", "", errors_table(v, v["sets"]), "", skipped_line(v), "",
        "Each group of in-sample runs:", "", errors_table(v, v["groups"])])


def section_validation(_=None):
    rows = ["| run | strategy | GPUs | the model's scope | one-GPU runs | measured | model | error, points | "
            "constant's error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(committed_validation()["runs"], key=lambda r: (not r["covered"], r["path"])):
        rows.append(f"| [{pathlib.PurePath(r['path']).name}](../{r['path']}) | {r['strategy']} | {r['gpus']} | "
                    f"{'in' if r['covered'] else 'out: ' + ', '.join(r['not_modelled'])} | "
                    f"{'own GPUs' if r['like_for_like'] else 'other GPUs'} | {r['measured']:.2f} % | "
                    f"{r['predicted']:.2f} % | {r['error']:+.2f} | {r['baseline_error']:+.2f} |")
    return "Every multi-rank run `--validate results` predicted:\n\n" + "\n".join(rows)


def section_validation_published(_=None):
    published = committed_validation()["published"]
    rows = ["| row | source | GPU | precision | batch per GPU | GPUs (nodes) | link, GB/s | one GPU, img/s | measured "
            "| model | error, points | constant's error |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in published["rows"]:
        rows.append(f"| {r['row']} | [{r['organisation']}]({r['source']}) | {r['gpu']} | {r['precision']} | "
                    f"{r['batch']} | {r['gpus']} ({r['nodes']}) | {r['link_gbps']:g} | "
                    f"{r['one_gpu_images_per_second']:,.0f} | {r['measured']:.2f} % | {r['predicted']:.2f} % | "
                    f"{r['error']:+.2f} | {r['baseline_error']:+.2f} |")
    rows += ["", "| row | source | GPU | GPUs (nodes) | skipped because |", "|---|---|---|---|---|"]
    rows += [f"| {r['row']} | {r.get('organisation', '-')} | {r.get('gpu', '-')} | {r.get('gpus', '-')} "
             f"({r.get('nodes', '-')}) | {r['reason']} |" for r in published["skipped"]]
    return f"Every row of `{published['table']}`, predicted or skipped:\n\n" + "\n".join(rows)


SECTIONS = {"model-inputs": section_model_inputs, "predictions": section_predictions_default, "predictions-fastest": section_predictions_fastest,
            "nics": section_nics, "two-gpu-losses": section_two_gpu_losses, "seed": section_seed,
            "validation-summary": section_validation_summary, "validation": section_validation,
            "validation-published": section_validation_published}


def main_doc(args):
    """The generated sections of one document checked or rewritten, through the documents' one engine."""
    path = pathlib.Path(args.check_doc or args.update_doc).resolve()
    if args.update_doc:
        return update_documents(SECTIONS, [path.name], path.parent)
    return check_documents(SECTIONS, [path.name], path.parent, fix=f"python scaling_model.py --update-doc {path}")


def main(argv=None):
    args = parse_arguments(sys.argv[1:] if argv is None else argv)
    counts, strategies = check_arguments(args)
    if args.validate:
        return main_validate(args)
    if args.check_doc or args.update_doc:
        return main_doc(args)
    return main_predict(args, counts, strategies)


if __name__ == "__main__":
    run_cli(main, PROG)
