"""The ceiling on data-parallel scaling: the efficiency at N GPUs that communication and data parallelism's own work
at a link leave of a measured one-GPU step (docs/scaling.md). Each term is a lower bound of its cost, so every cost
left out (the input pipeline, stragglers, the framework's host work, the power cap) only lowers the measured figure.
scaling_model.py is its command line; `ceilings_text` is report.py's view of a run folder.
"""
import functools
import math
import pathlib
import re
import statistics
from collections import namedtuple
from dataclasses import dataclass

from resnet50_ddp_benchmarks.analysis import (REPOSITORY, UsageError, document_problem, find_result_files, is_number,
                                              load_json, rank_devices, read_json)

STRATEGIES = ("ddp", "oss_ddp", "oss_sharded_ddp", "zero1", "zero1_overlap", "fsdp_zero2", "fsdp_zero3")
CEILING = "the ceiling from communication and data parallelism's own work at this link"
# NCCL's fixed start-up latency of a Simple-protocol ring or tree (us): nccl src/graph/tuning.cc baseLat, as in
# PyTorch's torch/_inductor/comm_analysis.py; the rest of a link's latency grows with the ring's steps.
NCCL_BASE_US = 8.4
NCCL_CHANNELS = 16  # one SM each, on Hopper with NVLink: comm_analysis.py's _GPU_NCHANNELS
# Bus bandwidth (nccl-tests' busbw, GB/s), NCCL's Simple-protocol per-step latency (us, tuning.cc hwLat) and source.
LINK_PRESETS = {
    "nvlink4": (370.0, 3.4, "NVLink 4 (H100/H200 SXM): 370 GB/s, Hopper's NVLink bus bandwidth in NCCL's topology "
                            "model (nccl src/graph/topo.h); nccl-tests all_reduce_perf on 8 x H100: about 370 GB/s"),
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
# The backward computes the gradients of the activations and of the weights: twice the forward's FLOPs, so at most
# 2/3 of the one-GPU step is backward for the gradient exchange to hide behind (a longer window, a higher ceiling).
BACKWARD_SHARE = 2 / 3

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
    bandwidth, hop_us, source = LINK_PRESETS[name]
    return make_link(name, source, bandwidth, hop_us)


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
    """Nodes of `per_node` GPUs on `intra`, joined by `inter` through `nics` NICs each: the slower of the two
    bandwidths, NCCL's ring latency or its tree's (a chain in each node, a binary tree between nodes)."""
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


# ------------------------------------------------------------------------------------------- device-local costs

@dataclass(frozen=True)
class LocalCosts:
    """One more small kernel (us), a copy (GB/s), the optimizer's traffic (HBM GB/s), the SMs NCCL takes (share)."""
    kernel_us: float
    copy_gbps: float
    memory_gbps: float
    sm_share: float

    def copy_ms(self, size, kernels=1):
        return (kernels * self.kernel_us + size / (self.copy_gbps * 1e3)) / 1e3


def datasheet(gpu_name):
    """(SMs, HBM GB/s) of a GPU by its name, or None."""
    return next((figures for key, figures in GPUS.items() if key in str(gpu_name or "").replace("-", " ")), None)


def local_costs(result, probe, origin):
    """The probe's local copy, else (a GPU) the HBM datasheet, a copy moving each byte twice, and no cost per kernel
    (the least it can be). NCCL's channels hold SMs while they run; gloo's threads take all their time from the
    CPU's computation."""
    rank = ((result.get("hardware") or {}).get("ranks") or [{}])[0]
    cuda, sms = result["config"]["device"] == "cuda", rank.get("multiprocessors")
    sm_share = (NCCL_CHANNELS / sms if sms else 0.0) if cuda else 1.0
    if isinstance(probe, dict) and "local_copy" in (probe.get("collectives") or {}):
        bandwidth, latency = probe_fit(probe, "local_copy", origin)
        return LocalCosts(latency, bandwidth, 2 * bandwidth, sm_share)
    if not cuda:
        raise UsageError("a CPU run needs a probe (--probe, or its result's collective_probe): its local copy's cost")
    sheet = datasheet(rank.get("gpu_name"))
    if sheet is None:
        raise UsageError(f"no HBM bandwidth known for {rank.get('gpu_name')!r}: give a --probe (its local copy)")
    return LocalCosts(0.0, sheet[1] / 2, sheet[1], sm_share)


# ---------------------------------------------------------------------------------------- the model's structure

@functools.lru_cache(maxsize=4)
def model_facts(model_name):
    """(parameter sizes in model order, (bytes, dtype) per buffer) from torchvision's model on the meta device."""
    import torch
    import torchvision
    with torch.device("meta"):
        model = torchvision.models.get_model(model_name, weights=None, num_classes=1000)
    return (tuple(p.numel() for p in model.parameters()),
            tuple((b.numel() * b.element_size(), str(b.dtype)) for b in model.buffers()))


def ddp_buckets(numels, cap_bytes):
    """DDP's buckets (bytes), filled in the order the backward reaches the gradients (the model's, reversed)."""
    buckets, size = [], 0
    for index in reversed(range(len(numels))):
        size += 4 * numels[index]
        if size >= cap_bytes:
            buckets.append(size)
            size = 0
    return buckets + ([size] if size else [])


def greedy_shards(numels, order, n):
    """Parameter elements per rank, and each parameter's rank, when each goes to the least loaded rank in turn."""
    totals, owner = [0] * n, {}
    for index in order:
        owner[index] = rank = totals.index(min(totals))
        totals[rank] += numels[index]
    return totals, owner


def oss_shards(numels, n):  # fairscale OSS.partition_parameters: model order
    return greedy_shards(numels, range(len(numels)), n)


def sharded_ddp_reduces(numels, n):
    """fairscale ShardedDataParallel's reduce calls, [(bytes, holds the first parameter, the last one ready)]:
    parameters by increasing size go into their owner's bucket (its default 2**23 elements) while it has room."""
    _, owner = oss_shards(numels, n)
    capacity = min(2 ** 23, sum(numels))
    fill, bucketed, singles = [0] * n, [[] for _ in range(n)], []
    for index in sorted(range(len(numels)), key=lambda i: numels[i]):
        if fill[owner[index]] + numels[index] < capacity:
            fill[owner[index]] += numels[index]
            bucketed[owner[index]].append(index)
        else:
            singles.append([index])
    return [(4 * sum(numels[i] for i in group), 0 in group) for group in [*filter(None, bucketed), *singles]]


# -------------------------------------------------------------------------------------------- one-GPU baseline

@dataclass
class Baseline:
    """One-GPU runs of one workload: the mean over GPUs of each GPU's mean img/s."""
    paths: list
    results: list

    @property
    def images_per_second(self):
        per_gpu = {}
        for result in self.results:
            per_gpu.setdefault(rank_devices(result)[0], []).append(result["throughput"]["images_per_second"])
        return statistics.fmean(statistics.fmean(values) for values in per_gpu.values())

    @property
    def step_ms(self):
        return 1e3 * self.results[0]["config"]["batch_size_per_device"] / self.images_per_second


def figure_baseline(label, config, images_per_second):
    """A one-GPU step known only from its throughput (a published figure, a run at another batch)."""
    return Baseline([label], [{"config": config, "hardware": {"ranks": [{"gpu_uuid": label}]},
                               "throughput": {"images_per_second": images_per_second}}])


# one_graph: compiled without the DDP optimizer (every gradient ready at the backward's end); optimizer: (name, impl)
Workload = namedtuple("Workload", "model optimizer bucket_cap_mb broadcast_buffers gradient_as_bucket_view one_graph "
                                  "fsdp_param_bytes")


def workload_of(config, strategy=None):
    """A result's workload; another strategy than the result's runs its optimizer as oss_benchmark.py does."""
    optimizer = config.get("optimizer", "sgd")
    impl = config.get("optimizer_impl") or ("fused" if config.get("device") == "cuda" and
                                            not config.get("grad_scaler") else "foreach")
    if (strategy or "ddp") not in (config.get("strategy", "ddp"), "ddp"):
        impl = "foreach" if strategy == "zero1_overlap" else SUITE_IMPL.get(optimizer, impl)
    return Workload(config.get("model", "resnet50"), (optimizer, impl), config.get("bucket_cap_mb") or 25.0,
                    config.get("broadcast_buffers") is not False,
                    bool(config.get("gradient_as_bucket_view", True)),
                    bool(config.get("compile")) and config.get("compiled_ddp") == "no_optimization",
                    0.5 if config.get("fsdp_param_dtype") == "compute" else 1.0)


# ---------------------------------------------------------------------------------------------- the strategies

@dataclass
class Context:
    workload: Workload
    baseline_workload: Workload
    topology: Topology
    local: LocalCosts
    n: int
    window_ms: float  # the backward's longest duration on one GPU
    numels: tuple

    def comm(self, kind, size):
        return self.topology.collective_ms(kind, size, self.n)

    def exposed(self, kind, sizes, last, after=()):
        """(exposed, overlapped ms) of collectives on one stream, at least: the collective of the last gradient ready
        (size `last`, then the `after` ones) and what the backward cannot hold (so exposed + SM sharing, too)."""
        total = sum(self.comm(kind, size) for size in sizes) + sum(self.comm(k, size) for k, size in after)
        tail = self.comm(kind, last) + sum(self.comm(k, size) for k, size in after)
        exposed = total if self.workload.one_graph else max(total - self.window_ms, tail)
        return exposed, total - exposed

    def optimizer(self, share):
        """The optimizer's change: a shard of it, another implementation than the one-GPU run's."""
        bytes_moved = [OPTIMIZER_BYTES.get(w.optimizer, 8) * 4 * sum(self.numels) for w in (self.workload,
                                                                                          self.baseline_workload)]
        return {"optimizer": (share * bytes_moved[0] - bytes_moved[1]) / (self.local.memory_gbps * 1e6)}


def ddp_gradient_terms(c, zero_hook=False):
    """DDP's buckets all-reduced as they fill (zero1_overlap: then each bucket's shards broadcast by every rank), the
    copies into the buckets (and out of them without bucket views), the SMs NCCL holds while it overlaps."""
    w = c.workload
    buckets = ddp_buckets(c.numels, w.bucket_cap_mb * 2 ** 20)
    after = [("broadcast", size / c.n) for size in buckets for _ in range(c.n)] if zero_hook else []
    exposed, overlap = c.exposed("all_reduce", buckets, buckets[-1], after)
    copies = c.local.copy_ms(4 * sum(c.numels), len(c.numels))
    return {"all-reduce": exposed, "bucket copies": copies * (1 if w.gradient_as_bucket_view else 2),
            "SM sharing": c.local.sm_share * overlap}


def buffer_broadcast_terms(c, per_buffer=False):
    """Rank 0's buffers before each forward: DDP's coalesced by dtype, copied back one by one; ShardedDDP's alone."""
    buffers = model_facts(c.workload.model)[1]
    if not c.workload.broadcast_buffers:
        return {}
    if per_buffer:
        return {"buffer broadcast": sum(c.comm("broadcast", size) for size, _ in buffers)}
    groups = {}
    for size, dtype in buffers:
        groups[dtype] = groups.get(dtype, 0) + size
    return {"buffer broadcast": sum(c.comm("broadcast", size) for size in groups.values()),
            "buffer copies": c.local.copy_ms(2 * sum(groups.values()), len(buffers) + len(groups))}


def parameter_broadcasts(c, shards):
    return {"parameter broadcast": sum(c.comm("broadcast", 4 * numel) for numel in shards(c.numels, c.n)[0])}


def terms_oss_sharded_ddp(c):
    """Each gradient reduced to its owner, alone when large, in its owner's bucket when small; OSS's broadcasts."""
    reduces = sharded_ddp_reduces(c.numels, c.n)
    exposed, overlap = c.exposed("reduce", [size for size, _ in reduces], next(s for s, last in reduces if last))
    return {"reduce": exposed, "bucket copies": c.local.copy_ms(4 * sum(c.numels), len(c.numels)),
            "SM sharing": c.local.sm_share * overlap, **buffer_broadcast_terms(c, per_buffer=True),
            **parameter_broadcasts(c, oss_shards), **c.optimizer(1 / c.n)}


def terms_fsdp(c, zero3):
    """FSDP2, the model one unit: all-gather (ZeRO-3: twice), reduce-scatter, none overlapped; flat-buffer copies."""
    full = 4 * sum(c.numels)
    size, gathers = full * c.workload.fsdp_param_bytes, 2 if zero3 else 1
    copies = gathers * (c.local.copy_ms(size / c.n) + c.local.copy_ms(size)) + c.local.copy_ms(full) + \
        c.local.copy_ms(full / c.n)
    return {"all-gather": gathers * c.comm("all_gather", size), "reduce-scatter": c.comm("reduce_scatter", full),
            "bucket copies": copies, **c.optimizer(1 / c.n)}


def terms_ddp(c):
    return {**ddp_gradient_terms(c), **buffer_broadcast_terms(c), **c.optimizer(1.0)}


STRATEGY_TERMS = {
    "ddp": terms_ddp,
    # ZeroRedundancyOptimizer._partition_parameters: largest first
    "zero1": lambda c: {**terms_ddp(c), **parameter_broadcasts(c, lambda numels, n: greedy_shards(
        numels, sorted(range(len(numels)), key=lambda i: -numels[i]), n)), **c.optimizer(1 / c.n)},
    "zero1_overlap": lambda c: {**ddp_gradient_terms(c, zero_hook=True), **buffer_broadcast_terms(c),
                                **c.optimizer(1 / c.n)},
    "oss_ddp": lambda c: {**terms_ddp(c), **parameter_broadcasts(c, oss_shards), **c.optimizer(1 / c.n)},
    "oss_sharded_ddp": terms_oss_sharded_ddp, "fsdp_zero2": lambda c: terms_fsdp(c, False),
    "fsdp_zero3": lambda c: terms_fsdp(c, True)}
COMMUNICATION = ("all-reduce", "reduce", "all-gather", "reduce-scatter", "parameter broadcast", "buffer broadcast")
OVERHEAD = ("bucket copies", "buffer copies", "SM sharing", "optimizer")


Ceiling = namedtuple("Ceiling", "strategy n step_ms efficiency terms")


def ceiling(strategy, n, baseline, workload, topology, local):
    """The shortest step `strategy` can take on n ranks at this link, with each term (ms)."""
    context = Context(workload, workload_of(baseline.results[0]["config"]), topology, local, n,
                      BACKWARD_SHARE * baseline.step_ms, model_facts(workload.model)[0])
    terms = {"one-GPU step": baseline.step_ms}
    if n > 1 or strategy != "ddp":
        terms.update(STRATEGY_TERMS[strategy](context) if n > 1 else context.optimizer(1.0))
    step = sum(terms.values())
    return Ceiling(strategy, n, step, baseline.step_ms / step, terms)


# ------------------------------------------------------------------------------------- a run folder's ceilings

def ceilings(paths):
    """report.py's view, per batch mode and GPU count of the DDP runs under paths: the efficiency against the mode's
    one-GPU runs and, where a run of that count probed its link (SWEEP_PROBE=1), the ceiling and the points lost."""
    runs = [document for document, problem in map(read_json, find_result_files(paths)) if problem is None and
            document_problem(document) is None and document.get("status") == "ok" and
            document.get("strategy", "ddp") in ("ddp", "lightning_ddp")]
    table = []
    for mode in ("per_device", "global"):
        mine = [r for r in runs if r["config"].get("batch_mode", "per_device") == mode]
        base = [r for r in mine if world_size(r) == 1]
        rate = base and statistics.fmean(r["throughput"]["images_per_second"] for r in base)
        for n in sorted({world_size(r) for r in mine} - {1}) if base else ():
            at_n = [r for r in mine if world_size(r) == n]
            measured = statistics.fmean(r["throughput"]["images_per_second"] for r in at_n) / (n * rate)
            row = {"mode": mode, "gpus": n, "runs": len(at_n), "measured": 100 * measured, "ceiling": None,
                   "lost": None, "link": "no probe at this count (run the sweep with SWEEP_PROBE=1)"}
            table.append(row)
            probe, origin = next((r["collective_probe"] for r in at_n if r.get("collective_probe")), None), \
                f"the {n}-rank run's collective_probe"
            if probe is None:
                continue
            try:
                config, link = {**base[0]["config"], **at_n[0]["config"]}, probe_link(probe, origin)
                top = ceiling("ddp", n, figure_baseline("one GPU", config, rate), workload_of(config, "ddp"),
                              Topology(link, link, n, n), local_costs({**base[0], "config": config}, probe, origin))
                row.update(ceiling=100 * top.efficiency, lost=100 * (top.efficiency - measured), link=link.name)
            except UsageError as error:  # a probe that cannot be used: said in the row
                row["link"] = str(error)
    return table


def ceilings_text(paths):
    """ceilings(paths) as a Markdown table, or '' where no run probed its link (report.py's tables say the rest)."""
    rows = ceilings(paths)
    if all(r["ceiling"] is None for r in rows):
        return ""
    lines = [f"**Measured against {CEILING}** (efficiency: img/s over N x the one-GPU img/s)", "",
             "| batch | GPUs | runs | measured | ceiling | points lost below it | link |", "|" + "---|" * 7]
    lines += [f"| {'weak' if r['mode'] == 'per_device' else 'strong'} | {r['gpus']} | {r['runs']} | "
              f"{r['measured']:.1f} % | {'-' if r['ceiling'] is None else format(r['ceiling'], '.1f') + ' %'} | "
              f"{'-' if r['lost'] is None else format(r['lost'], '.1f')} | {r['link']} |" for r in rows]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------- validation

PUBLISHED = REPOSITORY / "docs" / "published" / "resnet50_multi_gpu.json"
PUBLISHED_NOISE_PP = 1.0  # a published row's noise when neither it nor its table gives one: a figure states none
ROW_NUMBERS = ("batch_per_gpu", "gpus", "nodes", "gpus_per_node", "link_gbytes_per_second",
               "one_gpu_images_per_second", "n_gpu_images_per_second")
WORKLOAD_DEFAULTS = {"model": "resnet50", "memory_format": "contiguous", "compile": False, "compile_mode": None,
                     "coordinate_descent_tuning": False, "cuda_graphs": False, "loss_scale": None,
                     "grad_scaler": False, "stem_conv": "torchvision", "max_pool_backward": "torchvision",
                     "batch_norm": "torchvision", "cudnn_benchmark": True, "tf32": True, "cudnn_deterministic": False,
                     "cpu_threads_per_rank": None}


def workload_key(result):
    """What one rank computes: the configuration (an unset option and its default alike) and the environment that
    changes the computation (TORCHINDUCTOR_* but its caches, TORCH_CUDNN_*)."""
    config = result["config"]
    keys = ("device", "image_size", "batch_size_per_device", "precision", *WORKLOAD_DEFAULTS)
    environment = ((result.get("software") or {}).get("environment") or {}).items()
    return tuple((key, WORKLOAD_DEFAULTS.get(key) if config.get(key) is None else config[key]) for key in keys) + \
        tuple(sorted((k, v) for k, v in environment if re.match(r"TORCH_CUDNN_|TORCHINDUCTOR_(?!CACHE_DIR|FX_GRAPH_"
                                                                  r"CACHE|AUTOGRAD_CACHE)", k)))


def world_size(result):
    return (result.get("world") or {}).get("world_size", 1)


def can_start_from(result):
    return (world_size(result) == 1 and result["benchmark"] in ("ddp_resnet50.py", "lightning/ddp_resnet50.py")
            and result.get("status") == "ok")


def relative(path):
    path = pathlib.Path(path).resolve()
    return str(path.relative_to(REPOSITORY)) if path.is_relative_to(REPOSITORY) else str(path)


def cannot_bound(path, result, same):
    """(the workload's one-GPU runs on the run's GPUs, else folder, else machine kind; or why there are none)."""
    strategy, config = result.get("strategy"), result["config"]
    if result.get("status") != "ok" or not (result.get("throughput") or {}).get("images_per_second"):
        return None, f"status {result.get('status')!r}: no throughput"
    if strategy not in (*STRATEGIES, "lightning_ddp"):
        return None, f"strategy {strategy!r} is not modelled"
    if strategy.startswith("fsdp") and config.get("fsdp_units", "model") != "model":
        return None, f"FSDP2 in {config['fsdp_units']} units: only one unit (the whole model) is modelled"
    own, folder = set(rank_devices(result)), pathlib.PurePath(path).parent
    kind = lambda p: re.sub(r"-\d{4}-\d{2}-\d{2}[a-z]?$", "", pathlib.PurePath(p).parent.name)  # noqa: E731
    for accept in (lambda p, r: rank_devices(r)[0] in own, lambda p, r: pathlib.PurePath(p).parent == folder,
                   lambda p, r: kind(p) == kind(path)):  # a folder nvidia-h200-x2-2026-11-30b: kind nvidia-h200-x2
        chosen = [(p, r) for p, r in same if accept(p, r)]
        if chosen:
            return Baseline([p for p, _ in chosen], [r for _, r in chosen]), None
    return None, "no one-GPU run of this workload on its machine kind"


def bound_run(path, result, baseline, same):
    """A run against its ceiling at its probe's link, else NVLink 4's (the committed runs'). Its noise: twice the
    robust standard deviation of the workload's one-GPU runs on the machine kind, plus its own rank 0's MAD."""
    n, strategy, throughput = world_size(result), result["strategy"].replace("lightning_", ""), result["throughput"]
    probe = result.get("collective_probe")
    link = probe_link(probe, f"{path}'s collective_probe") if probe else preset_link("nvlink4")
    top = ceiling(strategy, n, baseline, workload_of(result["config"], strategy), Topology(
        link, preset_link("ib-ndr400")), local_costs(baseline.results[0], probe, f"{path}'s collective_probe"))
    measured = throughput["images_per_second"] / (n * baseline.images_per_second)
    rates = [r["throughput"]["images_per_second"] for _, r in same]
    middle = statistics.median(rates)
    noise = 2 * 1.4826 * statistics.median(abs(r - middle) for r in rates) / middle + (
        throughput.get("rank0_mad_images_per_second") or 0) / (throughput.get("rank0_median_images_per_second") or 1)
    return {"name": path, "strategy": result["strategy"], "gpus": n, "nodes": (result.get("world") or {}).get(
        "num_nodes", 1), "one_gpu_runs": baseline.paths, **bound_figures(measured, top, 100 * measured * noise)}


def bound_figures(measured, top, noise):
    return {"measured": round(100 * measured, 3), "ceiling": round(100 * top.efficiency, 3),
            "lost": round(100 * (top.efficiency - measured), 3), "noise": round(noise, 3),
            "terms_ms": {k: round(v, 4) for k, v in top.terms.items()}}


def validate_runs(folders):
    """Every multi-rank result under the folders against its ceiling from its one-GPU counterpart, or skipped."""
    loaded, skipped = [], []
    for path in find_result_files(folders):
        document, problem = read_json(path)
        problem = problem or document_problem(document)
        (skipped.append({"name": relative(path), "reason": problem}) if problem else
         loaded.append((relative(path), document)))
    workloads, rows = {}, []
    for path, result in loaded:
        if can_start_from(result):
            workloads.setdefault(workload_key(result), []).append((path, result))
    for path, result in (item for item in loaded if world_size(item[1]) > 1):
        same = workloads.get(workload_key(result), [])
        baseline, reason = cannot_bound(path, result, same)
        try:
            if reason:
                raise UsageError(reason)
            rows.append(bound_run(path, result, baseline, same))
        except UsageError as error:  # also a CPU run without a probe, a probe that cannot be used
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
    return None if datasheet(row.get("gpu")) else f"no datasheet figures for the {row.get('gpu')}"


def published_ceiling(row):
    """A row's ceiling as PyTorch's DDP with its defaults would run it at its link (one NIC per node) and datasheet."""
    sms, memory = datasheet(row["gpu"])
    config = {"device": "cuda", "model": "resnet50", "batch_size_per_device": row["batch_per_gpu"], "optimizer": "sgd",
              "optimizer_impl": "foreach", "gradient_as_bucket_view": False}
    hop = LINK_PRESETS["pcie4" if "PCIe" in row["link"] else "nvlink4"][1]
    intra, network = (make_link(row["link"], row.get("link_basis", ""), row["link_gbytes_per_second"], hop_us)
                      for hop_us in (hop, LINK_PRESETS["ib-ndr400"][1]))
    return ceiling("ddp", row["gpus"], figure_baseline(row["source"], config, row["one_gpu_images_per_second"]),
                   workload_of(config), Topology(intra, network, row["gpus_per_node"], 1),
                   LocalCosts(0.0, memory / 2, memory, NCCL_CHANNELS / sms))


def validate_published(path):
    """Every row of a published table (docs/published/README.md's format) against its ceiling, or skipped."""
    document = load_json(path, "table of published measurements")
    rows = document.get("rows") if isinstance(document, dict) else None
    if not isinstance(rows, list):
        raise UsageError(f"{path}: no rows of published measurements (a JSON object with a list 'rows')")
    bounded, skipped = [], []
    for index, row in enumerate(rows, 1):
        name, problem = f"{pathlib.PurePath(path).name} row {index}", published_problem(row)
        if problem:
            skipped.append({"name": name, "reason": problem})
            continue
        measured = row["n_gpu_images_per_second"] / (row["gpus"] * row["one_gpu_images_per_second"])
        bounded.append({"name": f"{name} ({row.get('organisation', '?')}, {row['gpu']}, {row.get('precision', '?')}, "
                                f"{row['gpus']} GPUs)", "source": row["source"], "gpus": row["gpus"],
                        "nodes": row["nodes"], **bound_figures(measured, published_ceiling(row), row.get(
                            "noise_pp", document.get("noise_pp", PUBLISHED_NOISE_PP)))})
    return bounded, skipped


def summarise(rows):
    """Rows, the rows above the ceiling by more than their noise (named), and the points lost below it."""
    lost = sorted(r["lost"] for r in rows)
    quartiles = statistics.quantiles(lost, n=4, method="inclusive") if len(lost) > 1 else lost * 3
    return {"rows": len(rows), "gpus": sorted({r["gpus"] for r in rows}),
            "above_beyond_noise": [r["name"] for r in rows if -r["lost"] > r["noise"]],
            "points_lost": dict(zip(("min", "q1", "median", "q3", "max"),
                                    (round(q, 2) for q in (lost[0], *quartiles, lost[-1]))))}


def validate(folders, published):
    """The committed runs under folders and each published table against the ceiling, with the subsets' summaries."""
    runs, skipped = validate_runs(folders) if folders else ([], [])
    subsets, tables = {"this project's runs (in sample)": summarise(runs)} if runs else {}, {}
    for path in published:
        rows, table_skipped = validate_published(path)
        tables[relative(path)] = {"rows": rows, "skipped": table_skipped}
        for label, chosen in (("one node", [r for r in rows if r["nodes"] == 1]),
                              ("across nodes", [r for r in rows if r["nodes"] > 1]), ("every row", rows)):
            if chosen:
                subsets[f"{pathlib.PurePath(path).name}, {label}"] = summarise(chosen)
    if not subsets:
        raise UsageError(f"--validate: nothing to check: no multi-rank run with a one-GPU counterpart in "
                         f"{', '.join(map(str, folders))} ({len(skipped)} files skipped) and no usable published row")
    return {"what": f"each row against {CEILING}", "units": "efficiency %, points lost = ceiling - measured",
            "subsets": subsets, "runs": runs, "skipped": skipped, "published": tables}


def validation_table(validation):
    lines = ["| subset | rows | GPUs | above the ceiling beyond noise | points lost below it: min | 25 % | median | "
             "75 % | max |", "|" + "---|" * 9]
    lines += [f"| {name} | {s['rows']} | {s['gpus'][0]}-{s['gpus'][-1]} | {len(s['above_beyond_noise'])} | "
              + " | ".join(f"{value:.1f}" for value in s["points_lost"].values()) + " |"
              for name, s in validation["subsets"].items()]
    above = sorted({name for s in validation["subsets"].values() for name in s["above_beyond_noise"]})
    return "\n".join(lines) + "\n\nAbove the ceiling beyond noise: " + ("; ".join(above) or "none") + "\n"


# ------------------------------------------------------------------------------- the spread, docs/scaling.md

@functools.lru_cache(maxsize=1)
def published_losses():
    """{one node (True) or across nodes (False): [points lost]} of the shipped table: the out-of-sample spread."""
    rows, _ = validate_published(PUBLISHED)
    return {one: [r["lost"] for r in rows if (r["nodes"] == 1) == one] for one in (True, False)}


def spread(losses):
    """How far below their ceiling published runs fell, in points: (median, least, most, rows)."""
    return statistics.median(losses), min(losses), max(losses), len(losses)


def one_gpu_baseline(paths):
    """The one-GPU runs of one workload a ceiling starts from, or one line saying why a file is none."""
    results = [load_json(path, "result") for path in paths]
    for path, result in zip(paths, results):
        problem = document_problem(result) or (None if can_start_from(result) else (
            f"a {world_size(result)}-rank {result.get('benchmark')} run, status {result.get('status')!r}: the ceiling "
            "starts from one-GPU runs of ddp_resnet50.py or its twin with status ok"))
        if problem:
            raise UsageError(f"{path}: {problem}")
    if len({workload_key(r) for r in results}) > 1:
        raise UsageError("the one-GPU results ran different workloads: give runs of one workload")
    return Baseline([relative(p) for p in paths], results)


def ceiling_table(tops, per_node):
    """Each ceiling, how far below theirs published runs fell (one node or across nodes), its terms in %."""
    def share(c, names):
        return ", ".join(f"{name} {100 * c.terms[name] / c.step_ms:.2f}" for name in names
                         if abs(c.terms.get(name, 0.0)) >= 5e-4) or "-"
    lines = ["| strategy | GPUs | ceiling | published runs fell below it, points: median (range, rows) | exposed "
             "communication, % of the step | added kernels and optimizer, % |", "|" + "---|" * 6]
    for c in tops:
        fell = "- (one GPU: measured)" if c.n == 1 else "{:.1f} ({:.1f} to {:.1f}, {})".format(
            *spread(published_losses()[c.n <= per_node]))
        lines.append(f"| {c.strategy} | {c.n} | {100 * c.efficiency:.1f} % | {fell} | "
                     f"{share(c, COMMUNICATION)} | {share(c, OVERHEAD)} |")
    return "\n".join(lines)


DEFAULT_PAIR = ("results/nvidia-h200-x2-2026-11-30b/s4-native-1gpu-bf16-256-gpu0.json",
                "results/nvidia-h200-x2-2026-11-30b/s4-native-1gpu-bf16-256-gpu1.json")


def default_tops(strategies, intra="nvlink4", inter="ib-ndr400", nics=8):
    baseline = one_gpu_baseline([REPOSITORY / p for p in DEFAULT_PAIR])
    topology, local = Topology(preset_link(intra), preset_link(inter), 8, nics), local_costs(baseline.results[0],
                                                                                             None, "")
    config = baseline.results[0]["config"]
    return [ceiling(s, n, baseline, workload_of(config, s), topology, local) for s in strategies for n in (8, 64, 512)]


def section_answer(_=None):
    lines = ["| nodes of 8 GPUs on | joined by (NICs per node) | 8 GPUs | 64 GPUs | 512 GPUs |", "|" + "---|" * 5]
    for intra, inter, nics in (("nvlink4", "ib-ndr400", 8), ("nvlink4", "eth100", 1), ("pcie4", "eth100", 1)):
        cells = [f"{100 * c.efficiency:.1f} %, " + "{:.1f} ({:.1f} to {:.1f})".format(
            *spread(published_losses()[c.n <= 8])) for c in default_tops(["ddp"], intra, inter, nics)]
        lines.append(f"| {intra} | {inter} ({nics}) | " + " | ".join(cells) + " |")
    return "\n".join(lines + ["", "Each cell: the ceiling, then how far below theirs published runs fell, in points: "
                              "the median (the range; {} rows on one node, {} across nodes).".format(
                                  *map(len, published_losses().values()))])


def section_strategies(_=None):
    command = f"python scaling_model.py {' '.join(DEFAULT_PAIR)} --gpus 8,64,512 --link nvlink4"
    return f"`{command}`:\n\n" + ceiling_table(default_tops(STRATEGIES), 8)


def section_validation(_=None):
    v = validate([REPOSITORY / "results"], [PUBLISHED])
    lines = [f"`python scaling_model.py --validate results --published {relative(PUBLISHED)}`:", "",
             validation_table(v)]
    for table in v["published"].values():
        lines.append("Skipped: " + ("; ".join(f"{s['name'].rsplit(' ', 1)[1]}: {s['reason']}" for s in
                                                 table["skipped"]) or "none") + ".")
    return "\n".join(lines)


SECTIONS = {"scaling-answer": section_answer, "scaling-strategies": section_strategies,
            "scaling-validation": section_validation}
