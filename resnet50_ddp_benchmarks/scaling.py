"""The ceiling on data-parallel scaling: the efficiency at N GPUs that communication and data parallelism's own work
at a link leave of a measured one-GPU step (docs/scaling.md). Each term is a lower bound of its cost, so every cost
left out (the input pipeline, stragglers, the framework's host work, the power cap) only lowers the measured figure.
scaling_model.py is its command line; `ceilings` serves report.py's view of a run folder.
"""
import dataclasses
import functools
import math
import pathlib
import re
import statistics
from dataclasses import dataclass

from resnet50_ddp_benchmarks.analysis import (REPOSITORY, UsageError, document_problem, find_result_files, is_number,
                                              load_json, rank_devices, read_json)

STRATEGIES = ("ddp", "oss_ddp", "oss_sharded_ddp", "zero1", "zero1_overlap", "fsdp_zero2", "fsdp_zero3")
CEILING = "the ceiling from communication and data parallelism's own work at this link"
# NCCL's fixed start-up latency of a Simple-protocol ring or tree (us): nccl src/graph/tuning.cc baseLat, as in
# PyTorch's torch/_inductor/comm_analysis.py; the rest of a link's latency grows with the ring's steps.
NCCL_BASE_US = 8.4
NCCL_CHANNELS = 16  # one SM each, on Hopper with NVLink: comm_analysis.py's _GPU_NCHANNELS


# Bus bandwidth (nccl-tests' busbw, GB/s) and NCCL's Simple-protocol per-step latency (us, nccl tuning.cc hwLat:
# NVLink 3.4, PCI 5.7, NET 14.0) of each link.
LINK_PRESETS = {
    "nvlink4": (370.0, 3.4, "NVLink 4 (H100/H200 SXM): 370 GB/s, Hopper's NVLink bus bandwidth in NCCL's "
                                      "topology model (nccl src/graph/topo.h); nccl-tests all_reduce_perf on "
                                      "8 x H100 reports about 370 GB/s"),
    "ib-ndr400": (47.0, 14.0, "InfiniBand NDR 400 Gb/s: 46-48 GB/s per NIC in nccl-tests and ib_write_bw"),
    "pcie4": (24.0, 5.7, "PCIe 4.0 x16 with peer-to-peer: 24 GB/s, NCCL's PCI bandwidth for Gen4 x16"),
    "eth100": (11.5, 14.0, "100 Gb/s Ethernet (RoCE): 12.5 GB/s line rate, about 92 % of it payload"),
}
# NVIDIA's datasheets (SXM parts): SMs and HBM GB/s (a copy or an optimizer moving B bytes costs B / this).
GPUS = {"H200": (132, 4800.0), "H100": (132, 3350.0), "A100 SXM4 80GB": (108, 2039.0), "A100": (108, 1555.0),
        "V100": (80, 900.0)}
# Bytes each optimizer implementation moves per parameter byte and step, counted from PyTorch's kernels.
OPTIMIZER_BYTES = {("sgd", "fused"): 5, ("sgd", "foreach"): 8, ("adam", "fused"): 7, ("adam", "foreach"): 18,
                   ("adamw", "fused"): 7, ("adamw", "foreach"): 20, ("rmsprop", "foreach"): 18,
                   ("rmsprop", "fused"): 18}
SUITE_IMPL = {"sgd": "foreach", "rmsprop": "foreach", "adam": "fused", "adamw": "fused"}  # as oss_benchmark.py runs

# ------------------------------------------------------------------------------------------------------- links

BUS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}
RING_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1, "reduce_scatter": lambda n: n - 1,
              "broadcast": lambda n: n - 1, "reduce": lambda n: n - 1}


@dataclass(frozen=True)
class Link:
    """A link's bus bandwidth (GB/s) and latency (us) per collective kind at `ranks` ranks."""
    name: str
    source: str
    bandwidth: dict
    latency: dict
    ranks: int = 2

    def base_and_hop(self, kind):
        base = min(NCCL_BASE_US, self.latency[kind])
        return base, (self.latency[kind] - base) / max(1, RING_STEPS[kind](self.ranks))

    def time_us(self, kind, size, n):
        base, hop = self.base_and_hop(kind)
        return base + hop * RING_STEPS[kind](n) + size * BUS_FACTORS[kind](n) / (self.bandwidth[kind] * 1e3)


def make_link(name, source, bus_gbps, hop_us):
    return Link(name, source, dict.fromkeys(BUS_FACTORS, bus_gbps),
                {kind: NCCL_BASE_US + hop_us * RING_STEPS[kind](2) for kind in BUS_FACTORS})


def preset_link(name):
    bus_gbps, hop_us, source = LINK_PRESETS[name]
    return make_link(name, source, bus_gbps, hop_us)


def given_link(bandwidth, latency):
    """--bandwidth GB/s --latency us: a 2-rank all-reduce's latency; the other kinds take its per-step part."""
    return make_link(f"{bandwidth:g} GB/s, {latency:g} us", "given on the command line", bandwidth,
                     max(0.0, latency - NCCL_BASE_US) / 2)


def probe_fit(probe, kind, origin):
    """(bus bandwidth GB/s, latency us) of one of a probe's fits, or one line saying why it cannot be used."""
    try:
        bandwidth, latency = (probe["collectives"][kind]["fit"][key] for key in ("bus_bandwidth_gbps", "latency_us"))
    except (KeyError, TypeError):
        raise UsageError(f"{origin}: the probe has no {kind} fit") from None
    if not (is_number(bandwidth) and bandwidth > 0 and is_number(latency) and latency >= 0):
        raise UsageError(f"{origin}: the probe's {kind} fit (bus bandwidth {bandwidth!r} GB/s, latency {latency!r} "
                         f"us) is not a positive bandwidth and a latency of 0 or more")
    return bandwidth, latency


def probe_link(probe, origin):
    """A collective probe's fits (reduce takes broadcast's: the probe times no reduce)."""
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
    the ring runs at the slower of the intra-node bus bandwidth and the node's NICs together, with NCCL's ring
    latency or, for all-reduce, broadcast and reduce, its tree's (a chain in each node, a binary tree between
    nodes), whichever is shorter."""
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
        inter_hop, inter_steps = self.inter.base_and_hop(kind)[1], RING_STEPS[kind](nodes)
        latency = intra_base + intra_hop * (RING_STEPS[kind](n) - inter_steps) + inter_hop * inter_steps
        if kind in ("all_reduce", "broadcast", "reduce"):
            depth = (self.per_node - 1) * intra_hop + math.ceil(math.log2(nodes)) * inter_hop
            latency = min(latency, intra_base + depth * (2 if kind == "all_reduce" else 1))
        return (latency + size * BUS_FACTORS[kind](n) / (bandwidth * 1e3)) / 1e3

    def describe(self):
        return (f"{self.intra.name} ({self.intra.source}); between nodes of {self.per_node} GPUs: {self.inter.name} "
                f"x {self.nics} NICs per node ({self.inter.source})")


# ------------------------------------------------------------------------------------------- device-local costs

@dataclass(frozen=True)
class LocalCosts:
    """One more small kernel (us), a copy (GB/s copied), the optimizer's traffic (HBM GB/s) and the share of the
    device's SMs NCCL's kernels take while they run."""
    kernel_us: float
    copy_gbps: float
    memory_gbps: float
    sm_share: float
    source: str

    def copy_ms(self, size, kernels=1):
        return (kernels * self.kernel_us + size / (self.copy_gbps * 1e3)) / 1e3


def datasheet(gpu_name):
    """(SMs, HBM GB/s) of a GPU by its name, or None."""
    name = str(gpu_name or "").replace("-", " ")
    return next((figures for key, figures in GPUS.items() if key in name), None)


def probe_costs(probe, origin, sm_share):
    bandwidth, latency = probe_fit(probe, "local_copy", origin)
    return LocalCosts(latency, bandwidth, 2 * bandwidth, sm_share,
                      f"collective_probe.py local copy: {latency:.2f} us a copy, {bandwidth:.1f} GB/s ({origin})")


def local_costs(result, probe, origin):
    """The probe's local copy, else (a GPU) the HBM datasheet, a copy moving each byte twice, and no cost per kernel
    (the least it can be). NCCL's channels hold SMs while they run; gloo's threads take all their time from the CPU's
    computation."""
    cuda = result["config"]["device"] == "cuda"
    rank = ((result.get("hardware") or {}).get("ranks") or [{}])[0]
    sms = rank.get("multiprocessors")
    sm_share = (NCCL_CHANNELS / sms if sms else 0.0) if cuda else 1.0
    if isinstance(probe, dict) and "local_copy" in (probe.get("collectives") or {}):
        return probe_costs(probe, origin, sm_share)
    if not cuda:
        raise UsageError("a CPU run needs a probe (--probe, or its result's collective_probe): the per-copy cost "
                         "and copy bandwidth come from its local copy")
    sheet = datasheet(rank.get("gpu_name"))
    if sheet is None:
        raise UsageError(f"no HBM bandwidth known for {rank.get('gpu_name')!r}: give a --probe (its local copy)")
    return LocalCosts(0.0, sheet[1] / 2, sheet[1], sm_share, f"HBM {sheet[1]:g} GB/s ({rank.get('gpu_name')} datasheet)")


# ---------------------------------------------------------------------------------------- the model's structure

# The backward computes the gradients of the activations and of the weights: twice the forward's FLOPs, so at most
# 2/3 of the one-GPU step is backward for the gradient exchange to hide behind (a longer window, a higher ceiling).
BACKWARD_SHARE = 2 / 3


@dataclass(frozen=True)
class ModelFacts:
    param_numels: tuple  # model order; the backward reaches them in reverse, so DDP's buckets fill in reverse
    buffer_bytes: tuple  # (bytes, dtype) per buffer

    @property
    def param_bytes(self):
        return 4 * sum(self.param_numels)


@functools.lru_cache(maxsize=4)
def model_facts(model_name):
    """What the strategies move, from torchvision's model built on the meta device."""
    import torch
    import torchvision
    with torch.device("meta"):
        model = torchvision.models.get_model(model_name, weights=None, num_classes=1000)
    return ModelFacts(tuple(p.numel() for p in model.parameters()),
                      tuple((b.numel() * b.element_size(), str(b.dtype)) for b in model.buffers()))


def ddp_buckets(facts, cap_bytes, first_cap_bytes=None):
    """DDP's buckets after its rebuild: gradients in the order they became ready, a bucket closed at its cap (the
    first at 1 MiB only when bucket_cap_mb was left at DDP's default)."""
    buckets, current, size = [], [], 0
    for index in reversed(range(len(facts.param_numels))):
        current.append(index)
        size += 4 * facts.param_numels[index]
        if size >= (cap_bytes if buckets or first_cap_bytes is None else first_cap_bytes):
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def greedy_shards(numels, n, order):
    """Parameter elements per rank, and each parameter's rank, when each goes to the least loaded rank in turn."""
    totals, owner = [0] * n, {}
    for index in order:
        owner[index] = rank = totals.index(min(totals))
        totals[rank] += numels[index]
    return totals, owner


def oss_shards(facts, n):  # fairscale OSS.partition_parameters: model order
    return greedy_shards(facts.param_numels, n, range(len(facts.param_numels)))


def zero_shards(facts, n):  # ZeroRedundancyOptimizer._partition_parameters: largest first
    return greedy_shards(facts.param_numels, n, sorted(range(len(facts.param_numels)),
                                                       key=lambda i: -facts.param_numels[i]))


def sharded_ddp_reduces(facts, n, buffer_elements):
    """fairscale ShardedDataParallel's reduce calls: parameters by increasing size go into their owner's bucket while
    it has room; a bucket is reduced once all its gradients are in, every other gradient alone. [(indices, bytes)]."""
    _, owner = oss_shards(facts, n)
    capacity = min(buffer_elements, sum(facts.param_numels)) if n > 1 else 0
    fill, bucketed, singles = [0] * n, {rank: [] for rank in range(n)}, []
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
    """One-GPU runs of one workload: the mean over GPUs of each GPU's mean img/s, and their timed steps."""
    paths: list
    results: list

    @property
    def config(self):
        return self.results[0]["config"]

    @property
    def images_per_second(self):
        per_gpu = {}
        for result in self.results:
            per_gpu.setdefault(rank_devices(result)[0], []).append(result["throughput"]["images_per_second"])
        return statistics.fmean(statistics.fmean(values) for values in per_gpu.values())

    @property
    def step_ms(self):
        return 1e3 * self.config["batch_size_per_device"] / self.images_per_second


def figure_baseline(label, config, images_per_second):
    """A one-GPU step known only from its throughput (a published figure, a run at another batch)."""
    return Baseline([label], [{"config": config, "hardware": {"ranks": [{"gpu_uuid": label}]},
                               "throughput": {"images_per_second": images_per_second}}])


@dataclass(frozen=True)
class Workload:
    model: str
    optimizer: str
    optimizer_impl: str
    bucket_cap_mb: float = 25.0
    first_bucket_mb: float = None
    broadcast_buffers: bool = True
    gradient_as_bucket_view: bool = True
    compiled_ddp: str = "eager"
    fsdp_param_dtype: str = "fp32"
    sharded_reduce_buffer: int = 2 ** 23


def workload_of(config, strategy=None):
    """The workload a result's config describes; strategy: another than the result's runs its optimizer as
    oss_benchmark.py does."""
    strategy = strategy or config.get("strategy", "ddp")
    optimizer = config.get("optimizer", "sgd")
    impl = config.get("optimizer_impl") or ("fused" if config.get("device") == "cuda" and
                                            not config.get("grad_scaler") else "foreach")
    if strategy not in (config.get("strategy", "ddp"), "ddp"):
        impl = "foreach" if strategy == "zero1_overlap" else SUITE_IMPL.get(optimizer, impl)
    return Workload(
        config.get("model", "resnet50"), optimizer, impl, config.get("bucket_cap_mb") or 25.0,
        config.get("first_bucket_mb"), config.get("broadcast_buffers") is not False,
        bool(config.get("gradient_as_bucket_view", True)),
        "eager" if not config.get("compile") else config.get("compiled_ddp") or "ddp_optimizer",
        config.get("fsdp_param_dtype") or "fp32", config.get("sharded_reduce_buffer", 2 ** 23))


def optimizer_ms(workload, facts, local, share=1.0):
    key = (workload.optimizer, workload.optimizer_impl)
    return share * OPTIMIZER_BYTES.get(key, 8) * facts.param_bytes / (local.memory_gbps * 1e6)


# ---------------------------------------------------------------------------------------------- the strategies

@dataclass
class Context:
    workload: Workload
    baseline_workload: Workload
    facts: ModelFacts
    topology: Topology
    local: LocalCosts
    n: int
    window_ms: float  # the backward's duration on one GPU

    def comm(self, kind, size):
        return self.topology.collective_ms(kind, size, self.n)

    def exposed(self, collectives, last, after=()):
        """(exposed ms, overlapped ms) of collectives on one stream: the last gradient is ready only when the backward
        ends, so at least its collective (`last`, then `after`: issued once the backward ends) is exposed, and at
        least what does not fit in the backward; one backward graph (compiled without the DDP optimizer) exposes
        all. A lower bound on the exposed time, and on exposed + SM sharing (it grows with the exposed part)."""
        total = sum(self.comm(kind, size) for kind, size in (*collectives, *after))
        exposed = total if self.workload.compiled_ddp == "no_optimization" else max(
            total - self.window_ms, self.comm(*last) + sum(self.comm(kind, size) for kind, size in after))
        return exposed, total - exposed


def ddp_gradient_terms(context, zero_hook=False):
    """DDP's buckets all-reduced as they fill (zero1_overlap: each bucket's shards broadcast once the backward ends),
    the copies in and out of the buckets, and the SMs NCCL holds while it overlaps the backward."""
    facts, local, w = context.facts, context.local, context.workload
    buckets = [(bucket, 4 * sum(facts.param_numels[i] for i in bucket))
               for bucket in ddp_buckets(facts, w.bucket_cap_mb * 2 ** 20,
                                         w.first_bucket_mb and w.first_bucket_mb * 2 ** 20)]
    after = [("broadcast", size / context.n) for _, size in buckets for _ in range(context.n)] if zero_hook else []
    exposed, overlap = context.exposed([("all_reduce", size) for _, size in buckets], ("all_reduce", buckets[-1][1]),
                                       after)
    copies = local.copy_ms(facts.param_bytes, len(facts.param_numels))
    return {"all-reduce": exposed, "bucket copies": copies * (1 if w.gradient_as_bucket_view else 2),
            "SM sharing": local.sm_share * overlap}


def buffer_broadcast_terms(context, per_buffer=False):
    """DDP broadcasts rank 0's buffers before each forward, coalesced by dtype and copied back one by one;
    ShardedDDP broadcasts each buffer alone."""
    if not context.workload.broadcast_buffers:
        return {}
    buffers = context.facts.buffer_bytes
    if per_buffer:
        return {"buffer broadcast": sum(context.comm("broadcast", size) for size, _ in buffers)}
    groups = {}
    for size, dtype in buffers:
        groups[dtype] = groups.get(dtype, 0) + size
    return {"buffer broadcast": sum(context.comm("broadcast", size) for size in groups.values()),
            "buffer copies": context.local.copy_ms(2 * sum(groups.values()), len(buffers) + len(groups))}


def optimizer_terms(context, share):
    base = optimizer_ms(context.baseline_workload, context.facts, context.local)
    return {"optimizer": optimizer_ms(context.workload, context.facts, context.local, share) - base}


def parameter_broadcasts(context, shard_numels):
    return {"parameter broadcast": sum(context.comm("broadcast", 4 * numel) for numel in shard_numels)}


def terms_oss_sharded_ddp(context):
    """Each gradient reduced to its owner, alone when large, in its owner's bucket when small; OSS's broadcasts."""
    facts = context.facts
    reduces = sharded_ddp_reduces(facts, context.n, context.workload.sharded_reduce_buffer)
    last = next(size for group, size in reduces if 0 in group)  # the first parameter's gradient comes last
    exposed, overlap = context.exposed([("reduce", size) for _, size in reduces], ("reduce", last))
    return {"reduce": exposed, "bucket copies": context.local.copy_ms(facts.param_bytes, len(facts.param_numels)),
            "SM sharing": context.local.sm_share * overlap, **buffer_broadcast_terms(context, per_buffer=True),
            **parameter_broadcasts(context, oss_shards(facts, context.n)[0]), **optimizer_terms(context, 1 / context.n)}


def terms_fsdp(context, zero3):
    """FSDP2 with the whole model as one unit: parameters all-gathered before the forward (ZeRO-3: again before the
    backward), gradients reduce-scattered after it, nothing to overlap; copies in and out of the flat buffers."""
    facts, local, n = context.facts, context.local, context.n
    size = facts.param_bytes / (2 if context.workload.fsdp_param_dtype == "compute" else 1)
    gathers = 2 if zero3 else 1
    copies = gathers * (local.copy_ms(size / n) + local.copy_ms(size)) + local.copy_ms(facts.param_bytes) \
        + local.copy_ms(facts.param_bytes / n)
    return {"all-gather": gathers * context.comm("all_gather", size),
            "reduce-scatter": context.comm("reduce_scatter", facts.param_bytes), "bucket copies": copies,
            **optimizer_terms(context, 1 / n)}


def terms_ddp(c):
    return {**ddp_gradient_terms(c), **buffer_broadcast_terms(c), **optimizer_terms(c, 1.0)}


STRATEGY_TERMS = {
    "ddp": terms_ddp,
    "zero1": lambda c: {**terms_ddp(c), **parameter_broadcasts(c, zero_shards(c.facts, c.n)[0]),
                        **optimizer_terms(c, 1 / c.n)},
    "zero1_overlap": lambda c: {**ddp_gradient_terms(c, zero_hook=True), **buffer_broadcast_terms(c),
                                **optimizer_terms(c, 1 / c.n)},
    "oss_ddp": lambda c: {**terms_ddp(c), **parameter_broadcasts(c, oss_shards(c.facts, c.n)[0]),
                          **optimizer_terms(c, 1 / c.n)},
    "oss_sharded_ddp": terms_oss_sharded_ddp, "fsdp_zero2": lambda c: terms_fsdp(c, False),
    "fsdp_zero3": lambda c: terms_fsdp(c, True)}
COMMUNICATION = ("all-reduce", "reduce", "all-gather", "reduce-scatter", "parameter broadcast", "buffer broadcast")
OVERHEAD = ("bucket copies", "buffer copies", "SM sharing", "optimizer")


@dataclass
class Ceiling:
    strategy: str
    n: int
    step_ms: float
    efficiency: float
    images_per_second: float
    terms: dict


def ceiling(strategy, n, baseline, workload, topology, local):
    """The shortest step `strategy` can take on n ranks at this link, with each term (ms)."""
    facts = model_facts(workload.model)
    if baseline.config.get("cuda_graphs"):
        local = dataclasses.replace(local, kernel_us=0.0)  # a captured graph launches its kernels at no host cost
    context = Context(workload, workload_of(baseline.config), facts, topology, local, n,
                      BACKWARD_SHARE * baseline.step_ms)
    terms = {"one-GPU step": baseline.step_ms}
    if n > 1:
        terms.update(STRATEGY_TERMS[strategy](context))
    elif strategy != "ddp":
        terms.update(optimizer_terms(context, 1.0))
    step = sum(terms.values())
    efficiency = baseline.step_ms / step
    return Ceiling(strategy, n, step, efficiency, n * baseline.images_per_second * efficiency, terms)


def spread_text(losses):
    """How far below the ceiling measured runs fell (points): the median and the range, of how many."""
    if not losses:
        return "no published run to say how far below it runs fall"
    return (f"published runs fell {statistics.median(losses):.1f} points below (median; {min(losses):.1f} to "
            f"{max(losses):.1f} over {len(losses)} runs)")


# ------------------------------------------------------------------------------------- a run folder's ceilings

def ceilings(paths):
    """For report.py: per batch mode and GPU count of the DDP runs under paths, the measured efficiency against the
    one-GPU runs of the same mode and machine, and, where a run of that count carries a collective probe (the sweep's
    SWEEP_PROBE=1), the ceiling at the probed link and the points lost below it. [{mode, gpus, runs, measured,
    ceiling, lost, link}] (ceiling and lost None without a probe)."""
    runs = []
    for path in find_result_files(paths):
        document, problem = read_json(path)
        if problem is None and document_problem(document) is None and document.get("status") == "ok" and \
                document.get("strategy", "ddp") in ("ddp", "lightning_ddp"):
            runs.append(document)
    table = []
    for mode in ("per_device", "global"):
        mine = [r for r in runs if r["config"].get("batch_mode", "per_device") == mode]
        base = [r for r in mine if (r.get("world") or {}).get("world_size", 1) == 1]
        if not base:
            continue
        rate = statistics.fmean(r["throughput"]["images_per_second"] for r in base)
        for n in sorted({r["world"]["world_size"] for r in mine} - {1}):
            at_n = [r for r in mine if r["world"]["world_size"] == n]
            measured = statistics.fmean(r["throughput"]["images_per_second"] for r in at_n) / (n * rate)
            row = {"mode": mode, "gpus": n, "runs": len(at_n), "measured": 100 * measured, "ceiling": None,
                   "lost": None, "link": "no probe at this count (run the sweep with SWEEP_PROBE=1)"}
            probed = [r for r in at_n if r.get("collective_probe")]
            try:
                probe, config = probed[0]["collective_probe"], {**base[0]["config"], **at_n[0]["config"]}
                link = probe_link(probe, f"the {n}-rank run's collective_probe")
                baseline = figure_baseline("one GPU", config, rate)
                local = local_costs({**base[0], "config": config}, probe, f"the {n}-rank run's collective_probe")
                top = ceiling("ddp", n, baseline, workload_of(config, "ddp"), Topology(link, link, n, n), local)
                row.update(ceiling=100 * top.efficiency, lost=100 * (top.efficiency - measured), link=link.name)
            except IndexError:
                pass  # no probe at this count
            except UsageError as error:  # a probe that cannot be used: said in the row
                row["link"] = str(error)
            table.append(row)
    return table


def ceilings_text(paths):
    """ceilings(paths) as a Markdown table, or '' where no run probed its link (report.py's tables say the rest)."""
    rows = ceilings(paths)
    if all(r["ceiling"] is None for r in rows):
        return ""
    lines = [f"**Measured against {CEILING}** (efficiency: img/s over N x the one-GPU img/s)", "",
             "| batch | GPUs | runs | measured | ceiling | points lost below it | link |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        ceiling_cell = "-" if r["ceiling"] is None else f"{r['ceiling']:.1f} %"
        lost = "-" if r["lost"] is None else f"{r['lost']:.1f}"
        lines.append(f"| {'weak' if r['mode'] == 'per_device' else 'strong'} | {r['gpus']} | {r['runs']} | "
                     f"{r['measured']:.1f} % | {ceiling_cell} | {lost} | {r['link']} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------- validation

PUBLISHED = REPOSITORY / "docs" / "published" / "resnet50_multi_gpu.json"
# A published row's noise when neither it nor its table gives one (points): a single figure states no spread.
PUBLISHED_NOISE_PP = 1.0
ROW_NUMBERS = ("batch_per_gpu", "gpus", "nodes", "gpus_per_node", "link_gbytes_per_second",
               "one_gpu_images_per_second", "n_gpu_images_per_second")
WORKLOAD_DEFAULTS = {"model": "resnet50", "memory_format": "contiguous", "compile": False, "compile_mode": None,
                     "coordinate_descent_tuning": False, "cuda_graphs": False, "loss_scale": None,
                     "grad_scaler": False, "stem_conv": "torchvision", "max_pool_backward": "torchvision",
                     "batch_norm": "torchvision", "cudnn_benchmark": True, "tf32": True, "cudnn_deterministic": False,
                     "cpu_threads_per_rank": None}


def workload_key(result):
    """What one rank computes: the configuration and the compute-changing environment (TORCHINDUCTOR_*, but its
    cache folders, and TORCH_CUDNN_*) a one-GPU counterpart shares with a multi-rank run."""
    config = result["config"]
    keys = ("device", "image_size", "batch_size_per_device", "precision", *WORKLOAD_DEFAULTS)
    environment = ((result.get("software") or {}).get("environment") or {}).items()
    return tuple((key, WORKLOAD_DEFAULTS.get(key) if config.get(key) is None else config[key]) for key in keys) + \
        tuple(sorted((k, v) for k, v in environment if k.startswith(("TORCHINDUCTOR_", "TORCH_CUDNN_")) and
                     not k.startswith(("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE",
                                       "TORCHINDUCTOR_AUTOGRAD_CACHE"))))


def world_size(result):
    return (result.get("world") or {}).get("world_size", 1)


def can_start_from(result):
    return (world_size(result) == 1 and result["benchmark"] in ("ddp_resnet50.py", "lightning/ddp_resnet50.py")
            and result.get("status") == "ok" and bool(result.get("step_times_ms_per_rank")))


def relative(path):
    path = pathlib.Path(path).resolve()
    return str(path.relative_to(REPOSITORY)) if path.is_relative_to(REPOSITORY) else str(path)


def read_results(folders):
    """([(path, result)] of every valid result under the folders, [{name, reason}] of every other file)."""
    loaded, skipped = [], []
    for path in find_result_files(folders):
        document, problem = read_json(path)
        problem = problem or document_problem(document)
        if problem:
            skipped.append({"name": relative(path), "reason": problem})
        else:
            loaded.append((relative(path), document))
    return loaded, skipped


def cannot_bound(result):
    strategy = result.get("strategy")
    if result.get("status") != "ok" or not (result.get("throughput") or {}).get("images_per_second"):
        return f"status {result.get('status')!r}: no throughput"
    if strategy not in (*STRATEGIES, "lightning_ddp"):
        return f"strategy {strategy!r} is not modelled"
    if strategy.startswith("fsdp") and result["config"].get("fsdp_units", "model") != "model":
        return f"FSDP2 in {result['config']['fsdp_units']} units: only one unit (the whole model) is modelled"
    return None


def counterpart(path, result, same):
    """The one-GPU runs of the same workload on the run's own GPUs, else in its folder, else on its machine kind."""
    own, folder = set(rank_devices(result)), pathlib.PurePath(path).parent
    for accept in (lambda p, r: rank_devices(r)[0] in own, lambda p, r: pathlib.PurePath(p).parent == folder,
                   lambda p, r: machine_kind(p) == machine_kind(path)):
        chosen = [(p, r) for p, r in same if accept(p, r)]
        if chosen:
            return Baseline([p for p, _ in chosen], [r for _, r in chosen])
    return None


def machine_kind(path):
    """A campaign folder's machine kind: nvidia-h200-x2-2026-11-30b -> nvidia-h200-x2."""
    return re.sub(r"-\d{4}-\d{2}-\d{2}[a-z]?$", "", pathlib.PurePath(path).parent.name)


def bound_run(path, result, baseline, same):
    """A multi-rank run against its ceiling: the link its own probe measured, else NVLink 4 (the committed runs')."""
    n, strategy = world_size(result), result["strategy"].replace("lightning_", "")
    probe = result.get("collective_probe")
    link = probe_link(probe, f"{path}'s collective_probe") if probe else preset_link("nvlink4")
    local = local_costs(baseline.results[0], probe, f"{path}'s collective_probe")
    top = ceiling(strategy, n, baseline, workload_of(result["config"], strategy),
                  Topology(link, preset_link("ib-ndr400")), local)
    measured = result["throughput"]["images_per_second"] / (n * baseline.images_per_second)
    rates = [r["throughput"]["images_per_second"] for _, r in same]
    throughput = result["throughput"]
    # noise, relative: twice the robust standard deviation (1.4826 MADs) of every one-GPU run of the workload on
    # the machine kind (run to run, GPU to GPU), and the run's own step-to-step spread (rank 0's MAD)
    middle = statistics.median(rates)
    relative_noise = 2 * 1.4826 * statistics.median(abs(r - middle) for r in rates) / middle + (
        throughput.get("rank0_mad_images_per_second") or 0) / (throughput.get("rank0_median_images_per_second") or 1)
    return {"name": path, "strategy": result["strategy"], "gpus": n,
            "nodes": (result.get("world") or {}).get("num_nodes", 1), "one_gpu_runs": baseline.paths,
            "measured": round(100 * measured, 3), "ceiling": round(100 * top.efficiency, 3),
            "lost": round(100 * (top.efficiency - measured), 3), "noise": round(100 * measured * relative_noise, 3),
            "terms_ms": {k: round(v, 4) for k, v in top.terms.items()}}


def validate_runs(folders):
    """Every multi-rank result under the folders against its ceiling from its one-GPU counterpart."""
    loaded, skipped = read_results(folders)
    workloads, rows = {}, []
    for path, result in loaded:
        if can_start_from(result):
            workloads.setdefault(workload_key(result), []).append((path, result))
    for path, result in loaded:
        if world_size(result) < 2:
            continue
        reason = cannot_bound(result)
        same = workloads.get(workload_key(result), [])
        baseline = None if reason else counterpart(path, result, same)
        try:
            if baseline is None:
                raise UsageError(reason or "no one-GPU run of this workload on its machine kind")
            rows.append(bound_run(path, result, baseline, same))
        except UsageError as error:  # a CPU run without a probe, a probe that cannot be used
            skipped.append({"name": path, "reason": str(error)})
    return rows, skipped


def published_problem(row):
    """Why a published row cannot be bounded honestly, or None."""
    if not isinstance(row, dict):
        return "not a JSON object"
    bad = [key for key in ROW_NUMBERS if not (is_number(row.get(key)) and row[key] > 0)]
    bad += [key for key in ("source", "link") if not isinstance(row.get(key), str)]
    if bad or row["gpus"] < 2:
        return f"{', '.join(bad) or 'gpus'}: {'not given or not positive' if bad else 'fewer than 2 GPUs'}"
    if "parameter server" in str(row.get("implementation", "")).replace("_", " "):
        return "parameter servers, not an all-reduce: the model has no term for them"
    if datasheet(row.get("gpu")) is None:
        return f"no datasheet figures for the {row.get('gpu')}"
    return None


def published_ceiling(row):
    """A published row's ceiling, as PyTorch's DDP with its defaults would run it: the step from its one-GPU figure,
    copies from the GPU's datasheet, the link's bus bandwidth its published line rate (one port per node between
    nodes)."""
    sms, memory = datasheet(row["gpu"])
    config = {"device": "cuda", "model": "resnet50", "batch_size_per_device": row["batch_per_gpu"], "optimizer": "sgd",
              "optimizer_impl": "foreach", "bucket_cap_mb": 25.0, "first_bucket_mb": 1.0,
              "gradient_as_bucket_view": False}
    baseline = figure_baseline(row["source"], config, row["one_gpu_images_per_second"])
    bandwidth, hop = row["link_gbytes_per_second"], LINK_PRESETS["pcie4" if "PCIe" in row["link"] else "nvlink4"][1]
    intra = make_link(row["link"], row.get("link_basis", ""), bandwidth, hop)
    network = make_link(row["link"], row.get("link_basis", ""), bandwidth, LINK_PRESETS["ib-ndr400"][1])
    local = LocalCosts(0.0, memory / 2, memory, NCCL_CHANNELS / sms, "datasheet")
    return ceiling("ddp", row["gpus"], baseline, workload_of(config), Topology(intra, network, row["gpus_per_node"],
                                                                             1), local)


def validate_published(path):
    """Every row of a published table (docs/published/README.md's format) against its ceiling, or skipped."""
    document = load_json(path, "table of published measurements")
    rows = document.get("rows") if isinstance(document, dict) else None
    if not isinstance(rows, list):
        raise UsageError(f"{path}: no rows of published measurements (a JSON object with a list 'rows')")
    noise = document.get("noise_pp", PUBLISHED_NOISE_PP)
    bounded, skipped = [], []
    for index, row in enumerate(rows, 1):
        name = f"{pathlib.PurePath(path).name} row {index}"
        problem = published_problem(row)
        if problem:
            skipped.append({"name": name, "reason": problem})
            continue
        name += f" ({row.get('organisation', '?')}, {row['gpu']}, {row.get('precision', '?')}, {row['gpus']} GPUs)"
        top = published_ceiling(row)
        measured = row["n_gpu_images_per_second"] / (row["gpus"] * row["one_gpu_images_per_second"])
        bounded.append({"name": name, "source": row["source"], "gpus": row["gpus"], "nodes": row["nodes"],
                        "measured": round(100 * measured, 3), "ceiling": round(100 * top.efficiency, 3),
                        "lost": round(100 * (top.efficiency - measured), 3), "noise": row.get("noise_pp", noise),
                        "terms_ms": {k: round(v, 4) for k, v in top.terms.items()}})
    return bounded, skipped


def quantiles(values):
    """(min, lower quartile, median, upper quartile, max)."""
    values = sorted(values)
    if len(values) == 1:
        return (values[0],) * 5
    return (values[0], *statistics.quantiles(values, n=4, method="inclusive"), values[-1])


def summarise(rows):
    """Rows, the rows above the ceiling by more than their noise (named), and the points lost below it."""
    return {"rows": len(rows), "gpus": sorted({r["gpus"] for r in rows}),
            "above_beyond_noise": [r["name"] for r in rows if -r["lost"] > r["noise"]],
            "points_lost": dict(zip(("min", "q1", "median", "q3", "max"), (round(q, 2) for q in
                                                                       quantiles([r["lost"] for r in rows]))))}


def validate(folders, published):
    """The committed runs under folders and each published table against the ceiling, with the subsets' summaries."""
    runs, skipped = validate_runs(folders) if folders else ([], [])
    subsets, tables = {}, {}
    if runs:
        subsets["this project's runs (in sample)"] = summarise(runs)
    for path in published:
        rows, table_skipped = validate_published(path)
        tables[relative(path)] = {"rows": rows, "skipped": table_skipped}
        for label, chosen in (("one node", [r for r in rows if r["nodes"] == 1]),
                              ("across nodes", [r for r in rows if r["nodes"] > 1]), ("every row", rows)):
            if chosen:
                subsets[f"{pathlib.PurePath(path).name}, {label}"] = summarise(chosen)
    if not subsets:
        raise UsageError(f"--validate: nothing to check: no multi-rank run with a one-GPU counterpart in "
                         f"{', '.join(map(str, folders)) or 'no folder'} ({len(skipped)} files skipped) and no "
                         f"usable published row")
    return {"what": f"each row against {CEILING}", "units": "efficiency %, points lost = ceiling - measured",
            "subsets": subsets, "runs": runs, "skipped": skipped, "published": tables}


@functools.lru_cache(maxsize=1)
def published_losses():
    """{one node: [points lost], across nodes: [...]} of the shipped table's rows: the out-of-sample spread."""
    rows, _ = validate_published(PUBLISHED)
    return {True: [r["lost"] for r in rows if r["nodes"] == 1], False: [r["lost"] for r in rows if r["nodes"] > 1]}


def validation_table(validation):
    lines = ["| subset | rows | GPUs | above the ceiling beyond noise | points lost below it: min | 25 % | median | "
             "75 % | max |", "|---|---|---|---|---|---|---|---|---|"]
    for name, s in validation["subsets"].items():
        lost = s["points_lost"]
        lines.append(f"| {name} | {s['rows']} | {s['gpus'][0]}-{s['gpus'][-1]} | {len(s['above_beyond_noise'])} | "
                     f"{lost['min']:.1f} | {lost['q1']:.1f} | {lost['median']:.1f} | {lost['q3']:.1f} | "
                     f"{lost['max']:.1f} |")
    above = sorted({name for s in validation["subsets"].values() for name in s["above_beyond_noise"]})
    return "\n".join(lines) + "\n\nAbove the ceiling beyond noise: " + ("; ".join(above) or "none") + "\n"


# ------------------------------------------------------------------------------------ tables and docs/scaling.md

def one_gpu_baseline(paths):
    """The one-GPU runs of one workload a ceiling starts from, or one line saying why a file is none."""
    results = []
    for path in paths:
        result = load_json(path, "result")
        problem = document_problem(result)
        if problem is None and not can_start_from(result):
            problem = (f"a {world_size(result)}-rank {result.get('benchmark')} run, status {result.get('status')!r}: "
                       f"the ceiling starts from one-GPU runs of ddp_resnet50.py or its twin with status ok")
        if problem:
            raise UsageError(f"{path}: {problem}")
        results.append(result)
    if len({workload_key(r) for r in results}) > 1:
        raise UsageError("the one-GPU results ran different workloads: give runs of one workload")
    return Baseline([relative(p) for p in paths], results)


def share(c, names):
    return ", ".join(f"{name} {100 * c.terms[name] / c.step_ms:.2f}" for name in names
                     if abs(c.terms.get(name, 0.0)) >= 5e-4) or "-"


def ceiling_table(tops, per_node):
    """Each ceiling with how far below it published runs fell (one node or across nodes) and its terms' shares."""
    lines = ["| strategy | GPUs | ceiling | img/s at most | published runs fell below it, points: median (range, "
             "rows) | exposed communication, % of the step | added kernels and optimizer, % |", "|---|---|---|---|---|---|---|"]
    for c in tops:
        losses = published_losses()[c.n <= per_node]
        spread = "- (one GPU: measured)" if c.n == 1 else (
            f"{statistics.median(losses):.1f} ({min(losses):.1f} to {max(losses):.1f}, {len(losses)})")
        lines.append(f"| {c.strategy} | {c.n} | {100 * c.efficiency:.1f} % | {c.images_per_second:,.0f} | {spread} | "
                     f"{share(c, COMMUNICATION)} | {share(c, OVERHEAD)} |")
    return "\n".join(lines)


DEFAULT_PAIR = ("results/nvidia-h200-x2-2026-11-30b/s4-native-1gpu-bf16-256-gpu0.json",
                "results/nvidia-h200-x2-2026-11-30b/s4-native-1gpu-bf16-256-gpu1.json")
ANSWER_LINKS = (("nvlink4", "ib-ndr400", 8), ("nvlink4", "eth100", 1), ("pcie4", "eth100", 1))


def default_tops(strategies, counts, intra="nvlink4", inter="ib-ndr400", nics=8):
    baseline = one_gpu_baseline([REPOSITORY / p for p in DEFAULT_PAIR])
    topology, local = Topology(preset_link(intra), preset_link(inter), 8, nics), local_costs(baseline.results[0],
                                                                                             None, "")
    return [ceiling(s, n, baseline, workload_of(baseline.config, s), topology, local) for s in strategies
            for n in counts]


def section_answer(_=None):
    lines = ["| nodes of 8 GPUs on | joined by (NICs per node) | 8 GPUs | 64 GPUs | 512 GPUs |", "|---|---|---|---|---|"]
    for intra, inter, nics in ANSWER_LINKS:
        cells = [f"{100 * c.efficiency:.1f} %" for c in default_tops(["ddp"], [8, 64, 512], intra, inter, nics)]
        lines.append(f"| {intra} | {inter} ({nics}) | " + " | ".join(cells) + " |")
    return "\n".join(lines + ["", f"Published runs fell below their ceiling, one node: "
                              f"{spread_text(published_losses()[True])}; across nodes: "
                              f"{spread_text(published_losses()[False])}."])


def section_strategies(_=None):
    command = f"python scaling_model.py {' '.join(DEFAULT_PAIR)} --gpus 8,64,512 --link nvlink4"
    return f"`{command}`:\n\n" + ceiling_table(default_tops(STRATEGIES, [8, 64, 512]), 8)


def section_validation(_=None):
    v = validate([REPOSITORY / "results"], [PUBLISHED])
    lines = [f"`python scaling_model.py --validate results --published {relative(PUBLISHED)}`:", "",
             validation_table(v), "| source | rows | points lost: median | range |", "|---|---|---|---|"]
    for table in v["published"].values():
        by_source = {}
        for row in table["rows"]:
            by_source.setdefault(row["source"], []).append(row["lost"])
        lines += [f"| <{source}> | {len(lost)} | {statistics.median(lost):.1f} | {min(lost):.1f} to {max(lost):.1f} |"
                  for source, lost in by_source.items()]
        reasons = {}
        for skipped in table["skipped"]:
            reasons.setdefault(skipped["reason"], []).append(skipped["name"].rsplit(" ", 1)[1])
        lines.append("\nSkipped: " + ("; ".join(f"rows {', '.join(rows)}: {reason}" for reason, rows in reasons.items())
                                       or "none") + ".")
    return "\n".join(lines)


SECTIONS = {"scaling-answer": section_answer, "scaling-strategies": section_strategies,
            "scaling-validation": section_validation}
