"""Optimizer-state and gradient sharding benchmark: DDP, fairscale OSS/ShardedDDP, ZeRO-1, FSDP2, one workload.

Every strategy trains the same randomly initialised torchvision ResNet on the same synthetic per-rank batches
through ddp_resnet50.py's harness (warm-up excluded, CUDA-event step times, parameters compared across ranks, one
JSON result per strategy), then runs an instrumented pass (per-phase times, then each phase's host cost) and a
profiled pass (collectives by kind, count, bytes): the result's "analysis", with analytic volumes and state memory.

Strategies (--strategy: one, a comma list run in that order, or all that the backend can run, ddp first):
    ddp              DistributedDataParallel + the plain optimizer (the baseline)
    oss_ddp          DDP + fairscale.optim.OSS (optimizer state sharded, ZeRO-1 as fairscale does it)
    oss_sharded_ddp  fairscale ShardedDataParallel + OSS (gradients reduced to their owner, ZeRO-2)
    zero1            DDP + torch.distributed.optim.ZeroRedundancyOptimizer
    zero1_overlap    the same, its step and broadcast run inside DDP's backward (ZeRO comm hook; NCCL only)
    fsdp_zero2       FSDP2 fully_shard per --fsdp-units (default model), reshard_after_forward=False
    fsdp_zero3       FSDP2 fully_shard per --fsdp-units, reshard_after_forward=True

Launch recipes:

    # one GPU: a smoke run of every strategy over a process group of one rank, so nothing is sharded
    python oss_benchmark.py --output one-gpu.json
    # every strategy on 2 GPUs of a node (SGD; --optimizer adam keeps a state twice SGD's)
    torchrun --standalone --nproc-per-node 2 oss_benchmark.py --output rn50-sgd.json
    # fairscale's own benchmark conditions (resnet101, 28 px, 256/rank, fp32, RMSprop), synthetic data
    torchrun --standalone --nproc-per-node 2 oss_benchmark.py --preset fairscale --steps 1170 \\
        --steps-per-epoch 117 --output fairscale.json
    # one strategy, Slurm, one task per GPU
    srun --ntasks-per-node 4 --gpus-per-node 4 python oss_benchmark.py --strategy fsdp_zero2 --output fsdp.json
    # CPU smoke run (gloo), as in the tests
    torchrun --standalone --nproc-per-node 2 oss_benchmark.py --device cpu --image-size 32 \\
        --batch-size-per-device 4 --warmup-steps 2 --steps 4 --output /tmp/oss.json
    # the strategies side by side, with their phases, collectives and memory, from the result files
    python report.py --sharding rn50-sgd-*.json

With several strategies, --output x.json names the results x-<strategy>.json (printed before the run).
Numbers: "Median throughput (img/s) (rank 0) +/- MAD" is the global batch over rank 0's median step time, with the
median absolute deviation over the timed steps; --steps-per-epoch K adds fairscale's statistic (each epoch of K steps'
images per second, in global images, median and MAD over the epochs). Peak memory: the largest rank's.
Exit codes: 0 ok, 1 error, 2 bad input, 3 parameters out of sync, 4 out of memory, 128+N stopped by signal N; with
several strategies the first non-zero one (an error or a signal ends the launch: no later strategy starts).
"""

import argparse
import contextlib
import datetime
import gc
import importlib.metadata
import inspect
import json
import math
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

SCRIPT = "oss_benchmark.py"
STRATEGIES = ("ddp", "oss_ddp", "oss_sharded_ddp", "zero1", "zero1_overlap", "fsdp_zero2", "fsdp_zero3")
# --strategy all's order: a failure ends the launch, so the least-travelled code (fairscale, ZeRO's hook) goes last.
RUN_ORDER = ("ddp", "zero1", "fsdp_zero2", "fsdp_zero3", "oss_ddp", "oss_sharded_ddp", "zero1_overlap")
FAIRSCALE_STRATEGIES = ("oss_ddp", "oss_sharded_ddp")
BACKEND_REFUSALS = {("gloo", "zero1_overlap"): "its ZeRO DDP comm hook refuses gloo, where it may hang "
                                               "(pytorch/pytorch#62300): run it on GPUs (NCCL)"}
OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
              "rmsprop": torch.optim.RMSprop}
# Without --lr: each optimizer's usual rate (SGD's is too large for the Adam-like ones).
DEFAULT_LR = {"sgd": 0.1, "adam": 1e-3, "adamw": 1e-3, "rmsprop": 1e-4}
PRESETS = {
    # fairscale's benchmarks/oss.py: MNIST (28 px, grey x3; synthetic here), 256/rank, fp32, RMSprop, resnet101, NCHW
    "fairscale": {"model": "resnet101", "image_size": 28, "batch_size_per_device": 256, "precision": "fp32",
                  "optimizer": "rmsprop", "lr": 1e-4, "momentum": 0.9, "memory_format": "contiguous"}}
COLLECTIVE_KINDS = ("all-reduce", "reduce", "broadcast", "all-gather", "reduce-scatter", "other")
PHASES = ("parameter_sync_before_forward", "forward", "backward", "optimizer_step", "parameter_sync")
PHASE_NOTES = {  # what each phase of the instrumented pass includes
    "ddp": "forward includes DDP's buffer broadcast from rank 0; backward the bucketed gradient all-reduce, overlapped",
    "oss_ddp": "as ddp; optimizer_step updates this rank's shard only; parameter_sync is OSS broadcasting every "
               "rank's updated shard after a device synchronize, not overlapped",
    "oss_sharded_ddp": "forward includes ShardedDDP's blocking broadcast of every buffer one by one; backward reduces "
                       "each gradient to its owner (the small bucketed ones at its end); the rest as oss_ddp",
    "zero1": "as ddp; parameter_sync is ZeroRedundancyOptimizer broadcasting each rank's parameter bucket",
    "zero1_overlap": "backward includes the all-reduce, this rank's optimizer step and the parameter broadcasts, all "
                     "run from DDP's comm hook; optimizer_step is empty",
    "fsdp_zero2": "parameter_sync_before_forward is an explicit unshard (all-gather) of every FSDP unit, which the "
                  "timed steps do inside forward; backward includes the gradient reduce-scatter",
    "fsdp_zero3": "as fsdp_zero2, and backward also all-gathers every unit again (resharded after forward)"}


# ---------------------------------------------------------------------------- the strategies and their step

def fsdp_units(model, granularity):
    """The submodules FSDP2 shards one by one besides the root: a ResNet's bottleneck blocks, its stages, or none."""
    stages = [getattr(model, f"layer{i}") for i in range(1, 5)]
    return {"model": [], "stage": stages, "block": [block for stage in stages for block in stage]}[granularity]


def channels_last_strides(shape):
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def restore_channels_last(parameters):
    """Flat-bucket sharding (OSS, ShardedDDP's reduce buckets, ZeroRedundancyOptimizer) re-points each parameter or
    gradient at a slice of one buffer with view_as, which turns a channels_last weight contiguous (every convolution
    would convert it back): re-stride each 4-D one as channels_last over the very same bytes."""
    with torch.no_grad():
        for tensor in (t for p in parameters if p.dim() == 4 for t in (p, p.grad) if t is not None):
            if tensor.stride() != channels_last_strides(tensor.shape):
                if not tensor.is_contiguous():
                    raise RuntimeError(f"cannot restore channels_last over a strided tensor {tuple(tensor.shape)}")
                values = tensor.detach().clone()
                tensor.data = torch.as_strided(tensor.data, tensor.shape, channels_last_strides(tensor.shape))
                tensor.data.copy_(values)


class Setup:
    """One strategy's wrapped model and optimizer, and how to step, zero and analyse it."""

    def __init__(self, model, optimizer, scaler, zero_grad=None, step_in_backward=False, sync=(None, None),
                 units=(), optimizer_impl=None):
        self.model, self.optimizer, self.scaler, self.optimizer_impl = model, optimizer, scaler, optimizer_impl
        self.zero_grad = zero_grad or (lambda: optimizer.zero_grad(set_to_none=True))
        self.step_in_backward, self.layout_pending = step_in_backward, False  # zero1_overlap flattens at step 3
        self.sync_owner, self.sync_method = sync  # the object and method that broadcast the updated parameters
        self.units = list(units)  # FSDP modules, unsharded explicitly in the instrumented pass


def wrap_strategy(run, model, mesh, channels_last):
    """The strategy's model and optimizer around a model that is already on its device."""
    config, device, strategy = run.config, run.device, run.config["strategy"]
    opt_class, kwargs, fp16 = OPTIMIZERS[config["optimizer"]], config["optimizer_kwargs"], config["grad_scaler"]
    scaler = fp16 and torch.amp.GradScaler(device.type)
    if strategy in ("ddp", "zero1", "zero1_overlap", "oss_ddp"):
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                        **run.ddp_options())
    if strategy == "ddp":
        return Setup(model, opt_class(model.parameters(), **kwargs), scaler)
    if strategy in FAIRSCALE_STRATEGIES:
        from fairscale.nn.data_parallel import ShardedDataParallel
        from fairscale.optim import OSS
        from fairscale.optim.grad_scaler import ShardedGradScaler
        optimizer, zero_grad = OSS(model.parameters(), optim=opt_class, **kwargs), None  # after DDP, as documented
        if strategy == "oss_sharded_ddp":
            model = ShardedDataParallel(model, optimizer, reduce_buffer_size=config["sharded_reduce_buffer"],
                                        broadcast_buffers=config["broadcast_buffers"])
            model.refresh_trainable()  # what its first forward would do, so that the layout is fixed once, now
            zero_grad = lambda: model.zero_grad(set_to_none=True)  # noqa: E731 - keeps its bucket views
        if channels_last:
            restore_channels_last(model.parameters())
        return Setup(model, optimizer, fp16 and ShardedGradScaler(), zero_grad, sync=(optimizer, "_broadcast_params"))
    if strategy in ("zero1", "zero1_overlap"):
        from torch.distributed.optim import ZeroRedundancyOptimizer
        overlap, impl = strategy == "zero1_overlap", None
        if overlap and kwargs.get("fused"):  # its functional fused Adam keeps the step on the CPU: CUDA refuses it
            kwargs, impl = {**{k: v for k, v in kwargs.items() if k != "fused"}, "foreach": True}, "foreach"
        # one flat buffer per rank: one broadcast per rank after the step instead of one per parameter
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=opt_class,
                                            parameters_as_bucket_view=not overlap, overlap_with_ddp=overlap, **kwargs)
        setup = Setup(model, optimizer, scaler, step_in_backward=overlap, optimizer_impl=impl,
                      sync=(None, None) if overlap else (optimizer, "_sync_params"))
        if overlap:
            from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import hook_with_zero_step
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
            # shard_buckets splits each DDP bucket over the ranks: whole buckets per rank leave the state uneven
            model.register_comm_hook(None, hook_with_zero_step(allreduce_hook, model, optimizer, shard_buckets=True))
            setup.layout_pending = channels_last
        elif channels_last:
            restore_channels_last(model.parameters())
        return setup
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    units, reshard = [*fsdp_units(model, config["fsdp_units"]), model], strategy == "fsdp_zero3"
    # fp32 gathers (autocast casts per operation, as under DDP) or autocast's dtype (--fsdp-param-dtype compute)
    policy = MixedPrecisionPolicy(param_dtype=AUTOCAST_DTYPES[config["precision"]] if config["fsdp_param_dtype"] ==
                                  "compute" else None, reduce_dtype=torch.float32)
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    return Setup(model, opt_class(model.parameters(), **kwargs), fp16 and ShardedGradScaler(device=device.type),
                 units=units)


def train_step(setup, images, labels, config, marker=None):
    """One training step; in the instrumented pass each phase ends at a mark, FSDP's all-gather (unshard) first."""
    mark = marker.end_phase if marker is not None else (lambda phase: None)
    if marker is not None and setup.units:
        for unit in setup.units:
            unit.unshard()
        mark("parameter_sync_before_forward")
    dtype = AUTOCAST_DTYPES[config["precision"]]
    with torch.autocast(config["device"], dtype=dtype, enabled=dtype is not None):
        loss = F.cross_entropy(setup.model(images), labels)
    setup.zero_grad()
    mark("forward")
    (setup.scaler.scale(loss) if setup.scaler else loss).backward()
    mark("backward")
    if setup.step_in_backward:
        if setup.layout_pending and any(p.dim() == 4 and p.stride() != channels_last_strides(p.shape)
                                        for p in setup.model.parameters()):
            restore_channels_last(setup.model.parameters())
            setup.layout_pending = False
    elif setup.scaler:
        setup.scaler.step(setup.optimizer)
        setup.scaler.update()
    else:
        setup.optimizer.step()
    mark("optimizer_step")
    return loss.detach()


class PhaseMarker:
    """Phase boundaries: CUDA events on the GPU (no host sync between phases), the host clock on the CPU (where a
    waited collective has finished when the call returns). With synchronize=True the device is synchronised at each
    boundary: a phase's host time is then what the host took to queue it from an idle GPU, which beside the GPU's
    time says how close the step is to being host-bound."""

    def __init__(self, device, synchronize=False):
        self.device, self.synchronize, self.steps = device, synchronize, []
        self.events = device.type == "cuda" and not synchronize

    def end_phase(self, phase=None):
        """End a phase (None: start a step) at (when the next phase may start, when this one ended)."""
        if self.events:  # one event ends this phase and starts the next
            mark = (torch.cuda.Event(enable_timing=True),) * 2
            mark[0].record()
        else:
            ended = time.perf_counter()
            if self.synchronize and self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            mark = (time.perf_counter(), ended)
        if phase is None:
            self.steps.append([])
        self.steps[-1].append((phase, mark))

    def phase_times_ms(self):
        """{phase: [ms per step]}; a phase closed twice in a step (the step around OSS's broadcast) adds up."""
        per_phase = {}
        for marks in self.steps:
            totals = {}
            for (_, (start, _)), (phase, (_, end)) in zip(marks, marks[1:]):
                totals[phase] = totals.get(phase, 0.0) + (start.elapsed_time(end) if self.events else
                                                          (end - start) * 1e3)
            for phase, value in totals.items():
                per_phase.setdefault(phase, []).append(value)
        return per_phase


def instrumented_pass(run, setup, step):
    """Median time per phase over --phase-steps steps, then the host's cost of each phase over as many steps with
    the device synchronised at every boundary."""
    phases, owner, name = {}, setup.sync_owner, setup.sync_method
    for synchronize, prefix in ((False, ""), (True, "host_")):
        marker = PhaseMarker(run.device, synchronize)
        if owner is not None:  # OSS's and ZeRO's step() ends with their broadcast: split the phase there
            def timed(*args, original=getattr(owner, name), marker=marker, **kwargs):
                marker.end_phase("optimizer_step")
                outcome = original(*args, **kwargs)
                marker.end_phase("parameter_sync")
                return outcome
            setattr(owner, name, timed)  # an instance attribute, shadowing the method until deleted
        try:
            for _ in range(run.config["phase_steps"]):
                marker.end_phase()  # a step starts (in the synchronised pass once the device is idle)
                step(marker)
        finally:
            if owner is not None:
                delattr(owner, name)
        if run.device.type == "cuda":
            torch.cuda.synchronize(run.device)
        times = marker.phase_times_ms()
        phases[f"{prefix}phases_ms"] = {phase: {key: summarize(values)[key] for key in ("median", "mad")}
                                        for phase, values in times.items()}
        phases[f"{prefix}step_ms_median"] = statistics.median(map(sum, zip(*times.values())))
    return phases


# ---------------------------------------------------------------------------- collectives and the analysis

ELEMENT_BYTES = {"float": 4, "double": 8, "half": 2, "c10::half": 2, "bfloat16": 2, "c10::bfloat16": 2, "long": 8,
                 "long int": 8, "int64_t": 8, "int": 4}


def collective_kind(op_name):
    name = op_name.lower().replace("allgather", "all_gather").replace("allreduce", "all_reduce")
    return next((kind.replace("_", "-") for kind in ("reduce_scatter", "all_gather", "all_reduce", "broadcast",
                                                     "reduce") if kind in name), "other")


def element_count(dims):
    """Elements of a recorded shape ([4, 3]) or of a list of shapes ([[4, 3], [7]])."""
    if not isinstance(dims, list):
        return 0
    return math.prod(dims) if all(isinstance(d, int) for d in dims) else sum(map(element_count, dims))


def collectives_from_trace(events, steps):
    """Collectives per step by kind from a profiler trace. The c10d:: dispatcher ops are what the strategy asked
    for, on any backend (gloo runs a reduce-scatter as an all-reduce underneath); their input tensor says how many
    elements (an all-gather's input is this rank's shard). A tensor list carries no dtype in the trace, so the
    element size comes from the backend's own event of that size (gloo:*, nccl:*, record_param_comms)."""
    sizes, totals, unknown = {}, {}, 0
    for event in events:
        name, args = event.get("name", ""), event.get("args") or {}
        if name == "record_param_comms" and "dtype" in args:
            for key in ("In msg nelems", "Out msg nelems"):
                sizes.setdefault(args.get(key), ELEMENT_BYTES.get(str(args["dtype"]).lower()))
        elif name.split(":")[0] in ("gloo", "nccl") and ":" in name:
            for dims, kind in zip(args.get("Input Dims") or [], args.get("Input type") or []):
                sizes.setdefault(element_count(dims), ELEMENT_BYTES.get(str(kind).lower()))
    for event in events:
        name, args = event.get("name", ""), event.get("args") or {}
        if not name.startswith("c10d::"):
            continue
        op = name[len("c10d::"):]
        index = 1 if any(word in op for word in ("gather", "scatter")) else 0
        dims, types = args.get("Input Dims") or [], args.get("Input type") or []
        elements = element_count(dims[index]) if index < len(dims) else 0
        size = (ELEMENT_BYTES.get(str(types[index]).lower()) if index < len(types) else None) or sizes.get(elements)
        if size is None and elements:
            unknown, size = unknown + 1, 4
        entry = totals.setdefault(collective_kind(op), {"count": 0, "bytes": 0})
        entry["count"], entry["bytes"] = entry["count"] + 1, entry["bytes"] + elements * (size or 0)
    return {kind: {key: value / steps for key, value in entry.items()} for kind, entry in totals.items()}, unknown


@contextlib.contextmanager
def without_kineto_chatter():
    """The profiler's C++ side prints its stages (USDT:, STAGE:) and, without a GPU, a device-count ERROR straight
    to file descriptor 2: it points at the null device meanwhile (the profiled steps ran before: nothing new lost)."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        for descriptor in (saved, null):
            os.close(descriptor)


def count_collectives(run, step):
    """Profile --profile-steps more steps (host events only: no CUPTI) and count the collectives."""
    from torch.profiler import ProfilerActivity, profile
    config, steps = run.config, run.config["profile_steps"]
    with without_kineto_chatter(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
        for _ in range(steps):
            step()
        if run.device.type == "cuda":
            torch.cuda.synchronize(run.device)
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(config["trace_dir"] or scratch, os.path.splitext(os.path.basename(config["output"]))[0]
                            + f"-rank{run.rank}.trace.json")
        profiler.export_chrome_trace(path)
        with open(path) as stream:
            per_step, unknown = collectives_from_trace(json.load(stream).get("traceEvents", []), steps)
    return {"per_step": per_step, "unknown_dtype_assumed_4_bytes": unknown}


def analytic_volumes(strategy, parameter_bytes, buffer_bytes, world_size, gathered_bytes=None):
    """Input bytes per step and rank by kind (an all-gather's input is one shard). P = parameter bytes: DDP
    all-reduces P and broadcasts the buffers; ZeRO-1 (OSS, ZeroRedundancyOptimizer) adds a broadcast of P in all,
    one shard from each rank; ShardedDDP reduces P to the owners instead; FSDP reduce-scatters P and all-gathers
    the shards once (ZeRO-2) or twice (ZeRO-3: forward and backward)."""
    p, b, n = parameter_bytes, buffer_bytes, world_size
    g = p if gathered_bytes is None else gathered_bytes  # FSDP2 may all-gather in the compute dtype
    zero1, fsdp = {"all-reduce": p, "broadcast": p + b}, {"reduce-scatter": p} if n > 1 else {}  # 1 rank: FSDP2 idle
    return {"ddp": {"all-reduce": p, "broadcast": b}, "oss_ddp": zero1, "zero1": zero1, "zero1_overlap": zero1,
            "oss_sharded_ddp": {"reduce": p, "broadcast": p + b}, "fsdp_zero2": fsdp and {**fsdp, "all-gather": g / n},
            "fsdp_zero3": fsdp and {**fsdp, "all-gather": 2 * g / n}}[strategy]


def wire_bytes(volumes, n):
    """Wire bytes each rank sends, averaged over ranks, for ring/chain algorithms (NCCL's on a node)."""
    factors = {"all-reduce": 2 * (n - 1) / n, "reduce-scatter": (n - 1) / n, "all-gather": n - 1,
               "broadcast": (n - 1) / n, "reduce": (n - 1) / n}
    return sum(volume * factors.get(kind, 0.0) for kind, volume in volumes.items())


def local_analysis(setup, config, phases, collectives, numbers):
    """This rank's figures: phases, collectives, the parameters whose optimizer state it holds and that state's bytes
    (OSS and ZeRO keep it in their inner .optim; FSDP's shards; step counters left out), its convolution layout."""
    inner, local = getattr(setup.optimizer, "optim", setup.optimizer), lambda t: getattr(t, "to_local", lambda: t)()
    owned = sum(local(p).numel() for group in inner.param_groups for p in group["params"])
    state = [local(v) for s in inner.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    weights = [local(p) for p in setup.model.parameters() if p.dim() == 4]
    return {"phases": phases, "collectives": collectives, "owned_parameters": owned,
            "optimizer_state_bytes": sum(v.numel() * v.element_size() for v in state if v.dim() > 0),
            "expected_optimizer_state_bytes": config["optimizer_state_tensors_per_parameter"] * owned *
            numbers["parameter_bytes"] // numbers["parameters"],
            "parameter_layout": {"conv_weights": len(weights), "channels_last": sum(
                p.stride() == channels_last_strides(p.shape) for p in weights)}}


def analyse(run, setup, step, numbers, parameter_format):
    """The passes after the timed steps; rank 0's view and every rank's figures beside the analytic volumes and memory
    expectations."""
    config, strategy, n = run.config, run.config["strategy"], run.world_size
    if run.rank == 0 and (config["phase_steps"] or config["profile_steps"]):
        print(f"  instrumented pass ({config['phase_steps']} steps), profiled pass ({config['profile_steps']} "
              f"steps)", flush=True)
    phases = instrumented_pass(run, setup, step) if config["phase_steps"] else None
    collectives = count_collectives(run, step) if config["profile_steps"] else None
    everyone = [local_analysis(setup, config, phases, collectives, numbers)] * n
    if n > 1:
        dist.all_gather_object(everyone, everyone[0], group=run.monitor)
    size, buffers = numbers["parameter_bytes"], numbers["buffer_bytes"] * config["broadcast_buffers"]
    analytic = analytic_volumes(strategy, size, buffers, n, size / (1 + (config["fsdp_param_dtype"] == "compute")))
    state_tensors, expected = config["optimizer_state_tensors_per_parameter"], [
        e["expected_optimizer_state_bytes"] for e in everyone]
    if collectives is not None:
        measured = collectives["per_step"]
        collectives = {
            "source": "torch.profiler c10d:: ops (record_shapes), element size from the backend's events",
            "profiled_steps": config["profile_steps"], "measured_per_step": measured,
            "measured_per_step_per_rank": [e["collectives"]["per_step"] for e in everyone],
            "unknown_dtype_assumed_4_bytes": collectives["unknown_dtype_assumed_4_bytes"],
            "analytic_bytes_per_step": analytic, "measured_over_analytic": {kind: measured.get(kind, {"bytes": 0})[
                "bytes"] / volume for kind, volume in analytic.items() if volume},
            "wire_bytes_per_rank_measured": wire_bytes({k: v["bytes"] for k, v in measured.items()}, n),
            "wire_bytes_per_rank_analytic": wire_bytes(analytic, n),
            "wire_model": "ring/chain average per rank: all-reduce 2(N-1)/N, reduce-scatter (N-1)/N, "
                          "all-gather (N-1) x shard, broadcast and reduce (N-1)/N of the input bytes"}
    return {
        "parameter_memory_format": parameter_format, "fsdp_units": len(setup.units), "model": config["model"],
        "optimizer_impl": setup.optimizer_impl or config["optimizer_impl"], **numbers, "collectives": collectives,
        "phase_steps": config["phase_steps"], "phase_note": PHASE_NOTES[strategy],
        "phases_ms": phases and phases["phases_ms"], "phase_sum_ms_median": phases and phases["step_ms_median"],
        "phases_ms_per_rank": [e["phases"] and {k: v["median"] for k, v in e["phases"]["phases_ms"].items()}
                               for e in everyone],
        "host_phases_ms": phases and phases["host_phases_ms"],
        "host_phase_sum_ms_median": phases and phases["host_step_ms_median"],
        "host_phase_sum_ms_median_per_rank": [e["phases"] and e["phases"]["host_step_ms_median"] for e in everyone],
        "parameter_layout_per_rank": [e["parameter_layout"] for e in everyone],
        "memory": {"optimizer_state_tensors_per_parameter": state_tensors,
                   "owned_parameter_fraction_per_rank": [e["owned_parameters"] / numbers["parameters"]
                                                         for e in everyone],
                   "optimizer_state_bytes_per_rank": [e["optimizer_state_bytes"] for e in everyone],
                   "expected_optimizer_state_bytes_per_rank": expected,
                   "expected_optimizer_state_saving_bytes_vs_ddp": state_tensors * numbers["parameter_bytes"] -
                   max(expected)}}


def epoch_throughput(step_times_ms, steps_per_epoch, images_per_step):
    """fairscale's statistic: images per second of each whole epoch of consecutive steps, median and MAD over them."""
    epochs = [images_per_step * steps_per_epoch / (sum(step_times_ms[start:start + steps_per_epoch]) / 1e3)
              for start in range(0, len(step_times_ms) - steps_per_epoch + 1, steps_per_epoch)]
    stats = summarize(epochs) or {"median": None, "mad": None}
    return {"steps_per_epoch": steps_per_epoch, "count": len(epochs), "images_per_second": epochs, "median":
            stats["median"], "mad": stats["mad"], "steps_left_out": len(step_times_ms) - len(epochs) * steps_per_epoch}


# ---------------------------------------------------------------------------- one launch, strategy by strategy

def add_epoch_figures(result):
    """--steps-per-epoch: fairscale's per-epoch statistic beside the harness's figures (Run's on_result hook)."""
    config = result["config"]
    if result["throughput"] and config["steps_per_epoch"]:
        result["throughput"]["rank0_epochs"] = epoch_throughput(
            result["step_times_ms_per_rank"][0], config["steps_per_epoch"], config["global_batch_size"])


def train_and_analyse(run, mesh):
    """Build, time and analyse the run's strategy; returns its exit code (a failure raises)."""
    config, device = run.config, run.device
    torch.manual_seed(config["seed"])  # identical initial weights on every rank and for every strategy
    model = build_model(config["model"]).to(device)
    numbers = {"parameters": sum(p.numel() for p in model.parameters()), "parameter_bytes": sum(
        p.numel() * p.element_size() for p in model.parameters()), "buffers": len(list(model.buffers())),
        "buffer_bytes": sum(b.numel() * b.element_size() for b in model.buffers())}
    # FSDP2 refuses channels_last parameters: its inputs stay channels_last, so cuDNN converts each weight.
    parameter_format = "contiguous" if config["strategy"].startswith("fsdp") else config["memory_format"]
    if parameter_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
    setup = wrap_strategy(run, model, mesh, parameter_format == "channels_last")
    images, labels = run.synthetic_batch()
    step = lambda marker=None: train_step(setup, images, labels, config, marker)  # noqa: E731
    for index in range(config["warmup_steps"] + config["steps"]):
        run.before_step(index)
        run.after_step(index, step())
    rank_record = run.collect_record(p.full_tensor() if hasattr(p, "full_tensor") else p
                                     for p in setup.model.parameters())
    run.result["analysis"] = analyse(run, setup, step, numbers, parameter_format)
    return run.finish(rank_record)


def trace_dir_refusal(trace_dir):
    """Every rank makes the --trace-dir folder and proves it writable before anything runs, or says why not."""
    if trace_dir is None:
        return None
    try:
        os.makedirs(trace_dir, exist_ok=True)
        tempfile.TemporaryFile(dir=trace_dir).close()
    except OSError as error:
        return f"--trace-dir {trace_dir} cannot be written ({error.strerror})"
    return None


@record  # under torchrun, a failing rank's traceback is the job's root cause
def main(argv=None):
    args, explicit = parse_arguments(argv)
    overrides = apply_preset(args, explicit)
    cuda = args.device == "cuda" and torch.cuda.is_available()
    device_count, bf16 = torch.cuda.device_count() if cuda else 0, cuda and torch.cuda.is_bf16_supported()
    fp16 = args.precision == "fp16" or (args.precision == "auto" and cuda and not bf16)
    strategies, notes = resolve_strategies(args, explicit, fp16)
    launch = detect_launch(os.environ)
    configs = resolve_configs(args, strategies, overrides, launch, cuda, device_count, bf16)
    refusal = next(filter(None, (output_refusal(config) for config in configs)), None)
    refusal = refusal or trace_dir_refusal(args.trace_dir)
    if refusal:
        raise UsageError(refusal)
    if launch["world_size"] == 1:  # the strategies' libraries need a process group, even of one rank
        notes.append("one rank: every strategy runs over a process group of one rank, unsharded (a smoke run)")
        dist.init_process_group(configs[0]["backend"], store=dist.HashStore(), rank=0, world_size=1)
    run, code, mesh = None, 0, None
    try:
        for config in configs:
            first, run = run is None, Run(config, launch, device_count, on_result=add_epoch_figures)
            run.result["sharded"] = run.world_size > 1 and config["strategy"] != "ddp"
            run.join_ranks()
            if first:
                mesh = device_mesh(run, strategies)
                if run.rank == 0:
                    print_launch_notes(args, explicit, notes, overrides, configs)
            outcome = train_and_analyse(run, mesh)  # every strategy runs; the first non-zero code is the launch's
            code = code or outcome
            gc.collect()  # this strategy's model, optimizer and buffers, before the next one measures
            if run.device.type == "cuda":
                torch.cuda.empty_cache()
        if run.rank == 0 and len(configs) > 1:
            print(f"\nthe strategies side by side: python report.py --sharding {' '.join(c['output'] for c in configs)}")
        return code
    except Exception as error:  # noqa: BLE001 - one rank out of memory: its "oom" result; else raised again
        if run is None:
            raise
        return run.out_of_memory(error)
    finally:
        shut_down()


def device_mesh(run, strategies):
    """FSDP2's one-dimensional mesh over every rank, when an FSDP strategy runs."""
    if not any(strategy.startswith("fsdp") for strategy in strategies):
        return None
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh(run.device.type, (run.world_size,))


# ---------------------------------------------------------------------------- options

def strategy_list(text):
    """'all' (a tuple: what the backend can run) or a comma list of known strategies, in the order given."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if names != ["all"] and (not names or len(set(names)) < len(names) or not set(names) <= set(STRATEGIES)):
        raise argparse.ArgumentTypeError(f"unknown or repeated strategy in {text!r} (choose from "
                                         f"{', '.join(STRATEGIES)}, all, or a comma list)")
    return RUN_ORDER if names == ["all"] else names


def parse_arguments(argv=None):
    """The arguments, and the names of the options given explicitly (a preset fills in only the others)."""
    parser = OneLineArgumentParser(SCRIPT, __doc__.split("\n")[0])
    add = parser.add_argument
    add("--strategy", type=strategy_list, default="all",
        help=f"one of {', '.join(STRATEGIES)}, a comma list, or all (those the backend can run)")
    add("--optimizer", choices=sorted(DEFAULT_LR), default="sgd",
        help="its state (SGD momentum 1x, RMSprop with momentum and Adam 2x the parameters) is what sharding saves; "
             "without --lr its own rate: " + ", ".join(f"{name} {lr:g}" for name, lr in DEFAULT_LR.items()))
    add("--model", choices=[f"resnet{depth}" for depth in (18, 34, 50, 101, 152)], default="resnet50",
        help="the torchvision ResNet trained")
    add("--preset", choices=sorted(PRESETS), help="fairscale: resnet101, 28 px, 256/device, fp32, RMSprop lr 1e-4 "
        "momentum 0.9, NCHW; options given explicitly override it (and are reported)")
    add("--steps-per-epoch", type=int, help="also report fairscale's statistic in global images: images per second "
        "of each epoch of this many timed steps, median and MAD over the epochs")
    add("--sharded-reduce-buffer", type=int, default=2**23,
        help="ShardedDDP reduce_buffer_size in elements (fairscale's default; 0: no buffer)")
    add("--fsdp-units", choices=["block", "stage", "model"], default="model", help="what fsdp_zero2/3 shard as one "
        "unit (one all-gather and one reduce-scatter each): every bottleneck, every stage (layer1..4), the model")
    add("--fsdp-param-dtype", choices=["fp32", "compute"], default="fp32",
        help="fsdp_zero2/3: all-gather fp32 parameters (autocast casts them, as under DDP) or parameters already in "
             "the autocast dtype (MixedPrecisionPolicy: half the bytes)")
    add("--phase-steps", type=int, default=10, help="steps of the instrumented pass that times each phase (0: none)")
    add("--profile-steps", type=int, default=2, help="steps of the profiled pass that counts collectives (0: none)")
    add("--trace-dir", help="also keep each rank's profiler trace (chrome JSON) in this folder")
    args = parse_arguments_with_extras(parser, argv, lr=None, package=False)  # lr None: DEFAULT_LR's
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return args, set(vars(parser.parse_args(argv)))


def apply_preset(args, explicit):
    """The preset's values for the options not given. Returns the explicit overrides {option: {preset, given}}."""
    overrides = {}
    for name, value in PRESETS.get(args.preset, {}).items():
        given = "global_batch_size" if name == "batch_size_per_device" and "global_batch_size" in explicit else name
        if given not in explicit:
            setattr(args, name, value)
        elif getattr(args, given) != value:
            overrides[given] = {"preset": value, "given": getattr(args, given)}
    if "lr" not in explicit and args.preset is None:
        args.lr = DEFAULT_LR[args.optimizer]
    return overrides


def resolve_strategies(args, explicit, fp16):
    """The strategies to run and notes for the user; this script's own input rules (UsageError). No GPU work."""
    backend = "nccl" if args.device == "cuda" else "gloo"
    refused = [name for name in args.strategy if (backend, name) in BACKEND_REFUSALS]
    if refused and args.strategy != RUN_ORDER:
        raise UsageError(f"--strategy {refused[0]} cannot run on {backend}: {BACKEND_REFUSALS[backend, refused[0]]}")
    strategies = [name for name in args.strategy if name not in refused]
    fairscale = [name for name in strategies if name in FAIRSCALE_STRATEGIES]
    problem = fairscale and fairscale_import_error()
    fsdp_compute = args.fsdp_param_dtype == "compute" and any(name.startswith("fsdp") for name in strategies)
    warmup = 4 if args.static_graph else 3
    for broken, rule in (
            (args.compile, "--compile is not offered here: the strategies' own hooks are measured eagerly "
                           "(ddp_resnet50.py --compile measures compiled DDP)"),
            (problem, f"--strategy {','.join(fairscale)} needs fairscale, which cannot be imported ({problem}): "
                      f"pip install '.[fairscale]' (fairscale==0.4.13)"),
            ("zero1_overlap" in strategies and fp16, "zero1_overlap cannot use fp16: its optimizer step runs inside "
                                                     "backward, where a GradScaler cannot unscale first"),
            ("zero1_overlap" in strategies and args.warmup_steps < warmup, f"zero1_overlap needs --warmup-steps >= "
             f"{warmup}: its first {warmup - 1} steps only learn DDP's buckets and update nothing"),
            (fsdp_compute and (args.device == "cpu" or args.precision == "fp32"), "--fsdp-param-dtype compute needs "
             "--device cuda (CPU autocast refuses bf16 BatchNorm weights) and a 16-bit --precision (bf16, fp16, auto)"),
            (args.optimizer in ("adam", "adamw") and "momentum" in explicit,
             f"--momentum does not apply to --optimizer {args.optimizer} (its betas are PyTorch's defaults)"),
            (min(args.phase_steps, args.profile_steps, args.sharded_reduce_buffer) < 0 or args.steps_per_epoch
             is not None and not 1 <= args.steps_per_epoch <= args.steps, "--phase-steps, --profile-steps and "
             "--sharded-reduce-buffer must not be negative, --steps-per-epoch must be from 1 to --steps"),
            (args.trace_dir is not None and (not args.trace_dir or not args.profile_steps or os.path.isfile(
                args.trace_dir)), "--trace-dir must name a folder, and --profile-steps must not be 0 (its traces)"),
            (args.output is not None and (args.output.endswith(os.sep) or os.path.isdir(args.output)),
             f"--output {args.output!r} is not a file path")):
        if broken:
            raise UsageError(rule)
    return strategies, [f"--strategy all skips {name} on {backend}: {BACKEND_REFUSALS[backend, name]}"
                        for name in refused]


def fairscale_import_error():
    try:
        import fairscale.nn.data_parallel  # noqa: F401
        import fairscale.optim  # noqa: F401
    except Exception as error:  # noqa: BLE001 - an old fairscale may fail on a new torch with any error
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    return None


def resolve_configs(args, strategies, overrides, launch, cuda, device_count, bf16):
    """One harness config per strategy (its own --output when there are several), checked before any GPU work. Adam(W)
    fused, SGD and RMSprop foreach (FSDP2 has no fused SGD, RMSprop no fused kernel): for every strategy, any device."""
    configs, impl = [], "fused" if args.optimizer in ("adam", "adamw") else "foreach"
    kwargs = {"lr": args.lr, impl: True, **({} if impl == "fused" else {"momentum": args.momentum})}
    stem, extension = os.path.splitext(args.output or "")
    for strategy in strategies:
        output = f"{stem}-{strategy}{extension or '.json'}" if args.output and len(strategies) > 1 else args.output
        config = resolve_harness_config(argparse.Namespace(**{**vars(args), "output": output}), launch, SCRIPT,
                                        strategy, cuda, device_count, bf16)
        config.update(preset_overrides=overrides, strategies_in_launch=strategies, optimizer_kwargs=kwargs,
                      optimizer_impl=impl, optimizer_state_tensors_per_parameter={
                          "sgd": int(args.momentum > 0), "adam": 2, "adamw": 2, "rmsprop": 1 + int(args.momentum > 0)}[
                          args.optimizer])
        configs.append(config)
    return configs


def print_launch_notes(args, explicit, notes, overrides, configs):
    """What the launch does beyond what was literally asked, said before it starts."""
    fsdp = [config["strategy"] for config in configs if config["strategy"].startswith("fsdp")]
    notes += [f"--preset {args.preset}: --{option.replace('_', '-')} {values['given']} given explicitly overrides the "
              f"preset's {values['preset']}" for option, values in overrides.items()]
    if "lr" not in explicit and args.preset is None:
        notes.append(f"--optimizer {args.optimizer} uses lr {args.lr:g} (pass --lr to change it)")
    if fsdp and configs[0]["memory_format"] == "channels_last":
        notes.append(f"{', '.join(fsdp)} keep their parameters contiguous (FSDP2 refuses channels_last ones); their "
                     f"inputs stay channels_last")
    if len(configs) > 1:
        notes.append(f"{len(configs)} strategies, one result each: {', '.join(c['output'] for c in configs)}")
    print("".join(f"note: {note}\n" for note in notes), end="", flush=True)


# ============================================================================ harness
# From here to "end of harness" the text is identical in ddp_resnet50.py, lightning/ddp_resnet50.py and
# oss_benchmark.py (tests/test_harness_copies.py): change it in one file, then run `python tools/sync_harness.py`.
# It reads nothing of its script's: the script's name, strategy and model come as arguments or in the config.

SCHEMA_VERSION = 2
DEFAULT_BATCH = {"cuda": 256, "cpu": 8}
EXIT_CODES = {"ok": 0, "error": 1, "usage": 2, "desync": 3, "oom": 4}  # and 128 + N when signal N ended the run
NUM_CLASSES = 1000  # ImageNet's
REPLICA_TOLERANCE = 1e-9  # relative, between float64 sums of the parameters that DDP keeps identical on every rank
LAUNCH_ID = uuid.uuid4().hex  # rank 0's: every result of one launch shares it (oss_benchmark.py writes several)
AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# Dense tensor-core TFLOP/s (16-bit, fp32) of the SXM parts, from the datasheets; PCIe and NVL parts clock lower.
PEAK_TFLOPS = {"H200": (989.0, 494.0), "H100": (989.0, 494.0), "A100": (312.0, 156.0)}
# Environment variables that change what a run measures: recorded with the software.
TUNING_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCHINDUCTOR_", "TORCH_CUDNN_", "TORCH_SYMM_MEM_", "PYTORCH_", "CUDA_",
                   "CUBLAS_", "CUDNN_", "NVSHMEM_", "OMP_", "MKL_")
# What the DDP options and the package's record when not given (the package's: passed to its add_arguments).
EXTRA_DEFAULTS = {"bucket_cap_mb": 25.0, "gradient_as_bucket_view": True, "broadcast_buffers": True,
                  "static_graph": False, "coordinate_descent_tuning": False, "comm_hook": "none", "cuda_graphs": False,
                  "stem_conv": "torchvision", "max_pool_backward": "torchvision", "batch_norm": "torchvision",
                  "collective_probe": False}
# The fastest mode's capture, tuning and computation options, the DDP communication hooks and the collective probe:
# the repository's package (resnet50_ddp_benchmarks/benchmark_extras.py) adds them to ddp_resnet50.py and its twin.
PACKAGE_OPTIONS = ("--cuda-graphs", "--loss-scale", "--compile-mode", "--coordinate-descent-tuning", "--comm-hook",
                   "--space-to-depth-stem", "--dense-max-pool-backward", "--sums-batch-norm", "--fused-batch-norm",
                   "--collective-probe")
RESULT_FIGURES = ("throughput", "stability", "step_time_ms", "step_times_ms_per_rank", "loss_per_step", "memory",
                  "checks", "efficiency", "failure", "hardware", "host_lead_ms", "host_lead_ms_per_rank", "wall_time_s")


class UsageError(Exception):
    """Bad input: one line naming the broken rule from every rank, exit code 2, nothing written."""


class OneLineArgumentParser(argparse.ArgumentParser):
    """Errors as UsageError; no abbreviations: an option added later must not change what a command line means."""

    def __init__(self, prog=None, description=None, **options):
        super().__init__(prog=prog, description=description, allow_abbrev=False,
                         formatter_class=argparse.RawDescriptionHelpFormatter, **options)

    def error(self, message):
        raise UsageError(message)


def parse_arguments_with_extras(parser, argv, lr=0.1, package=True):
    """Every script's options, DDP's included; the package's join (package: the script takes them) when one is given,
    and for --help where it is found. A script copied alone names them in its epilog and refuses them by name."""
    add = parser.add_argument
    batch = parser.add_mutually_exclusive_group()
    batch.add_argument("--batch-size-per-device", type=int, help="weak scaling: images per device (256 on GPU, 8 on "
                       "CPU)")
    batch.add_argument("--global-batch-size", type=int, help="strong scaling: images per step over all devices")
    add("--warmup-steps", type=int, default=10, help="untimed steps first (%(default)s)")
    add("--steps", type=int, default=50, help="timed steps (%(default)s)")
    add("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
        help="auto: bf16 where the GPU has it, else fp16; fp32 on the CPU (TF32 tensor cores on GPUs)")
    add("--memory-format", choices=["auto", "channels_last", "contiguous"], default="auto",
        help="auto: channels_last on GPU, contiguous on CPU")
    add("--device", choices=["cuda", "cpu"], default="cuda", help="cuda (NCCL) or cpu (gloo) (%(default)s)")
    add("--image-size", type=int, default=224, help="square input size (%(default)s)")
    add("--lr", type=float, default=lr, help=f"learning rate ({lr})" if lr else "learning rate (the optimizer's own)")
    add("--momentum", type=float, default=0.9, help="SGD momentum (%(default)s)")
    add("--seed", type=int, default=0, help="weights; rank r's data uses seed + 1 + r (%(default)s)")
    add("--output", help="result JSON (runs/<script>-<strategy>-<world><device>-<precision>-<job or pid>.json)")
    add("--overwrite", action="store_true", help="replace an existing --output")
    add("--timeout", type=int, default=300, help="seconds a rank waits for the others (%(default)s)")
    add("--compile", action="store_true", help="torch.compile the model")
    add("--bucket-cap-mb", type=float, default=25.0, help="DDP's gradient bucket size in MB (%(default)s)")
    both = argparse.BooleanOptionalAction  # --X and --no-X
    add("--gradient-as-bucket-view", action=both, default=True, help="gradients are views into DDP's buckets")
    add("--broadcast-buffers", action=both, default=True, help="DDP sends rank 0's buffers before each forward")
    add("--static-graph", action="store_true", help="tell DDP that the graph never changes")
    add("--cudnn-benchmark", action=both, help="cuDNN times its algorithms in each process (the GPU default)")
    if package:  # one line, as written (the parser's formatter keeps it)
        parser.epilog = f"with the repository's package (pip install -e .): {' '.join(PACKAGE_OPTIONS)}"
    argv = sys.argv[1:] if argv is None else argv
    given = [text.split("=")[0] for text in argv if text.split("=")[0] in PACKAGE_OPTIONS] if package else []
    if given:
        import_extras(given[0]).add_arguments(parser, EXTRA_DEFAULTS)
    elif package and {"-h", "--help"} & set(argv):  # their help in full, where the package is found
        with contextlib.suppress(UsageError):
            import_extras().add_arguments(parser, EXTRA_DEFAULTS)
    return parser.parse_args(argv)


def import_extras(option="this option"):
    """The repository's package: installed (pip install -e .), else in the clone of this file's real path (a link
    to it may run from anywhere): beside it, or a folder up for the twin."""
    here = os.path.dirname(os.path.realpath(__file__))
    sys.path += [folder for folder in (here, os.path.dirname(here)) if folder not in sys.path]
    with contextlib.suppress(ModuleNotFoundError):
        return importlib.import_module("resnet50_ddp_benchmarks.benchmark_extras")
    raise UsageError(f"{option} needs the repository's package (pip install -e . in a clone)")


def launcher_integer(env, name, default=None, high=10**9):
    text = env.get(name, None if default is None else str(default))
    if text is None:
        raise UsageError(f"{name} is not set, but the other launcher variables are")
    if not re.fullmatch(r"\s*\d{1,12}\s*", text) or int(text) > high:
        raise UsageError(f"{name}={text!r} is not an integer from 0 to {high}")
    return int(text)


def detect_launch(env):
    """Rank layout from torchrun's variables (RANK, WORLD_SIZE), else srun's (a task of a step), else one process.
    srun's tasks: slurm/common.sh makes it one task per GPU, as many on every node, and sets MASTER_ADDR."""
    job = env.get("SLURM_JOB_ID", "")  # federated clusters issue ids over 10^9
    launch = {"slurm_job_id": job if re.fullmatch(r"\d{1,12}", job) else None, "rank": 0, "launcher": "single",
              "world_size": 1, "local_rank": 0, "local_world_size": 1, "num_nodes": 1, "master_addr": "127.0.0.1",
              "master_port": 0}
    if "RANK" in env:  # (WORLD_SIZE alone: Lightning's own workers carry it)
        rank, world = launcher_integer(env, "RANK"), launcher_integer(env, "WORLD_SIZE")
        local_rank = launcher_integer(env, "LOCAL_RANK", rank)
        local_world = launcher_integer(env, "LOCAL_WORLD_SIZE", world)
        launcher, port = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "env", 29500
    elif "SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env:  # inside srun (the batch step is one process)
        rank, world = launcher_integer(env, "SLURM_PROCID"), launcher_integer(env, "SLURM_STEP_NUM_TASKS")
        local_rank = launcher_integer(env, "SLURM_LOCALID")
        local_world = world // max(1, launcher_integer(env, "SLURM_STEP_NUM_NODES"))
        launcher, port = "slurm", 15000 + int(launch["slurm_job_id"] or 0) % 20000
    else:
        return launch
    if not (rank < world and local_rank < local_world <= world) or world % local_world:
        raise UsageError(f"inconsistent launcher variables: rank {rank} of {world}, local rank {local_rank} of "
                         f"{local_world} per node")
    if world > local_world and not env.get("MASTER_ADDR"):
        raise UsageError("MASTER_ADDR is not set for several nodes: export MASTER_ADDR=$(scontrol show hostnames "
                         "\"$SLURM_JOB_NODELIST\" | head -n 1)")
    return {**launch, "launcher": launcher, "rank": rank, "world_size": world, "local_rank": local_rank,
            "local_world_size": local_world, "num_nodes": world // local_world, "master_addr": env.get(
                "MASTER_ADDR") or "127.0.0.1", "master_port": launcher_integer(env, "MASTER_PORT", port, 65535)}


def check_harness_rules(args, launch, per_device, precision, cuda_available, device_count, bf16_supported):
    """Every rule that needs no process group or GPU work: the first broken one raises UsageError."""
    device, world = args.device, launch["world_size"]
    for broken, rule in (
            (min(args.warmup_steps, args.steps, args.image_size, per_device) < 1,
             "--warmup-steps, --steps, --image-size and the batch sizes must be positive"),
            (not (0 < args.lr < math.inf and 0 <= args.momentum < math.inf),
             "--lr must be positive, --momentum finite and not negative"),
            (not (0 <= args.seed < 2**62 and 0 < args.timeout <= 7 * 86400),
             "--seed must be from 0 to 2**62 - 1, --timeout from 1 to 604800 seconds"),
            (not 0 < args.bucket_cap_mb <= 1e6, "--bucket-cap-mb must be above 0 and at most 1e6"),
            (device == "cpu" and args.cudnn_benchmark, "--cudnn-benchmark needs --device cuda: it times cuDNN's GPU "
                                                       "convolution algorithms"),
            (device == "cuda" and not (cuda_available and device_count),
             "--device cuda needs a CUDA GPU and none is visible (use --device cpu for a CPU run)"),
            (device == "cuda" and launch["local_world_size"] > device_count and launch["launcher"] != "slurm",
             f"{launch['local_world_size']} ranks on this node but only {device_count} GPUs visible: one rank per GPU"),
            (device == "cpu" and precision == "fp16", "--precision fp16 needs a GPU: use fp32 or bf16 on the CPU"),
            (device == "cuda" and precision == "bf16" and not bf16_supported, "this GPU has no bf16: use fp16, fp32"),
            ((args.global_batch_size or 0) % world, f"--global-batch-size is not divisible by the world size {world}"),
            (per_device * math.ceil(args.image_size / 32) ** 2 < 2, f"batch {per_device} per device at "
             f"{args.image_size} px leaves BatchNorm one value per channel in the last stage: use more or larger"),
            (args.output is not None and (args.output == "" or args.output.endswith(os.sep) or os.path.isdir(
                args.output)), f"--output {args.output!r} is not a file path")):
        if broken:
            raise UsageError(rule)


def resolve_harness_config(args, launch, script, strategy, cuda_available, device_count, bf16_supported):
    """Every option resolved, bad input refused (UsageError); --output is checked by output_refusal()."""
    device, world = args.device, launch["world_size"]
    auto = "fp32" if device == "cpu" else "bf16" if bf16_supported else "fp16"
    precision = auto if args.precision == "auto" else args.precision
    per_device = DEFAULT_BATCH[device] if args.batch_size_per_device is None else args.batch_size_per_device
    per_device = per_device if args.global_batch_size is None else args.global_batch_size // world
    check_harness_rules(args, launch, per_device, precision, cuda_available, device_count, bf16_supported)
    name = f"{os.path.splitext(os.path.basename(script))[0]}-{strategy}-{world}{device}-{precision}"
    output = args.output or os.path.join("runs", f"{name}-{launch['slurm_job_id'] or os.getpid()}.json")
    mode = getattr(args, "compile_mode", None) or ("default" if args.compile else None)
    layout = {"auto": "channels_last" if device == "cuda" else "contiguous"}.get(args.memory_format, args.memory_format)
    config = {**EXTRA_DEFAULTS, **vars(args), "benchmark": script, "strategy": strategy, "num_classes": NUM_CLASSES,
              "backend": "nccl" if device == "cuda" else "gloo", "batch_mode": "global" if args.global_batch_size else
              "per_device", "batch_size_per_device": per_device, "global_batch_size": per_device * world,
              "precision_requested": args.precision, "precision": precision, "grad_scaler": precision == "fp16",
              "tf32": device == "cuda", "memory_format_requested": args.memory_format, "memory_format": layout,
              "cudnn_benchmark": device == "cuda" and args.cudnn_benchmark is not False, "cudnn_benchmark_limit": None,
              "timeout_s": args.timeout, "output": os.path.abspath(output), "compile": mode is not None,
              "compile_mode": mode, "compiled_ddp": "ddp_optimizer" if mode and world > 1 else None,
              "loss_scale": "dynamic" if precision == "fp16" else None}
    if hasattr(args, "cuda_graphs"):  # the package's options are on the command line
        import_extras().resolve_options(args, config, world, UsageError)
    return config


def output_refusal(config):
    """Why --output would replace another run's file, or None: every rank checks before anything starts (a folder
    that cannot be written is found at the end: write_result() says so)."""
    taken = os.path.lexists(config["output"]) and not config["overwrite"]
    return f"--output {config['output']} exists: pass --overwrite to replace it" if taken else None


def summarize(values):
    """count, mean, median, p90, p99 (numpy's), min, max and the median absolute deviation."""
    if not values:
        return None
    cut = statistics.quantiles(values * (2 if len(values) == 1 else 1), n=100, method="inclusive")
    median = statistics.median(values)
    return {"count": len(values), "mean": statistics.fmean(values), "median": median, "p90": cut[89], "p99": cut[98],
            "min": min(values), "max": max(values), "mad": statistics.median([abs(v - median) for v in values])}


def output_of(*command):
    """A command's output lines, None when it is missing or fails."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
        return done.stdout.splitlines() if done.returncode == 0 else None
    return None


def collect_environment(device, rank):
    """(software, git, hardware) of this rank; rank 0's hardware adds the CPU model and nvidia-smi's GPU links."""
    nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    software = {"python": platform.python_version(), "torch": torch.__version__, "torch_git": torch.version.git_version,
                "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "torchvision":
                torchvision.__version__, "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
                **{name: next((found.version for found in importlib.metadata.distributions(name=name)), None)
                   for name in ("lightning", "fairscale")}, "environment": {
                    key: value for key, value in sorted(os.environ.items()) if key.startswith(TUNING_PREFIXES)}}
    described = (output_of("git", "-C", os.path.dirname(__file__) or ".", "describe", "--always", "--dirty",
                           "--exclude=*", "--abbrev=40") or [None])[0]
    git = {"commit": described and described[:40], "dirty": described and described.endswith("-dirty")}
    hardware = {"rank": rank, "hostname": socket.gethostname(), "device": str(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        hardware.update(gpu_name=props.name, gpu_memory_mib=round(props.total_memory / 2**20, 1),
                        gpu_uuid=str(props.uuid), compute_capability=f"{props.major}.{props.minor}")
    if rank == 0:
        cpu = [line.split(":", 1)[1].strip() for line in output_of("cat", "/proc/cpuinfo") or []
               if line.startswith("model name")]
        links = output_of("nvidia-smi", "topo", "-m") if device.type == "cuda" else None  # NV#: NVLink; PIX: PCIe
        hardware["host"] = {"cpu": cpu[0] if cpu else platform.machine(), "cpu_count": os.cpu_count(), "interconnect":
                            links and [re.sub(r"\x1b\[[0-9;]*m", "", line).rstrip() for line in links if line.strip()]}
    return software, git, hardware


def build_model(name="resnet50"):
    """A randomly initialised torchvision ResNet: the caller seeds it, so that every rank starts from the same."""
    return torchvision.models.get_model(name, weights=None, num_classes=NUM_CLASSES)


def sgd_implementation(cuda, grad_scaler):
    """Fused SGD on the GPU, except under fp16's dynamic GradScaler: the fused kernel (seen with torch 2.11)
    advances the momentum on the overflow steps that the scaler skips."""
    return "fused" if cuda and not grad_scaler else "foreach"


def make_sgd(parameters, config):
    impl = config["optimizer_impl"]
    return torch.optim.SGD(parameters, lr=config["lr"], momentum=config["momentum"], fused=impl == "fused",
                           foreach=impl == "foreach")


def flops_per_image(config):
    """Training FLOPs of one image (forward and backward), counted on the meta device by PyTorch's counter."""
    from torch.utils.flop_counter import FlopCounterMode
    with torch.device("meta"):
        model = build_model(config["model"])
    with FlopCounterMode(display=False) as counter:
        model(torch.empty(2, 3, config["image_size"], config["image_size"], device="meta")).float().sum().backward()
    return counter.get_total_flops() / 2


def throughput_and_stability(per_rank, batch):
    """img/s over the slowest rank's wall time, rank 0's per-step rate, and whether one run is enough: its halves
    agree within 1 % and the host runs ahead of the GPU (not host-bound). (None, None, None) without timed steps."""
    times, steps = per_rank["step_times_ms"][0], min(map(len, per_rank["step_times_ms"]))
    wall = max(per_rank["timed_wall_s"])
    if not (steps and wall > 0):
        return None, None, None
    rate = batch * steps / wall
    lead = summarize(sum(per_rank["host_lead_ms"], [])) if per_rank["host_lead_ms"][0] is not None else None
    halves = sum(times[:len(times) // 2]) / sum(times[-(len(times) // 2):]) if len(times) > 1 else 1.0
    reasons = [text for bad, text in ((abs(halves - 1) > 0.01, "halves differ"),
                                      (lead and lead["median"] < 1, "host-bound")) if bad]
    rank0 = summarize([batch * 1e3 / t for t in times if t])
    throughput = {"images_per_second": rate, "images_per_second_per_device": rate / len(per_rank["rank"]),
                  "timed_steps": steps, "timed_wall_s": wall, "rank0_median_images_per_second": rank0["median"],
                  "rank0_mad_images_per_second": rank0["mad"]}
    stability = {"second_half_over_first": halves, "host_lead_ms_median": lead and lead["median"], "host_ahead":
                 lead and lead["median"] >= 1, "noisy": bool(reasons), "reason": ", ".join(reasons) or None}
    return throughput, stability, lead


def replica_checks(per_rank):
    """The replicas agree when every rank's per-tensor sums lie within REPLICA_TOLERANCE of rank 0's (NaN equals
    NaN, and lies infinitely far from a number); the loss is finite; the step times add up to the wall time."""
    reference, largest = per_rank["checksums"][0], 0.0
    close = [torch.isclose(sums, reference, REPLICA_TOLERANCE, REPLICA_TOLERANCE, equal_nan=True)
             for sums in per_rank["checksums"]]
    for sums, agree in zip(per_rank["checksums"], close):
        largest = max(largest, float(torch.where(agree, 0.0, (sums - reference).abs().nan_to_num(nan=math.inf)).max()))
    ratios = [sum(times) / 1e3 / wall for times, wall in zip(per_rank["step_times_ms"], per_rank["timed_wall_s"])
              if wall > 0 and times]
    return {"loss_finite": all(map(math.isfinite, sum(per_rank["losses"], []))), "event_time_over_wall": ratios,
            "timing_consistent": len(ratios) == len(per_rank["rank"]) and all(0.95 <= q <= 1.02 for q in ratios),
            "steps_run_per_rank": per_rank["steps_run"], "parameters_synchronized": all(bool(c.all()) for c in close),
            "parameter_max_abs_diff": largest, "final_parameter_checksum": reference.sum(0).tolist()}


def run_status(per_rank, checks, expected_steps):
    """(status, failure message): error (steps missing, loss not finite), else desync, else ok."""
    first_bad = next((i + 1 for i, v in enumerate(per_rank["losses"][0]) if not math.isfinite(v)), "?")
    for broken, status, message in (
            (per_rank["steps_run"] != [expected_steps] * len(per_rank["rank"]), "error",
             f"ranks ran {per_rank['steps_run']} steps, expected {expected_steps}"),
            (not checks["loss_finite"], "error", f"the loss is not finite from step {first_bad} on rank 0"),
            (not checks["parameters_synchronized"], "desync",
             f"parameters differ across ranks by up to {checks['parameter_max_abs_diff']:.3g}")):
        if broken:
            return status, message
    return "ok", None


def print_banner(config, launch):
    print(f"== {config['benchmark']} | {config['strategy']} | {launch['world_size']} x {config['device']} on "
          f"{launch['num_nodes']} node(s) | {launch['launcher']} | batch {config['batch_size_per_device']}/device | "
          f"{config['image_size']} px | {config['precision']} | {config['memory_format']} | compile "
          f"{config['compile_mode']} | {config['warmup_steps']} + {config['steps']} steps", flush=True)


def print_summary(result):
    config, throughput, mfu = result["config"], result["throughput"], result["efficiency"]["mfu"]
    print(f"\n| strategy | devices | batch/device | img/s | img/s/device | median step ms | peak MiB | MFU |\n"
          f"|---|---|---|---|---|---|---|---|\n| {config['strategy']} | {result['hardware']['device_count']} | "
          f"{config['batch_size_per_device']} | {throughput['images_per_second']:,.0f} | "
          f"{throughput['images_per_second_per_device']:,.0f} | {result['step_time_ms']['median']:.2f} | "
          f"{result['memory']['peak_allocated_mib'] or '-'} | {f'{mfu:.1%}' if mfu else '-'} |", flush=True)
    if result["stability"]["noisy"]:
        print(f"noisy: repeat or interleave ({result['stability']['reason']})", flush=True)


def write_json_atomically(result, path, overwrite):
    """Whole or absent for readers: a temporary file in the folder, then renamed (--overwrite) or hard-linked to
    path: the link fails where another run wrote path meanwhile, which stays as that run left it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = os.path.join(os.path.dirname(path), f".tmp-{uuid.uuid4().hex}.json")
    try:
        document = json.loads(json.dumps(result), parse_constant=lambda nan_or_infinity: None)  # JSON has neither
        with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "w") as stream:
            stream.write(json.dumps(document, indent=1, allow_nan=False) + "\n")
            stream.flush()
            os.fsync(stream.fileno())
        (os.replace if overwrite else os.link)(temporary, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def shut_down(step=None):
    """Free a captured step's graph before the process group: a live graph holding NCCL kernels makes
    destroy_process_group hang (pytorch/pytorch#115388)."""
    if hasattr(step, "reset"):
        step.reset()
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


class Run:
    """One rank's run, in order: device, joining the others, around each step, result (or a one-rank "oom" one).
    on_result(result), when given, adds the script's own figures to rank 0's result before it is written."""

    def __init__(self, config, launch, device_count, on_result=None):
        self.config, self.launch, self.on_result = config, launch, on_result
        self.rank, self.world_size, self.monitor = launch["rank"], launch["world_size"], None
        self.losses, self.marks, self.started, self.record = [], [], None, {"rank": self.rank}
        self.device = self.claim_device(device_count)
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(config["steps"] + 1)] if \
            self.device.type == "cuda" else []
        self.timeout = datetime.timedelta(seconds=config["timeout_s"])  # every wait of the process group
        software, git, self.hardware = collect_environment(self.device, self.rank)
        self.wall_start = time.perf_counter()
        world = {key: launch[key] for key in ("world_size", "num_nodes", "launcher", "slurm_job_id", "master_addr",
                                              "master_port")}
        self.result = {"schema_version": SCHEMA_VERSION, "benchmark": config["benchmark"], "strategy":
                       config["strategy"], "launch_id": LAUNCH_ID, "status": "error", "config": config, "software":
                       software, "git": git, "world": {"devices_per_node": launch["local_world_size"], "backend":
                       config["backend"], **world}, **dict.fromkeys(RESULT_FIGURES),
                       "started_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}

    def claim_device(self, device_count):
        if self.config["device"] != "cuda":
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.launch["local_world_size"]))
            self.config["cpu_threads_per_rank"] = torch.get_num_threads()
            return torch.device("cpu")
        device = torch.device("cuda", self.launch["local_rank"] % device_count)  # Slurm may bind a GPU per task
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = self.config["cudnn_benchmark"]
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        return device

    def ddp_options(self):
        """DistributedDataParallel's keywords (broadcast_buffers is forward_sync_buffers in newer torch)."""
        buffers = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(
            DistributedDataParallel.__init__).parameters else "broadcast_buffers"
        return {buffers: self.config["broadcast_buffers"], **{key: self.config[key] for key in (
            "bucket_cap_mb", "static_graph", "gradient_as_bucket_view")}}

    def synthetic_batch(self):
        """A distinct batch per rank, made once on the device and reused every step."""
        size, batch, device = self.config["image_size"], self.config["batch_size_per_device"], self.device
        generator = torch.Generator(device=device).manual_seed(self.config["seed"] + 1 + self.rank)
        images = torch.randn(batch, 3, size, size, generator=generator, device=device)
        labels = torch.randint(0, NUM_CLASSES, (batch,), generator=generator, device=device)
        layout = torch.channels_last if self.config["memory_format"] == "channels_last" else torch.contiguous_format
        return images.contiguous(memory_format=layout), labels

    def join_ranks(self):
        """The process group (unless a framework or an earlier Run made it), --timeout bounding its every wait, and
        a gloo group for the host-side barrier and gathers. The meeting itself ends within --timeout (meet_within)."""
        meeting = getattr(self, "meeting", None) or self.meet_within()
        # env://'s store (torchrun's agent may host it), but its waits outlast the deadline: no C++ stack first
        served, launch = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True", self.launch
        with contextlib.suppress(RuntimeError):  # registered once a process
            dist.register_rendezvous_handler(f"bench{LAUNCH_ID}", lambda url, timeout, **_: iter([(dist.TCPStore(
                launch["master_addr"], launch["master_port"], launch["world_size"], launch["rank"] == 0 and not
                served, 2 * timeout, multi_tenant=True), launch["rank"], launch["world_size"])]))
        try:
            if self.world_size > 1 and not dist.is_initialized():
                dist.init_process_group(self.config["backend"], f"bench{LAUNCH_ID}://", rank=self.rank,
                                        world_size=self.world_size, timeout=self.timeout,
                                        device_id=self.device if self.device.type == "cuda" else None)
            if self.world_size > 1:
                self.monitor = dist.new_group(backend="gloo", timeout=self.timeout)
        except RuntimeError as error:  # torch's own report said why (a master that ended): then one line, as above
            print(f"{self.config['benchmark']}: error on rank {self.rank}: the ranks did not meet: "
                  f"{str(error).splitlines()[0][:200]}", file=sys.stderr, flush=True)
            sys.exit(EXIT_CODES["error"])
        finally:
            meeting.cancel()
        if self.rank == 0:
            print_banner(self.config, self.launch)

    def meet_within(self):
        """A deadline of --timeout on meeting the others, which join_ranks() cancels: past it, one line and exit 1.
        torch waits for ever on a master's port that accepts and never answers, and retries a dead one past it."""
        def give_up():
            where = f"{self.launch['master_addr']}:{self.launch['master_port']}"
            print(f"{self.config['benchmark']}: error on rank {self.rank}: the ranks did not meet at {where} within "
                  f"--timeout {self.config['timeout_s']} s", file=sys.stderr, flush=True)
            os._exit(EXIT_CODES["error"])
        self.meeting = threading.Timer(self.timeout.total_seconds(), give_up)
        self.meeting.daemon = True
        self.meeting.start()
        return self.meeting

    def before_step(self, index):
        """Peak memory from the second step (the first autotunes and compiles); a synchronised timed start."""
        if index == 1 and self.events:
            torch.cuda.reset_peak_memory_stats(self.device)
        if index == self.config["warmup_steps"]:
            if self.events:
                torch.cuda.synchronize(self.device)
            if self.world_size > 1:
                dist.barrier(group=self.monitor)
            self.started = time.perf_counter()
            self.mark()

    def mark(self):
        if self.events:  # a CUDA event: no host sync
            self.events[len(self.marks)].record()
        self.marks.append(time.perf_counter())

    def after_step(self, index, loss):
        """The step's end marked; the loss stays on the device (reading it would sync)."""
        self.losses.append(loss)
        warmup = self.config["warmup_steps"]
        timed = index >= warmup
        shown, total = (index - warmup, self.config["steps"]) if timed else (index, warmup)
        if timed:
            self.mark()
        if self.rank == 0 and (not timed or shown == 0 or (shown + 1) % max(1, total // 5) == 0 or shown + 1 == total):
            print(f"  {'measuring' if timed else 'warm-up'} step {shown + 1}/{total} (queued)", flush=True)

    def collect_record(self, parameters):
        """This rank's timings, losses, peak memory and per-tensor parameter checksums, after its last step."""
        cuda, marks, events = self.device.type == "cuda", self.marks, self.events
        if cuda:
            torch.cuda.synchronize(self.device)
        times = [a.elapsed_time(b) for a, b in zip(events, events[1:len(marks)])] if cuda else \
            [(b - a) * 1e3 for a, b in zip(marks, marks[1:])]
        peaks = [round(measure(self.device) / 2**20, 1) if cuda else None
                 for measure in (torch.cuda.max_memory_allocated, torch.cuda.max_memory_reserved)]
        self.record.update(
            hardware=self.hardware, timed_wall_s=time.perf_counter() - self.started if self.started else 0.0,
            step_times_ms=times, steps_run=len(self.losses), peak_allocated_mib=peaks[0], peak_reserved_mib=peaks[1],
            # how long after the host queued each step's end the GPU reached it: ~0 when the GPU waits for the host
            host_lead_ms=[events[0].elapsed_time(events[i]) - (marks[i] - marks[0]) * 1e3
                          for i in range(1, len(marks))] if cuda else None,
            losses=torch.stack(self.losses).float().cpu().tolist() if self.losses else [],
            # per tensor, the float64 sum and sum of squares: equal on every rank when the replicas agree
            checksums=torch.stack([torch.stack([p.detach().double().sum(), p.detach().double().pow(2).sum()])
                                   for p in parameters]).cpu())
        return self.record

    def finish(self, record):
        """Every rank's record gathered; rank 0 completes, judges and writes the result. Returns the exit code."""
        records = [record] * self.world_size
        if self.world_size > 1:
            dist.all_gather_object(records, record, group=self.monitor)
        if self.rank != 0:
            return 0
        per_rank = {key: [r[key] for r in records] for key in records[0]}
        self.result.update(self.figures(per_rank))
        checks = replica_checks(per_rank)
        status, message = run_status(per_rank, checks, self.config["warmup_steps"] + self.config["steps"])
        self.result.update(checks=checks, status=status, failure=message and {"kind": status, "rank": None,
                                                                              "message": message})
        if self.result["throughput"]:
            print_summary(self.result)
        if self.on_result:
            self.on_result(self.result)
        return self.write_result(EXIT_CODES[status])

    def figures(self, per_rank):
        """Throughput, stability, step times, memory, efficiency and hardware from the gathered records."""
        config, world, hosts = self.config, len(per_rank["rank"]), per_rank["hardware"]
        allocated, reserved = per_rank["peak_allocated_mib"], per_rank["peak_reserved_mib"]
        throughput, stability, lead = throughput_and_stability(per_rank, config["global_batch_size"])
        flops, gpu = flops_per_image(config), hosts[0].get("gpu_name") or ""
        peak = next((PEAK_TFLOPS[key][config["precision"] == "fp32"] for key in PEAK_TFLOPS if key in gpu and
                     "PCIe" not in gpu and "NVL" not in gpu), None)
        achieved = throughput and flops * throughput["images_per_second"] / 1e12
        return {"throughput": throughput, "stability": stability, "step_times_ms_per_rank": per_rank["step_times_ms"],
                "step_time_ms": summarize(sum(per_rank["step_times_ms"], [])), "loss_per_step": per_rank["losses"][0],
                "host_lead_ms": lead, "host_lead_ms_per_rank": lead and per_rank["host_lead_ms"], "memory": {
                    "peak_allocated_mib": allocated[0] and max(allocated), "peak_reserved_mib": reserved[0] and max(
                        reserved), "window": "every step after the first (warm-up, a CUDA graph's capture, timed "
                    "steps)", "per_rank": [{"rank": rank, "peak_allocated_mib": a, "peak_reserved_mib": r}
                                           for rank, a, r in zip(per_rank["rank"], allocated, reserved)]},
                "efficiency": {"model_flops_per_image": flops, "achieved_tflops": achieved, "peak_tflops_per_device":
                               peak, "mfu": achieved and peak and achieved / (peak * world)},
                "hardware": {"ranks": [{k: v for k, v in h.items() if k != "host"} for h in hosts], "device_count":
                             world, "hostnames": sorted({h["hostname"] for h in hosts}), **hosts[0]["host"]}}

    def write_result(self, code):
        """Rank 0's result file and its closing lines; returns the exit code (1 when no file could be written)."""
        config, failure = self.config, self.result["failure"]
        self.result["wall_time_s"] = time.perf_counter() - self.wall_start
        path, problem = config["output"], None
        try:
            write_json_atomically(self.result, path, config["overwrite"])
        except Exception as error:  # noqa: BLE001 - said in one line; the run then ends with an error code
            path = problem = f"no result written ({type(error).__name__}: {error})"
        print(f"result: {self.result['status']} -> {path}", flush=True)
        said = [text for text in (failure and f"{failure['kind']}: {failure['message']}", problem) if text]
        if said:
            print(f"{config['benchmark']}: " + "; ".join(said), file=sys.stderr, flush=True)
        return code or (EXIT_CODES["error"] if problem else 0)

    def out_of_memory(self, error):
        """A one-rank run out of memory writes its "oom" result, exit code 4: batch sweeps look for the largest
        batch that fits. Any other error is raised again."""
        if self.world_size > 1 or not out_of_memory(error):
            raise error
        text = str(error).strip().splitlines()
        self.result.update(status="oom", failure={
            "kind": "oom", "rank": 0, "message": f"{type(error).__name__}: {text[0] if text else ''}",
            "batch_size_per_device": self.config["batch_size_per_device"]})
        return self.write_result(EXIT_CODES["oom"])


def out_of_memory(error):
    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or bool(
        re.search("out of memory|can't allocate memory", str(error), re.I))


def run_guarded(main, script):
    """main's exit code. Bad input: one line on every rank, exit 2. An error propagates: its traceback, which @record
    hands to torchrun's summary, and exit 1; the launcher ends the other ranks."""
    try:
        sys.exit(main())
    except UsageError as error:
        print(f"{script}: error: {error}", file=sys.stderr, flush=True)
        sys.exit(EXIT_CODES["usage"])


# ============================================================================ end of harness


if __name__ == "__main__":
    run_guarded(main, SCRIPT)
