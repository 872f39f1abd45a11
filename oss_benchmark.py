"""Optimizer-state and gradient sharding benchmark: DDP, fairscale OSS/ShardedDDP, ZeRO-1, FSDP2, one workload.

Every strategy trains the same randomly initialised torchvision model (default ResNet-50) on the same
synthetic per-rank batches through the same harness as ddp_resnet50.py (warm-up excluded, CUDA-event step
times, parameter check across ranks, one JSON result per strategy). After the timed steps each strategy runs
an instrumented pass (per-phase times) and a profiled pass (collectives by kind, count and bytes), which go
into the result under "analysis" next to the analytic communication volumes and memory expectations.

Strategies (--strategy: one, a comma list run in that order, or all: every strategy the backend can run, one
after another in the order ddp, zero1, fsdp_zero2, fsdp_zero3, oss_ddp, oss_sharded_ddp, zero1_overlap):
    ddp              DistributedDataParallel + the plain optimizer (the baseline)
    oss_ddp          DDP + fairscale.optim.OSS (optimizer state sharded, ZeRO-1 as fairscale does it)
    oss_sharded_ddp  fairscale ShardedDataParallel + OSS (gradients reduced to their owner, ZeRO-2)
    zero1            DDP + torch.distributed.optim.ZeroRedundancyOptimizer
    zero1_overlap    the same, its step and broadcast run inside DDP's backward (ZeRO comm hook; NCCL only)
    fsdp_zero2       FSDP2 fully_shard per --fsdp-units (default model), reshard_after_forward=False
    fsdp_zero3       FSDP2 fully_shard per --fsdp-units, reshard_after_forward=True

Launch recipes (two ranks at least: sharding over one rank means nothing):

    # every strategy on all GPUs of a node, SGD, then Adam (state 2x the parameters)
    torchrun --standalone --nproc-per-node 2 oss_benchmark.py --output results/rn50-sgd.json
    torchrun --standalone --nproc-per-node 2 oss_benchmark.py --optimizer adam --output results/rn50-adam.json
    # fairscale's own benchmark conditions (resnet101, 28 px, 256/rank, fp32, RMSprop), synthetic data
    torchrun --standalone --nproc-per-node 2 oss_benchmark.py --preset fairscale --output results/fairscale.json
    # one strategy, Slurm, one task per GPU
    srun --ntasks-per-node 4 --gpus-per-node 4 python oss_benchmark.py --strategy fsdp_zero2 --output fsdp.json
    # CPU smoke run (gloo), as in CI
    torchrun --standalone --nproc-per-node 2 oss_benchmark.py --device cpu --image-size 32 \\
        --batch-size-per-device 4 --warmup-steps 2 --steps 4 --output /tmp/oss.json
    # rebuild the comparison table from result files, no training
    python oss_benchmark.py --table results/rn50-sgd-*.json

With several strategies, --output x.json names the results x-<strategy>.json (printed before the run).
Numbers: "Median throughput (img/s) (rank 0) +/- MAD" is the global batch over rank 0's median step time,
with the median absolute deviation over the timed steps. fairscale's benchmark times epochs instead (one
rank's images over each epoch, median and MAD over the epochs): --steps-per-epoch K adds that statistic
over epochs of K steps, in global images (divide by the world size to compare with fairscale's per-rank
figures; its MNIST epoch is 117 steps on 2 ranks at 256). Peak memory is torch.cuda.max_memory_allocated
over the timed steps, the largest rank. Exit codes: 0 ok, 1 error, 2 bad input, 3 parameters out of sync,
4 out of memory, 128+N interrupted by signal N; with several strategies the first non-zero one.
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
import signal
import socket
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel

BENCHMARK = "oss_benchmark.py"
NUM_CLASSES = 1000
STRATEGIES = ("ddp", "oss_ddp", "oss_sharded_ddp", "zero1", "zero1_overlap", "fsdp_zero2", "fsdp_zero3")
# The order --strategy all runs them in: a failure ends the launch (the harness exits), so the code paths that
# depend on the least-travelled library code (fairscale 0.4.13 on a new torch, the ZeRO comm hook) go last.
RUN_ORDER = ("ddp", "zero1", "fsdp_zero2", "fsdp_zero3", "oss_ddp", "oss_sharded_ddp", "zero1_overlap")
FAIRSCALE_STRATEGIES = ("oss_ddp", "oss_sharded_ddp")
# Strategies a backend refuses, with the reason in words.
BACKEND_REFUSALS = {("gloo", "zero1_overlap"): "its ZeRO DDP comm hook refuses gloo, where it may hang "
                                               "(pytorch/pytorch#62300): run it on GPUs (NCCL)"}
OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
              "rmsprop": torch.optim.RMSprop}
# Without --lr: SGD's rate from the harness would make Adam-like optimizers diverge within a few steps.
DEFAULT_LR = {"sgd": 0.1, "adam": 1e-3, "adamw": 1e-3, "rmsprop": 1e-4}
PRESETS = {
    # fairscale benchmarks/oss.py as released: MNIST (28 px, grey repeated to 3 channels), 256 per rank, fp32,
    # RMSprop(lr=1e-4, momentum=0.9), torchvision resnet101, NCHW. Synthetic data replaces MNIST here.
    "fairscale": {"model": "resnet101", "image_size": 28, "batch_size_per_device": 256, "precision": "fp32",
                  "optimizer": "rmsprop", "lr": 1e-4, "momentum": 0.9, "memory_format": "contiguous"},
}
COLLECTIVE_KINDS = ("all-reduce", "reduce", "broadcast", "all-gather", "reduce-scatter", "other")
PHASES = ("parameter_sync_before_forward", "forward", "backward", "optimizer_step", "parameter_sync")
PHASE_NOTES = {
    "ddp": "forward includes DDP's broadcast of the module buffers from rank 0; backward includes the bucketed "
           "gradient all-reduce, overlapped with the backward computation",
    "oss_ddp": "as ddp for forward and backward; optimizer_step updates this rank's shard only; parameter_sync is "
               "OSS broadcasting every rank's updated shard after a device synchronize, not overlapped",
    "oss_sharded_ddp": "forward includes ShardedDDP's blocking broadcast of every buffer one by one; backward "
                       "includes reducing each gradient to its owner (the small bucketed ones when backward "
                       "ends); optimizer_step and parameter_sync as oss_ddp",
    "zero1": "as ddp for forward and backward; parameter_sync is ZeroRedundancyOptimizer broadcasting each rank's "
             "parameter bucket",
    "zero1_overlap": "backward includes the all-reduce, this rank's optimizer step and the parameter broadcasts, "
                     "all run from DDP's comm hook; optimizer_step is empty",
    "fsdp_zero2": "parameter_sync_before_forward is an explicit unshard (all-gather) of every FSDP unit, which the "
                  "timed steps do inside forward; backward includes the gradient reduce-scatter",
    "fsdp_zero3": "as fsdp_zero2, and backward also all-gathers every unit again (resharded after forward)",
}


# ============================================================================ harness
# From here to "end of harness" the text is identical in ddp_resnet50.py,
# lightning/ddp_resnet50.py and oss_benchmark.py (tests/test_harness_copies.py keeps it so).
# Change it in one file, then run `python tools/sync_harness.py` to copy it to the others.

SCHEMA_VERSION = 1
DEFAULT_BATCH_GPU, DEFAULT_BATCH_CPU = 256, 8
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_DESYNC, EXIT_OOM = 0, 1, 2, 3, 4
AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# Dense tensor-core peaks in TFLOP/s from the vendors' datasheets, for the hardware-efficiency figure.
# H100/H200 figures are the SXM parts'; their PCIe and NVL parts run lower clocks and get no figure.
PEAK_TFLOPS = {
    "H200": {"bf16": 989.0, "fp16": 989.0, "fp32": 494.0},
    "H100": {"bf16": 989.0, "fp16": 989.0, "fp32": 494.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0},
}
SEED_LIMIT = 2**62  # torch.manual_seed takes 64 bits; the data seeds add 1 + rank


class UsageError(Exception):
    """Bad input: one line naming the broken rule, exit code 2, nothing written."""


class LaunchError(UsageError):
    """Bad launcher or Slurm variables: they may differ between ranks, so every rank says what it saw."""


class OneLineArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def positive_int(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or a positive integer, got {text}")
    return value


def positive_float(text):
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def seed_value(text):
    value = int(text)
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to 2**62 - 1, got {text}")
    return value


def timeout_seconds(text):
    value = positive_int(text)
    if value > 7 * 86400:
        raise argparse.ArgumentTypeError(f"must be at most 604800 (7 days), got {text}")
    return value


def add_harness_arguments(parser):
    batch = parser.add_mutually_exclusive_group()
    batch.add_argument("--batch-size-per-device", type=positive_int,
                       help=f"weak scaling: images per device (default {DEFAULT_BATCH_GPU} on GPU, "
                            f"{DEFAULT_BATCH_CPU} on CPU)")
    batch.add_argument("--global-batch-size", type=positive_int,
                       help="strong scaling: images per step over all devices; must divide by the world size")
    parser.add_argument("--warmup-steps", type=positive_int, default=10, help="untimed steps first (default 10)")
    parser.add_argument("--steps", type=positive_int, default=50, help="timed steps (default 50)")
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                        help="auto: bf16 where the GPU supports it, else fp16; fp32 on the CPU. "
                             "fp32 uses TF32 tensor cores on GPUs that have them")
    parser.add_argument("--memory-format", choices=["auto", "channels_last", "contiguous"], default="auto",
                        help="auto: channels_last on GPU, contiguous on CPU")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--compile-mode", choices=["default", "reduce-overhead", "max-autotune",
                                                   "max-autotune-no-cudagraphs"],
                        help="torch.compile mode (implies --compile)")
    parser.add_argument("--coordinate-descent-tuning", action="store_true",
                        help="torch.compile: Inductor tunes the launch settings of each Triton kernel it generates "
                             "by coordinate descent (max-autotune does too, besides autotuning convolutions and "
                             "matrix products); minutes more compilation the first time")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cuda (NCCL) or cpu (gloo, the smoke-test path); default cuda")
    parser.add_argument("--image-size", type=positive_int, default=224, help="square input size (default 224)")
    parser.add_argument("--lr", type=positive_float, default=0.1, help="learning rate (default 0.1)")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    parser.add_argument("--seed", type=seed_value, default=0, help="weights seed; rank r's data uses seed + 1 + r")
    parser.add_argument("--output", help="result JSON path (default runs/<script>-<strategy>-<world><device>-"
                                         "<precision>-<Slurm job id or process id>.json)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    parser.add_argument("--cudnn-benchmark", action=argparse.BooleanOptionalAction,
                        help="let cuDNN time its convolution algorithms in each process and keep the fastest "
                             "(default on GPU); without it cuDNN's heuristics pick them, the same in every process")
    parser.add_argument("--cudnn-benchmark-limit", type=non_negative_int,
                        help="with cuDNN's autotuning, how many of its candidate algorithms per convolution to time "
                             "(PyTorch's default: 10, in the order of cuDNN's heuristics); 0 times every one")
    parser.add_argument("--steps-per-epoch", type=positive_int, metavar="K",
                        help="also report throughput per epoch of K timed steps, median and MAD over the epochs "
                             "(rank 0), the statistic fairscale's benchmark prints; needs --steps of 3 K or more")
    parser.add_argument("--timeout", type=timeout_seconds, default=300,
                        help="seconds a collective may wait for the other ranks before the run fails (default 300)")
    # Test hooks: make one rank fail on purpose (desync, oom, crash) to prove the failure paths.
    parser.add_argument("--inject-fault", choices=["desync", "oom", "crash"], help=argparse.SUPPRESS)
    parser.add_argument("--inject-fault-rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--inject-fault-step", type=int, default=1, help=argparse.SUPPRESS)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default only where the help text does not already say it and there is one to show."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


def add_ddp_arguments(parser, cuda_graphs, fixed_loss_scale):
    parser.add_argument("--bucket-cap-mb", type=bucket_megabytes, default=25.0, help="DDP gradient bucket size")
    parser.add_argument("--gradient-as-bucket-view", action=argparse.BooleanOptionalAction, default=True,
                        help="let gradients alias DDP's buckets: saves DDP's copy of every gradient back from its "
                             "bucket after the all-reduce (the copy in remains: gradients are set to None every "
                             "step); on by default here, off in PyTorch's own DDP")
    parser.add_argument("--broadcast-buffers", action=argparse.BooleanOptionalAction, default=True,
                        help="DDP broadcasts rank 0's buffers (BatchNorm statistics) before every forward; "
                             "without it each rank keeps its own statistics")
    parser.add_argument("--static-graph", action="store_true", help="tell DDP the graph never changes")
    parser.add_argument("--comm-hook", choices=COMM_HOOKS, default="none",
                        help="DDP communication hook: none (DDP's own all-reduce of the fp32 gradients, the "
                             "default) or PyTorch's bf16_compress / fp16_compress (ddp_comm_hooks.default_hooks): "
                             "each bucket is cast to bf16 / fp16 and divided by the world size for the all-reduce "
                             "(half the bytes), then copied back, so the averaged gradient keeps 8 / 11 significant "
                             "bits")
    parser.add_argument("--compiled-ddp", choices=["ddp_optimizer", "python_reducer", "no_optimization"],
                        help="how torch.compile treats DDP (torch._dynamo.config.optimize_ddp): split the graph at "
                             "bucket boundaries (PyTorch's default), trace the reducer with compiled autograd, or "
                             "one graph with all-reduce after backward")
    if cuda_graphs:
        parser.add_argument("--cuda-graphs", action="store_true",
                            help="capture the whole training step (forward, backward with DDP's all-reduce, "
                                 "optimizer step) in one CUDA graph after the eager warm-up, and replay it (the "
                                 "Lightning twin runs its step with manual optimization for it)")
    if fixed_loss_scale:
        parser.add_argument("--loss-scale", type=loss_scale_value, default="dynamic",
                            help="fp16 only: dynamic (GradScaler, default) or a fixed power of two S: the loss "
                                 "is multiplied by S and the gradients by 1/S with no overflow check, so the step "
                                 "needs no host sync and fits a CUDA graph; a non-finite loss fails the run")


COMM_HOOKS = ("none", "bf16_compress", "fp16_compress")


def comm_hook_function(config):
    """The DDP communication hook --comm-hook names (None: DDP's own all-reduce)."""
    if config["comm_hook"] == "none":
        return None
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return getattr(default_hooks, f"{config['comm_hook']}_hook")


def bucket_megabytes(text):
    value = positive_float(text)
    if value > 1e6:  # DDP turns it into a C++ byte count
        raise argparse.ArgumentTypeError(f"must be at most 1e6 MB, got {text}")
    return value


def loss_scale_value(text):
    if text == "dynamic":
        return text
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (1 <= value <= 2**24 and math.frexp(value)[0] == 0.5):  # larger scales overflow fp16 gradients
        raise argparse.ArgumentTypeError(f"must be dynamic or a power of two from 1 to 2**24, got {text}")
    return value


def resolve_ddp_options(args, config, world_size):
    """DDP, compiled-DDP, Inductor-tuning and CUDA-graph options, checked like the rest before any GPU work."""
    if args.compiled_ddp and not config["compile"]:
        raise UsageError("--compiled-ddp needs --compile or --compile-mode")
    if args.coordinate_descent_tuning and not config["compile"]:
        raise UsageError("--coordinate-descent-tuning needs --compile or --compile-mode: it tunes Inductor's kernels")
    cuda_graphs = bool(getattr(args, "cuda_graphs", False))
    loss_scale = getattr(args, "loss_scale", "dynamic")
    if args.comm_hook != "none" and cuda_graphs:
        raise UsageError(f"--comm-hook {args.comm_hook} with --cuda-graphs is not supported: the hook copies the "
                         f"all-reduced bucket back in a future's callback, which was not tried inside a capture")
    if args.comm_hook != "none" and args.compiled_ddp == "python_reducer":
        raise UsageError(f"--comm-hook {args.comm_hook} does not apply to --compiled-ddp python_reducer: compiled "
                         f"autograd traces DDP's own all-reduce, not a hook")
    if loss_scale != "dynamic" and config["precision"] != "fp16":
        raise UsageError(f"--loss-scale {loss_scale:g} needs --precision fp16 (bf16 and fp32 need no loss scaling)")
    config.update(bucket_cap_mb=args.bucket_cap_mb, static_graph=args.static_graph,
                  gradient_as_bucket_view=args.gradient_as_bucket_view, broadcast_buffers=args.broadcast_buffers,
                  comm_hook=args.comm_hook,
                  # what runs: without a choice PyTorch splits a compiled graph at DDP's buckets (ddp_optimizer)
                  compiled_ddp=args.compiled_ddp or ("ddp_optimizer" if config["compile"] and world_size > 1
                                                     else None), cuda_graphs=cuda_graphs,
                  loss_scale=loss_scale if config["precision"] == "fp16" else None,
                  grad_scaler=config["grad_scaler"] and loss_scale == "dynamic")
    if cuda_graphs:
        if config["device"] != "cuda":
            raise UsageError("--cuda-graphs needs --device cuda")
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"  # NCCL's watchdog must not poll captured work
        if config["compile_mode"] in ("reduce-overhead", "max-autotune"):
            raise UsageError(f"--cuda-graphs conflicts with --compile-mode {config['compile_mode']}, which "
                             f"captures its own CUDA graphs: use --compile-mode default or max-autotune-no-cudagraphs")
        if config["grad_scaler"]:
            raise UsageError("--cuda-graphs with fp16 needs a fixed --loss-scale (e.g. 1024): the dynamic GradScaler "
                             "reads found_inf on the host every step, which a captured graph cannot do")
        needed = 12 if world_size > 1 else 2
        if config["warmup_steps"] < needed:
            raise UsageError(f"--cuda-graphs needs --warmup-steps >= {needed}: the last warm-up step is the capture"
                             + (", after the 11 eager DDP steps that DDP needs first" if world_size > 1 else ""))
    config["coordinate_descent_tuning"] = False
    if config["compile"]:
        import torch._inductor.config as inductor_config
        if args.coordinate_descent_tuning:
            inductor_config.coordinate_descent_tuning = True
        # what runs: the option, TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1, or a max-autotune mode (which sets it)
        config["coordinate_descent_tuning"] = (bool(inductor_config.coordinate_descent_tuning)
                                               or config["compile_mode"].startswith("max-autotune"))
    if args.compiled_ddp:
        torch._dynamo.config.optimize_ddp = args.compiled_ddp
        torch._dynamo.config.compiled_autograd = args.compiled_ddp == "python_reducer"


def ddp_buffer_option(config):
    """DDP's keyword for the buffer broadcast: broadcast_buffers, renamed forward_sync_buffers in newer torch."""
    name = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(
        DistributedDataParallel.__init__).parameters else "broadcast_buffers"
    return {name: config["broadcast_buffers"]}


def sgd_implementation(config):
    """Fused SGD (one launch for all tensors) on the GPU, except with fp16's GradScaler: in torch 2.11 the
    fused kernel still advances the momentum on the overflow steps the scaler skips, and the weights blow up
    (seen on the H200; https://github.com/LibreYOLO/libreyolo/pull/771). The unfused path that the scaler
    then needs reads found_inf on the host once per step."""
    return "fused" if config["device"] == "cuda" and not config["grad_scaler"] else "foreach"


def parse_slurm_tasks_per_node(text):
    """'4(x2),3' -> [4, 4, 3] (the format of SLURM_STEP_TASKS_PER_NODE)."""
    counts = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise LaunchError(f"cannot read Slurm's tasks per node {text!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def first_slurm_host(nodelist):
    """First host of a Slurm node list: 'gpu[007-009,012],cpu1' -> 'gpu007'."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise LaunchError(f"cannot read Slurm's node list {nodelist!r}")
    prefix, ranges = match.groups()
    return prefix + (ranges.split(",")[0].split("-")[0] if ranges else "")


def detect_launch(env):
    """Rank layout from torchrun's variables, else Slurm's (srun), else one process."""
    def integer(name):
        if name not in env:
            raise LaunchError(f"{name} is not set, but the other launcher variables are")
        try:
            return int(env[name])
        except ValueError:
            raise LaunchError(f"{name}={env[name]!r} is not an integer") from None

    def port(name, default):
        value = integer(name) if name in env else default
        if not 1 <= value <= 65535:
            raise LaunchError(f"{name}={value} is not a port (1-65535)")
        return value

    launch = {"slurm_job_id": env.get("SLURM_JOB_ID")}
    if "RANK" in env and "WORLD_SIZE" not in env:  # (WORLD_SIZE alone: Lightning's own workers carry it)
        raise LaunchError("RANK is set without WORLD_SIZE: set both (torchrun does), or neither for one process")
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = integer("RANK"), integer("WORLD_SIZE")
        local_rank = integer("LOCAL_RANK") if "LOCAL_RANK" in env else rank
        local_world = integer("LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
        if not (0 <= rank < world and 0 <= local_rank < local_world <= world) or world % local_world:
            raise LaunchError(f"inconsistent launcher variables: RANK={rank} WORLD_SIZE={world} "
                             f"LOCAL_RANK={local_rank} LOCAL_WORLD_SIZE={local_world}")
        launch.update(launcher="torchrun" if "TORCHELASTIC_RUN_ID" in env else "env", rank=rank,
                      world_size=world, local_rank=local_rank, local_world_size=local_world,
                      num_nodes=world // local_world, master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
                      master_port=port("MASTER_PORT", 29500))
    elif "SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env:  # inside srun
        rank, world, local_rank = integer("SLURM_PROCID"), integer("SLURM_STEP_NUM_TASKS"), integer("SLURM_LOCALID")
        node, nodes = integer("SLURM_NODEID"), integer("SLURM_STEP_NUM_NODES")
        per_node = parse_slurm_tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE", str(world)))
        if "SLURM_NTASKS" in env and integer("SLURM_NTASKS") < world:
            raise LaunchError(f"Slurm step has {world} tasks but the job only SLURM_NTASKS={env['SLURM_NTASKS']}")
        if len(per_node) != nodes or sum(per_node) != world:
            raise LaunchError(f"Slurm variables disagree: {nodes} nodes with tasks {per_node} "
                             f"but {world} tasks in the step")
        if not (0 <= rank < world and 0 <= node < nodes and 0 <= local_rank < per_node[node]):
            raise LaunchError(f"Slurm variables disagree: SLURM_PROCID={rank} SLURM_LOCALID={local_rank} "
                             f"SLURM_NODEID={node} for {world} tasks on {nodes} nodes {per_node}")
        if "SLURM_NTASKS_PER_NODE" in env and len(set(per_node)) == 1 \
                and parse_slurm_tasks_per_node(env["SLURM_NTASKS_PER_NODE"])[0] != per_node[0]:
            raise LaunchError(f"Slurm variables disagree: SLURM_NTASKS_PER_NODE={env['SLURM_NTASKS_PER_NODE']} "
                             f"but the step runs {per_node[0]} tasks per node")
        job = integer("SLURM_JOB_ID") if "SLURM_JOB_ID" in env else 0
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
        launch.update(launcher="slurm", rank=rank, world_size=world, local_rank=local_rank,
                      local_world_size=per_node[node], num_nodes=nodes,
                      master_addr=env.get("MASTER_ADDR") or first_slurm_host(nodelist),
                      master_port=port("MASTER_PORT", 15000 + job % 20000))
        if "SLURM_GPUS_ON_NODE" in env and integer("SLURM_GPUS_ON_NODE") < per_node[node]:
            launch["gpus_on_node"] = integer("SLURM_GPUS_ON_NODE")
    else:
        launch.update(launcher="single", rank=0, world_size=1, local_rank=0, local_world_size=1, num_nodes=1,
                      master_addr="127.0.0.1", master_port=0)
    return launch


def resolve_precision(requested, device_type, bf16_supported):
    if device_type == "cpu":
        if requested == "fp16":
            raise UsageError("--precision fp16 needs a GPU: use fp32 or bf16 on the CPU")
        return "fp32" if requested == "auto" else requested
    if requested == "bf16" and not bf16_supported:
        raise UsageError("--precision bf16 is not supported by this GPU: use fp16 or fp32")
    if requested == "auto":
        return "bf16" if bf16_supported else "fp16"
    return requested


def resolve_batch(args, world_size, device_type):
    if args.global_batch_size is not None:
        if args.global_batch_size % world_size:
            raise UsageError(f"--global-batch-size {args.global_batch_size} is not divisible by the "
                             f"world size {world_size}")
        return "global", args.global_batch_size // world_size, args.global_batch_size
    per_device = args.batch_size_per_device or (DEFAULT_BATCH_GPU if device_type == "cuda" else DEFAULT_BATCH_CPU)
    return "per_device", per_device, per_device * world_size


def resolve_harness_config(args, launch, strategy, cuda_available, device_count, bf16_supported):
    """Every rule that needs no process group or GPU work; raises UsageError."""
    device_type = args.device
    if device_type == "cuda":
        if not cuda_available or device_count == 0:
            raise UsageError("--device cuda needs a CUDA GPU and none is visible (use --device cpu for a CPU run)")
        if launch["launcher"] != "slurm" and launch["local_world_size"] > device_count:
            raise UsageError(f"{launch['local_world_size']} ranks on this node but only {device_count} GPUs visible: "
                             f"one rank per GPU")
        if "gpus_on_node" in launch:
            raise UsageError(f"{launch['local_world_size']} Slurm tasks on this node but only "
                             f"{launch['gpus_on_node']} GPUs allocated (SLURM_GPUS_ON_NODE): one task per GPU")
    if not 0 <= args.momentum < math.inf:
        raise UsageError(f"--momentum must be a finite number >= 0, got {args.momentum}")
    if args.inject_fault and not 0 <= args.inject_fault_rank < launch["world_size"]:
        raise UsageError(f"--inject-fault-rank {args.inject_fault_rank} is not a rank of {launch['world_size']}")
    precision = resolve_precision(args.precision, device_type, bf16_supported)
    batch_mode, per_device, global_batch = resolve_batch(args, launch["world_size"], device_type)
    if per_device * math.ceil(args.image_size / 32) ** 2 < 2:
        raise UsageError(f"batch {per_device} per device at {args.image_size} px leaves BatchNorm one value per "
                         f"channel in the last stage (1/32 of the image size): use more images or larger ones")
    memory_format = args.memory_format
    if memory_format == "auto":
        memory_format = "channels_last" if device_type == "cuda" else "contiguous"
    compile_mode = args.compile_mode or ("default" if args.compile else None)
    if args.cudnn_benchmark and device_type != "cuda":
        raise UsageError("--cudnn-benchmark needs --device cuda: it times cuDNN's GPU convolution algorithms")
    if args.cudnn_benchmark_limit is not None and (device_type != "cuda" or args.cudnn_benchmark is False):
        raise UsageError("--cudnn-benchmark-limit needs cuDNN's autotuning: --device cuda without "
                         "--no-cudnn-benchmark")
    if args.steps_per_epoch is not None and args.steps < 3 * args.steps_per_epoch:
        raise UsageError(f"--steps-per-epoch {args.steps_per_epoch} needs --steps >= {3 * args.steps_per_epoch} "
                         f"(got {args.steps}): a median and MAD over at least three epochs")
    output = args.output if args.output is not None else os.path.join("runs", f"{os.path.splitext(os.path.basename(BENCHMARK))[0]}-{strategy}-"
                                                 f"{launch['world_size']}{device_type}-{precision}-"
                                                 f"{launch.get('slurm_job_id') or os.getpid()}.json")
    check_output_path(output, args.overwrite)
    return {
        "benchmark": BENCHMARK, "strategy": strategy, "device": device_type,
        "backend": "nccl" if device_type == "cuda" else "gloo",
        "image_size": args.image_size, "num_classes": NUM_CLASSES,
        "batch_mode": batch_mode, "batch_size_per_device": per_device, "global_batch_size": global_batch,
        "warmup_steps": args.warmup_steps, "steps": args.steps,
        "precision_requested": args.precision, "precision": precision,
        "grad_scaler": precision == "fp16", "tf32": device_type == "cuda",
        "memory_format_requested": args.memory_format, "memory_format": memory_format,
        "compile": compile_mode is not None, "compile_mode": compile_mode,
        "lr": args.lr, "momentum": args.momentum, "seed": args.seed,
        "cudnn_benchmark": device_type == "cuda" and args.cudnn_benchmark is not False,
        "cudnn_benchmark_limit": args.cudnn_benchmark_limit, "steps_per_epoch": args.steps_per_epoch,
        "timeout_s": args.timeout,
        "output": os.path.abspath(output), "overwrite": args.overwrite,
        "inject_fault": args.inject_fault, "inject_fault_rank": args.inject_fault_rank,
        "inject_fault_step": args.inject_fault_step,
    }


def check_output_path(path, overwrite):
    if not path:
        raise UsageError("--output is empty: give a file path or leave the option out")
    if os.path.isdir(path):
        raise UsageError(f"--output {path} is a directory, not a file path")
    if os.path.exists(path) and not overwrite:
        raise UsageError(f"--output {path} exists: pass --overwrite to replace it")
    parent = os.path.dirname(os.path.abspath(path))
    existing = parent
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--output directory {parent} cannot be written ({existing} is not a writable directory)")


def median(values):
    return percentile(values, 50)


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(values):
    if not values:
        return None
    centre = median(values)
    return {"count": len(values), "mean": sum(values) / len(values), "median": centre,
            "p90": percentile(values, 90), "p99": percentile(values, 99), "min": min(values), "max": max(values),
            "mad": median([abs(v - centre) for v in values])}


def epoch_throughput(step_times_ms, steps_per_epoch, images_per_step):
    """Images per second of each whole epoch of steps_per_epoch consecutive steps (their summed times), with
    their median and MAD: fairscale's benchmark statistic, which averages over an epoch what a per-step MAD
    shows step by step. Steps after the last whole epoch are left out and counted."""
    epochs = [images_per_step * steps_per_epoch / (sum(step_times_ms[start:start + steps_per_epoch]) / 1e3)
              for start in range(0, len(step_times_ms) - steps_per_epoch + 1, steps_per_epoch)]
    stats = summarize(epochs) or {"median": None, "mad": None}
    return {"steps_per_epoch": steps_per_epoch, "count": len(epochs),
            "steps_left_out": len(step_times_ms) - len(epochs) * steps_per_epoch, "images_per_second": epochs,
            "median": stats["median"], "mad": stats["mad"]}


def mib(num_bytes):
    return round(num_bytes / 2**20, 1)


def package_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# Environment variables that change what a run measures (NCCL's and PyTorch's tuning, Inductor's, threads,
# visible devices): recorded with the software, since the configuration does not show them.
TUNING_VARIABLE_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCHINDUCTOR_", "TORCH_CUDNN_", "TORCH_SYMM_MEM_", "PYTORCH_",
                            "CUDA_", "CUBLAS_", "CUDNN_", "NVSHMEM_", "OMP_", "MKL_")


def collect_software(environ=os.environ):
    nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    return {"python": platform.python_version(), "torch": torch.__version__,
            "torch_git": torch.version.git_version, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
            "torchvision": torchvision.__version__, "lightning": package_version("lightning"),
            "fairscale": package_version("fairscale"),
            "environment": {name: value for name, value in sorted(environ.items())
                            if name.startswith(TUNING_VARIABLE_PREFIXES)}}


def cpu_affinity():
    """The cores this process may run on, as ranges ("4-7,12"), where the OS says (Linux)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cores, ranges = sorted(os.sched_getaffinity(0)), []
    for core in cores:
        if ranges and core == ranges[-1][1] + 1:
            ranges[-1][1] = core
        else:
            ranges.append([core, core])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


def collect_local_hardware(device, rank):
    info = {"rank": rank, "hostname": socket.gethostname(), "device": str(device), "cpu_affinity": cpu_affinity()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu_name=props.name, gpu_memory_mib=mib(props.total_memory), gpu_uuid=str(props.uuid),
                    compute_capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count)
    return info


def collect_host_hardware(device_type):
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as cpuinfo:
            cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), cpu)
    host = {"cpu": cpu, "cpu_count": os.cpu_count(), "interconnect": None}
    if device_type == "cuda":  # the GPU link matrix (NVLink NV#, PCIe PIX/PHB/SYS), where nvidia-smi answers
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20)
            if topo.returncode == 0:
                host["interconnect"] = [re.sub(r"\x1b\[[0-9;]*m", "", line).rstrip()
                                        for line in topo.stdout.splitlines() if line.strip()]
    return host


def collect_git():
    # A launcher that knows better says so: a copy of the tree (a cluster, the device machine) may carry a .git
    # whose HEAD is not the code that runs.
    if os.environ.get("BENCH_GIT_COMMIT"):
        dirty = os.environ.get("BENCH_GIT_DIRTY")
        return {"commit": os.environ["BENCH_GIT_COMMIT"], "dirty": None if dirty is None else dirty == "1"}
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "--verify", "-q", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        status = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
        if head.returncode == 0 and status.returncode == 0:
            return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"commit": None, "dirty": None}


def meta_model(build_model):
    """The model on the meta device (shapes only, no memory): built there, or on the CPU and moved when its
    initialisation needs real numbers (e.g. torchvision's RegNets)."""
    try:
        with torch.device("meta"):
            return build_model()
    except NotImplementedError:
        return build_model().to("meta")


def model_flops_per_image(build_model, image_size):
    """Training FLOPs (forward + backward) of one image, counted from the model's own operators."""
    from torch.utils.flop_counter import FlopCounterMode
    model = meta_model(build_model)
    images = torch.empty(2, 3, image_size, image_size, device="meta")
    with FlopCounterMode(display=False) as counter:
        model(images).float().sum().backward()
    return counter.get_total_flops() / 2


def peak_tflops(gpu_name, precision):
    for key, table in PEAK_TFLOPS.items():
        if gpu_name and key in gpu_name:
            lower_clocked = key != "A100" and ("PCIe" in gpu_name or "NVL" in gpu_name)
            return None if lower_clocked else table[precision]
    return None


def json_safe(value):
    """NaN and infinity are not JSON: a diverged loss is written as null (checks.loss_finite says why)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def write_json_atomically(path, payload):
    """Temporary file in the target directory, fsync, rename: readers see no file or the whole file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(json_safe(payload), stream, indent=1, allow_nan=False)
            stream.write("\n")
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def host_counters():
    """The machine's CPU time by kind (/proc/stat, Linux) and this process's CPU time and context switches (Unix),
    all threads together; None where the OS has no such counter."""
    counters = {"process_cpu_s": time.process_time(), "voluntary_switches": None, "involuntary_switches": None,
                "machine": None}
    with contextlib.suppress(ImportError):
        import resource  # Unix only
        usage = resource.getrusage(resource.RUSAGE_SELF)
        counters.update(voluntary_switches=usage.ru_nvcsw, involuntary_switches=usage.ru_nivcsw)
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
        counters["machine"] = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return counters


def host_activity(start, wall_s):
    """What the host did during the timed steps: the share of the machine's CPU time its hypervisor took
    (steal) and the share spent running work (neither idle nor stolen), and this process's CPU seconds per wall
    second and context switches (involuntary: its threads preempted). A launch-bound step runs at the host's
    pace; these say what that pace was up against."""
    end = host_counters()
    activity = {"process_cpu_per_wall": (end["process_cpu_s"] - start["process_cpu_s"]) / wall_s if wall_s > 0
                else None,
                "involuntary_context_switches": None if start["involuntary_switches"] is None
                else end["involuntary_switches"] - start["involuntary_switches"],
                "voluntary_context_switches": None if start["voluntary_switches"] is None
                else end["voluntary_switches"] - start["voluntary_switches"],
                "machine_steal_percent": None, "machine_busy_percent": None}
    if start["machine"] and end["machine"]:
        delta = [b - a for a, b in zip(start["machine"], end["machine"])]
        if sum(delta) > 0:
            activity["machine_steal_percent"] = 100.0 * delta[7] / sum(delta)
            activity["machine_busy_percent"] = 100.0 * sum(delta[:3] + delta[5:7]) / sum(delta)  # not idle, stolen
    return activity


def compile_cache_counts():
    """Inductor's FX graph cache and AOTAutograd's cache lookups this process has made so far (hit, miss,
    bypass), or None when it compiled nothing. A compiled run that loaded its kernels from a warm cache can run
    other kernels than one that compiled them afresh (docs/performance.md, the best mode), so a result says which
    it was."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")  # not imported: nothing was compiled
    if dynamo_utils is None:
        return None
    counters = dynamo_utils.counters
    inductor, aot_autograd = counters.get("inductor") or {}, counters.get("aot_autograd") or {}
    counts = {f"fx_graph_cache_{kind}": int(inductor.get(f"fxgraph_cache_{kind}", 0))
              for kind in ("hit", "miss", "bypass")}
    counts.update({f"autograd_cache_{kind}": int(aot_autograd.get(f"autograd_cache_{kind}", 0))
                   for kind in ("hit", "miss", "bypass")})
    return counts if any(counts.values()) else None


def utc_text(seconds):
    """A Unix time as UTC text to the millisecond, to line a run's timed steps up with GPU telemetry."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def start_clock():
    """The start of the timed steps: the host's counters, then the host clock (close_record() takes both; the
    counters are read first so that the timed wall time does not include reading them)."""
    host = host_counters()
    return {"time": time.perf_counter(), "utc": time.time(), "host": host}


class StepTimer:
    """Marks between steps: CUDA events on the GPU (no host sync), and the host clock at each mark."""

    def __init__(self, device, capacity):
        self.cuda = device.type == "cuda"
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(capacity + 1)] if self.cuda else []
        self.host_marks = []
        self.count = 0

    def mark(self):
        if self.cuda:
            self.events[self.count].record()
        self.host_marks.append(time.perf_counter())
        self.count += 1

    def step_times_ms(self):
        """Call after a device synchronize."""
        if self.cuda:
            return [self.events[i].elapsed_time(self.events[i + 1]) for i in range(self.count - 1)]
        return [(b - a) * 1e3 for a, b in zip(self.host_marks, self.host_marks[1:])]

    def host_lead_ms(self):
        """How long after the host queued each step's end mark the GPU reached it: tens of ms when the host runs
        ahead (the GPU sets the pace), near 0 when the GPU waits for the host. The first mark follows a device
        synchronize, so the GPU reaches it at once and both clocks start there. None on the CPU."""
        if not self.cuda:
            return None
        return [self.events[0].elapsed_time(self.events[i]) - (self.host_marks[i] - self.host_marks[0]) * 1e3
                for i in range(1, self.count)]


class StopRequest:
    """SIGTERM/SIGINT (Slurm's time limit, scancel, Ctrl-C) ask every rank to stop after the current step.

    Ranks receive the signal at slightly different steps, so they agree through a tiny host-side
    all-reduce on a gloo group after each step; that costs no device synchronisation and also notices
    a dead peer within two steps. The all-reduce runs in the background and a step reads the previous
    step's round: a blocking one would tie the ranks' host threads together at every step, so that a
    launch-bound step waited for the slower host and the network round trip (every rank still stops
    after the same step, one step later). A second Ctrl-C interrupts at once.
    """

    def __init__(self):
        self.signum = 0
        self.previous = {}
        self.pending = None  # (work, flag) of the round still in flight

    def install(self):
        for signum in (signal.SIGTERM, signal.SIGINT):
            self.previous[signum] = signal.signal(signum, self.handle)

    def handle(self, signum, frame):
        if self.signum and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def agreed(self, group, world_size):
        """Start this step's round; return the previous round's agreement (0 at the first step)."""
        if world_size == 1:
            return self.signum
        flag = torch.tensor([self.signum], dtype=torch.int32)
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group, async_op=True)
        previous, self.pending = self.pending, (work, flag)
        return self.read(previous)

    def settle(self, world_size):
        """The agreement of the round still in flight, so that no round outlives the loop that started it."""
        if world_size == 1:
            return self.signum
        previous, self.pending = self.pending, None
        return self.read(previous)

    @staticmethod
    def read(round_):
        if round_ is None:
            return 0
        work, flag = round_
        work.wait()
        return int(flag.item())


def is_out_of_memory(error):
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def inject_fault(config, rank, step, kind, model=None):
    """Test hook: fail on purpose on one rank at one step (--inject-fault)."""
    if config["inject_fault"] != kind or rank != config["inject_fault_rank"]:
        return
    if kind == "desync" and model is not None:
        with torch.no_grad():
            next(model.parameters()).add_(1e-3)
    elif kind == "oom" and step == config["inject_fault_step"]:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected by --inject-fault oom)")
    elif kind == "crash" and step == config["inject_fault_step"]:
        os._exit(EXIT_ERROR)


def parameter_checksums(parameters):
    """Per tensor: float64 sum and sum of squares. Equal on every rank when replicas agree."""
    rows = [torch.stack([p.detach().double().sum(), p.detach().double().pow(2).sum()]) for p in parameters]
    return torch.stack(rows).cpu()


def compare_checksums(per_rank):
    """Parameters agree when every checksum equals rank 0's to 1e-9 of its own size (a tensor's checksum, not
    the model's largest, so that a large tensor cannot hide a small one's difference). Equal values agree,
    infinities and NaN included (a diverged run is not a desync); a NaN against a number is an infinite
    difference. Returns (agree, largest difference)."""
    reference = per_rank[0]
    agree, largest = True, 0.0
    for checksums in per_rank:
        same = (checksums == reference) | (checksums.isnan() & reference.isnan())
        difference = torch.where(same, 0.0, (checksums - reference).abs().nan_to_num(nan=math.inf))
        agree = agree and bool((same | (difference <= 1e-9 * reference.abs().clamp_min(1.0))).all())
        largest = max(largest, float(difference.max()))
    return agree, largest


def failure_from_peers(store, rank, world_size, wait_s=3.0):
    """A failing rank leaves its reason in the store; a surviving rank names the first it finds."""
    if store is None:
        return None
    deadline = time.monotonic() + wait_s
    keys = [f"bench/failure/{r}" for r in range(world_size) if r != rank]
    while True:
        for key in keys:
            with contextlib.suppress(Exception):
                if store.check([key]):
                    return json.loads(store.get(key).decode())
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)


def record_failure(store, rank, failure):
    if store is not None:
        with contextlib.suppress(Exception):
            store.set(f"bench/failure/{rank}", json.dumps(failure))


def base_result(config, launch, started_at):
    return {"schema_version": SCHEMA_VERSION, "benchmark": config["benchmark"], "strategy": config["strategy"],
            "status": "error", "config": config,
            "world": {"world_size": launch["world_size"], "num_nodes": launch["num_nodes"],
                      "devices_per_node": launch["local_world_size"], "launcher": launch["launcher"],
                      "backend": config["backend"], "slurm_job_id": launch.get("slurm_job_id"),
                      "master_addr": launch["master_addr"], "master_port": launch["master_port"]},
            "throughput": None, "step_time_ms": None, "step_times_ms_per_rank": None,
            "host_lead_ms": None, "host_lead_ms_per_rank": None, "host_cpu_per_rank": None,
            "compile_cache_per_rank": None, "loss_per_step": None, "memory": None, "checks": None,
            "efficiency": None, "failure": None,
            "software": collect_software(), "hardware": None, "git": collect_git(),
            "started_at": started_at.strftime("%Y-%m-%dT%H:%M:%SZ"), "wall_time_s": None}


def complete_result(result, per_rank, global_batch, flops_per_image):
    """Fill throughput, step statistics, memory, checks and efficiency from every rank's record."""
    rank0 = per_rank[0]
    steps_done = min(len(r["step_times_ms"]) for r in per_rank)
    pooled = [t for r in per_rank for t in r["step_times_ms"]]
    wall = max(r["timed_wall_s"] for r in per_rank)
    images_per_second = global_batch * steps_done / wall if steps_done and wall > 0 else None
    rank0_summary = summarize([global_batch / (t / 1e3) for t in rank0["step_times_ms"] if t > 0])
    world_size = len(per_rank)
    result["throughput"] = None if images_per_second is None or rank0_summary is None else {
        "images_per_second": images_per_second, "images_per_second_per_device": images_per_second / world_size,
        "rank0_median_images_per_second": rank0_summary["median"], "rank0_mad_images_per_second": rank0_summary["mad"],
        "timed_steps": steps_done, "timed_wall_s": wall, "rank0_timed_window_utc": rank0["timed_window_utc"]}
    if result["throughput"] and result["config"].get("steps_per_epoch"):
        result["throughput"]["rank0_epochs"] = epoch_throughput(
            rank0["step_times_ms"], result["config"]["steps_per_epoch"], global_batch)
    result["step_time_ms"] = summarize(pooled)
    result["step_times_ms_per_rank"] = [r["step_times_ms"] for r in per_rank]
    leads = [r.get("host_lead_ms") for r in per_rank]
    if None not in leads:
        result["host_lead_ms"] = summarize([v for lead in leads for v in lead])
        result["host_lead_ms_per_rank"] = leads
    result["host_cpu_per_rank"] = [r.get("host_cpu") for r in per_rank]
    caches = [r.get("compile_cache") for r in per_rank]
    result["compile_cache_per_rank"] = None if all(c is None for c in caches) else caches
    result["loss_per_step"] = rank0["losses"]
    result["hardware"] = {"ranks": [r["hardware"] for r in per_rank], "device_count": world_size,
                          "hostnames": sorted({r["hardware"]["hostname"] for r in per_rank}), **rank0["host"]}
    allocated = [r["peak_allocated_mib"] for r in per_rank]
    reserved = [r["peak_reserved_mib"] for r in per_rank]
    result["memory"] = {"peak_allocated_mib": None if None in allocated else max(allocated),
                        "peak_reserved_mib": None if None in reserved else max(reserved),
                        "per_rank": [{"rank": r["rank"], "peak_allocated_mib": r["peak_allocated_mib"],
                                      "peak_reserved_mib": r["peak_reserved_mib"]} for r in per_rank]}
    gpu = rank0["hardware"].get("gpu_name")
    peak = peak_tflops(gpu, result["config"]["precision"])
    achieved = flops_per_image * images_per_second / 1e12 if images_per_second else None
    result["efficiency"] = {"model_flops_per_image": flops_per_image, "achieved_tflops": achieved,
                            "peak_tflops_per_device": peak,
                            "mfu": achieved / (peak * world_size) if achieved and peak else None}
    ratios = [sum(r["step_times_ms"]) / 1e3 / r["timed_wall_s"] for r in per_rank
              if r["timed_wall_s"] > 0 and r["step_times_ms"]]
    losses = [v for r in per_rank for v in r["losses"]]
    return {"loss_finite": all(math.isfinite(v) for v in losses),
            "final_loss": rank0["losses"][-1] if rank0["losses"] else None,
            "event_time_over_wall": ratios, "timing_consistent": all(0.95 <= q <= 1.02 for q in ratios),
            "steps_run_per_rank": [r["steps_run"] for r in per_rank]}


def print_environment(result, config):
    software, world = result["software"], result["world"]
    print(f"== {config['benchmark']} | strategy {config['strategy']} | {world['world_size']} x {config['device']} "
          f"on {world['num_nodes']} node(s) | launcher {world['launcher']} | backend {world['backend']}")
    print(f"   torch {software['torch']} (git {software['torch_git'][:10]}) | CUDA {software['cuda']} | "
          f"cuDNN {software['cudnn']} | NCCL {software['nccl']} | torchvision {software['torchvision']} | "
          f"lightning {software['lightning']} | fairscale {software['fairscale']}")
    print(f"   batch {config['batch_size_per_device']}/device ({config['batch_mode']}, global "
          f"{config['global_batch_size']}) | {config['image_size']} px | precision {config['precision']} "
          f"(asked {config['precision_requested']}) | {config['memory_format']} | compile {config['compile_mode']} | "
          f"warm-up {config['warmup_steps']} + {config['steps']} timed steps", flush=True)
    forms = [text for key, text in (("stem_conv", "conv1 as space to depth"),
                                    ("max_pool_backward", "dense max-pool backward"),
                                    ("batch_norm", "batch-norm statistics from sums"))
             if config.get(key, "torchvision") != "torchvision"]
    eager = [text for key, value, text in (("max_pool_backward", "dense", "the dense max-pool backward made the "
                                            "stem 2.3x slower"),
                                           ("batch_norm", "sums", "the sums batch norm made the step 4.6x slower"))
             if config.get(key) == value]
    eager_note = f"; these are for compiled steps (eager, on an H200, {' and '.join(eager)})" if eager and \
        not config["compile"] else ""
    if forms:
        print(f"   computed another way (same model): {', '.join(forms)}{eager_note}", flush=True)


def print_summary_table(result):
    config, throughput, steps, memory = result["config"], result["throughput"], result["step_time_ms"], result["memory"]
    mfu, peak = (result["efficiency"] or {}).get("mfu"), memory["peak_allocated_mib"]
    print("\n| strategy | devices | precision | batch/device | img/s | img/s/device | median step ms | p90 ms | "
          "MAD ms | peak alloc MiB | MFU | status |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {config['strategy']} | {result['world']['world_size']} | {config['precision']} | "
          f"{config['batch_size_per_device']} | {throughput['images_per_second']:,.0f} | "
          f"{throughput['images_per_second_per_device']:,.0f} | {steps['median']:.2f} | {steps['p90']:.2f} | "
          f"{steps['mad']:.2f} | {'-' if peak is None else f'{peak:,.0f}'} | "
          f"{'-' if mfu is None else f'{mfu:.1%}'} | {result['status']} |", flush=True)
    epochs = throughput.get("rank0_epochs")
    if epochs and epochs["count"]:
        print(f"per epoch of {epochs['steps_per_epoch']} steps (rank 0, {epochs['count']} epochs): "
              f"{epochs['median']:,.0f} ± {epochs['mad']:,.0f} img/s (median ± MAD)", flush=True)
    host = (result["host_cpu_per_rank"] or [None])[0]
    if host and host["machine_steal_percent"] is not None:
        print(f"host during the timed steps (rank 0): machine busy {host['machine_busy_percent']:.0f} %, stolen by "
              f"the hypervisor {host['machine_steal_percent']:.1f} %; this process {host['process_cpu_per_wall']:.2f}"
              f" CPU-s per s, {host['involuntary_context_switches']} involuntary context switches", flush=True)
    cache = (result["compile_cache_per_rank"] or [None])[0]
    if cache:
        print(f"compiled (rank 0): Inductor's FX graph cache {cache['fx_graph_cache_hit']} hit, "
              f"{cache['fx_graph_cache_miss']} miss, {cache['fx_graph_cache_bypass']} bypass; AOTAutograd's cache "
              f"{cache['autograd_cache_hit']} hit, {cache['autograd_cache_miss']} miss", flush=True)


def exit_code_for(status, signum=0):
    return {"ok": EXIT_OK, "desync": EXIT_DESYNC, "oom": EXIT_OOM, "interrupted": 128 + signum}.get(status, EXIT_ERROR)


def run_guarded(main):
    """Bad input: one line and exit 2. Anything else main() did not handle: one line per rank, exit 1."""
    try:
        sys.exit(main())
    except UsageError as error:
        if dist.is_available() and dist.is_initialized():
            rank = str(dist.get_rank())
        else:
            rank = os.environ.get("RANK") or (os.environ.get("SLURM_PROCID") if "SLURM_STEP_NUM_TASKS" in os.environ
                                              else None) or "0"
        if rank == "0" or isinstance(error, LaunchError):
            prefix = "" if rank == "0" else f"[rank {rank}] "
            print(f"{prefix}{os.path.basename(sys.argv[0])}: error: {error}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USAGE)


class TimedLoop:
    """measure()'s loop: the harness's per-step work around a training step (fault hooks, the loss kept on the
    device, a CUDA-event mark after each timed step, progress lines, the SIGTERM agreement round). Timed steps
    may come in several runs (the interleaved Lightning diagnostic times native's blocks with it); progress
    counts them against timed_total."""

    def __init__(self, step, config, rank, world_size, monitor, stop, timer, timed_total):
        self.step, self.config, self.rank, self.world_size = step, config, rank, world_size
        self.monitor, self.stop, self.timer = monitor, stop, timer
        self.losses, self.record = [], {"rank": rank, "steps_run": 0, "signal": 0}
        self.timed_total, self.timed_done = timed_total, 0
        self.progress_every = max(1, timed_total // 5)

    def run(self, count, timed):
        """count steps; False when a stop request ended them early."""
        step, config, rank, world_size, monitor, stop, timer = (self.step, self.config, self.rank, self.world_size,
                                                                 self.monitor, self.stop, self.timer)
        losses, record, progress_every = self.losses, self.record, self.progress_every
        offset, of = (self.timed_done, self.timed_total) if timed else (0, count)  # progress: step offset + index of
        before = record["steps_run"]
        for index in range(count):
            inject_fault(config, rank, record["steps_run"] + 1, "oom")
            inject_fault(config, rank, record["steps_run"] + 1, "crash")
            losses.append(step())  # a device tensor: reading it now would sync the host
            record["steps_run"] += 1
            if timed:
                timer.mark()
            shown = offset + index
            if rank == 0 and (not timed or shown == 0 or (shown + 1) % progress_every == 0 or shown + 1 == of):
                print(f"  {'measuring' if timed else 'warm-up'} step {shown + 1}/{of} (queued)", flush=True)
            record["signal"] = stop.agreed(monitor, world_size)
            if record["signal"]:
                break
        if timed:
            self.timed_done += record["steps_run"] - before
        return not record["signal"]


def measure(step, config, device, rank, world_size, monitor, stop):
    """Warm-up, then timed steps. Returns this rank's record; a stop request ends the loop early."""
    timer = StepTimer(device, config["steps"])
    loop = TimedLoop(step, config, rank, world_size, monitor, stop, timer, config["steps"])
    started = None
    if loop.run(config["warmup_steps"], timed=False):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        if world_size > 1:
            dist.barrier(group=monitor)
        started = start_clock()
        timer.mark()
        loop.run(config["steps"], timed=True)
    return close_record(loop.record, timer, loop.losses, started, device, stop, world_size)


def close_record(record, timer, losses, started, device, stop, world_size):
    """After the last step (measure()'s loop or the Lightning twin's): wait for the device, then fill the
    record's wall time, agreed signal, step times, host lead, losses and peak memory."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    record["timed_wall_s"] = time.perf_counter() - started["time"] if started is not None else 0.0
    record["timed_window_utc"] = [utc_text(started["utc"]), utc_text(time.time())] if started is not None else None
    record["host_cpu"] = host_activity(started["host"], record["timed_wall_s"]) if started is not None else None
    record["compile_cache"] = compile_cache_counts()
    last_round = stop.settle(world_size)  # always: no round outlives the loop
    record["signal"] = record["signal"] or last_round  # a signal during the last step
    record["step_times_ms"] = timer.step_times_ms()
    record["host_lead_ms"] = timer.host_lead_ms()
    record["losses"] = [float(v) for v in torch.stack(losses).float().cpu()] if losses else []
    record["peak_allocated_mib"] = mib(torch.cuda.max_memory_allocated(device)) if cuda else None
    record["peak_reserved_mib"] = mib(torch.cuda.max_memory_reserved(device)) if cuda else None
    return record


def make_synthetic_batch(config, rank, device):
    """A distinct batch per rank, made once on the device and reused every step."""
    generator = torch.Generator(device=device).manual_seed(config["seed"] + 1 + rank)
    size = config["image_size"]
    images = torch.randn(config["batch_size_per_device"], 3, size, size, generator=generator, device=device)
    labels = torch.randint(0, NUM_CLASSES, (config["batch_size_per_device"],), generator=generator, device=device)
    if config["memory_format"] == "channels_last":
        images = images.contiguous(memory_format=torch.channels_last)
    return images, labels


def setup_device(config, launch, device_count):
    """Pick and configure this rank's device before any process group exists."""
    if config["device"] == "cuda":
        device = torch.device("cuda", launch["local_rank"] % device_count)  # Slurm may bind one GPU per task
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = config["cudnn_benchmark"]
        if config["cudnn_benchmark"]:
            if config["cudnn_benchmark_limit"] is not None:
                torch.backends.cudnn.benchmark_limit = config["cudnn_benchmark_limit"]
            config["cudnn_benchmark_limit"] = torch.backends.cudnn.benchmark_limit  # what runs
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        return device
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // launch["local_world_size"]))
    config["cpu_threads_per_rank"] = torch.get_num_threads()
    return torch.device("cpu")


def init_distributed(config, launch, device):
    """The process group (NCCL or gloo) plus a gloo group for host-side agreement. Returns (store, monitor)."""
    if launch["world_size"] == 1:
        return None, None
    timeout = datetime.timedelta(seconds=config["timeout_s"])
    # torchrun's workers join the agent's store (env://); srun and hand-set variables need an address.
    init_method = "env://" if launch["launcher"] == "torchrun" else \
        f"tcp://{launch['master_addr']}:{launch['master_port']}"
    dist.init_process_group(config["backend"], init_method=init_method, rank=launch["rank"],
                            world_size=launch["world_size"], timeout=timeout,
                            device_id=device if device.type == "cuda" else None)
    return dist.distributed_c10d._get_default_store(), dist.new_group(backend="gloo", timeout=timeout)


def finish_run(result, record, monitor, build_model, wall_start):
    """Gather every rank's record, decide the status, write the result on rank 0; returns the exit code."""
    world_size, rank = result["world"]["world_size"], record["rank"]
    record["host"] = collect_host_hardware(result["config"]["device"]) if rank == 0 else None
    records = gather_to_all(record, monitor, world_size)
    signum = record["signal"]
    if rank != 0:
        return exit_code_for("interrupted" if signum else "ok", signum)
    checks = complete_result(result, records, result["config"]["global_batch_size"],
                             model_flops_per_image(build_model, result["config"]["image_size"]))
    synced, largest = compare_checksums([r["checksums"] for r in records])
    checks.update(parameters_synchronized=synced, parameter_max_abs_diff=largest,
                  final_parameter_checksum=[float(v) for v in records[0]["checksums"].sum(0)])
    result["checks"] = checks
    timed = result["throughput"]["timed_steps"] if result["throughput"] else 0
    expected = result["config"]["warmup_steps"] + result["config"]["steps"]
    if signum:
        name = signal.Signals(signum).name
        result.update(status="interrupted", failure={"kind": "interrupted", "rank": None, "signal": name,
                                                     "message": f"stopped by {name} after {timed} timed steps"})
    elif any(r["steps_run"] != expected for r in records):
        result.update(status="error", failure={"kind": "error", "rank": None,
                                               "message": f"ranks ran {checks['steps_run_per_rank']} steps, "
                                                          f"expected {expected} each"})
    elif not checks["loss_finite"]:
        first = next(i for i, v in enumerate(records[0]["losses"]) if not math.isfinite(v)) + 1
        result.update(status="error", failure={"kind": "error", "rank": None,
                                               "message": f"the loss is not finite from step {first} on rank 0"})
    elif not synced:
        result.update(status="desync", failure={"kind": "desync", "rank": None,
                                                "message": f"parameters differ across ranks by up to {largest:.3g}"})
    else:
        result["status"] = "ok"
    result["wall_time_s"] = time.perf_counter() - wall_start
    write_json_atomically(result["config"]["output"], result)
    if result["throughput"]:
        print_summary_table(result)
    print(f"result: {result['status']} -> {result['config']['output']}", flush=True)
    if result["failure"]:
        print(f"{result['benchmark']}: {result['status']}: {result['failure']['message']}", file=sys.stderr,
              flush=True)
    return exit_code_for(result["status"], signum)


def check_rank_agreement(config, hardware, monitor, world_size):
    """Ranks must agree on the resolved precision (auto assumes identical GPUs) and own distinct GPUs."""
    if world_size == 1:
        return
    mine = {"precision": config["precision"], "gpu": hardware.get("gpu_uuid"), "host": hardware["hostname"]}
    everyone = gather_to_all(mine, monitor, world_size)
    precisions = sorted({entry["precision"] for entry in everyone})
    if len(precisions) > 1:
        raise UsageError(f"ranks resolved different precisions {precisions}: pass an explicit --precision")
    gpus = [(entry["host"], entry["gpu"]) for entry in everyone if entry["gpu"]]
    if len(set(gpus)) < len(gpus):
        raise UsageError("two ranks share one GPU: more ranks on a node than GPUs (one rank per GPU)")


def gather_to_all(obj, group, world_size):
    if world_size == 1:
        return [obj]
    gathered = [None] * world_size
    dist.all_gather_object(gathered, obj, group=group)
    return gathered


def fail(error, result, rank, world_size, store, device, wall_start):
    """Write what is known and exit non-zero; never wait on a collective that may never finish."""
    kind = "interrupted" if isinstance(error, KeyboardInterrupt) else "oom" if is_out_of_memory(error) else "error"
    message = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    own = {"kind": kind, "rank": rank, "message": message}
    if kind == "oom":
        own["batch_size_per_device"] = result["config"]["batch_size_per_device"]
        if device.type == "cuda":
            free, total = torch.cuda.mem_get_info(device)
            own.update(device_free_mib=mib(free), device_total_mib=mib(total),
                       allocated_mib=mib(torch.cuda.memory_allocated(device)),
                       peak_allocated_mib=mib(torch.cuda.max_memory_allocated(device)))
    record_failure(store, rank, own)
    if rank != 0:
        print(f"[rank {rank}] {kind}: {message}", file=sys.stderr, flush=True)
        os._exit(exit_code_for(kind, signal.SIGINT))
    # A peer's recorded failure explains a broken collective better than the broken collective does.
    peer = failure_from_peers(store, rank, world_size) if world_size > 1 and kind == "error" else None
    failure = peer or own
    result.update(status=failure["kind"], failure=failure, wall_time_s=time.perf_counter() - wall_start)
    try:
        write_json_atomically(result["config"]["output"], result)
        where = result["config"]["output"]
    except Exception as write_error:  # noqa: BLE001
        where = f"no result written ({write_error})"
    print(f"{BENCHMARK}: {failure['kind']} on rank {failure['rank']}: {failure['message']} -> {where}",
          file=sys.stderr, flush=True)
    os._exit(exit_code_for(failure["kind"], signal.SIGINT))

def unscale_gradients(parameters, loss_scale):
    """A fixed fp16 loss scale undone: every gradient times 1/S in one foreach multiply, with no overflow check
    and nothing read back on the host (native's train_step, the twin's FixedLossScaler)."""
    torch._foreach_mul_([p.grad for p in parameters if p.grad is not None], 1.0 / loss_scale)


def autocast_for(config):
    """The run's autocast (off in fp32). Its cache of cast weights must stay off while a CUDA graph is
    captured, so with --cuda-graphs it is off."""
    dtype = AUTOCAST_DTYPES[config["precision"]]
    return torch.autocast(config["device"], dtype=dtype, enabled=dtype is not None,
                          cache_enabled=not config["cuda_graphs"])


class GraphedStep:
    """Eager warm-up steps on a side stream, the capture of one whole step as the last warm-up step, then
    replays. A replay launches the step's ~thousand kernels at once, which is what a small batch needs."""

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
    the image cut into 2x2 blocks stacked as channels (space to depth, as in MLPerf's ResNet-50 on TPUs): the
    same weight parameter, the same output up to rounding. cuDNN gets 12 input channels (padded to `channels`)
    and a dense 4x4 kernel instead of 3 channels it pads to 8 on every call and a 7x7 stride-2 kernel."""

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


def add_computation_arguments(parser):
    parser.add_argument("--space-to-depth-stem", action="store_true",
                        help="compute ResNet's first convolution (7x7, stride 2, on 3 channels) as the equal 4x4 "
                             "stride-1 convolution of the image cut into 2x2 blocks of 12 channels (padded to 16): "
                             "the same weight parameter, the same result up to rounding, a shape cuDNN runs about "
                             "twice as fast; for compiled steps (eager showed no gain)")
    parser.add_argument("--dense-max-pool-backward", action="store_true",
                        help="compute the stem's max-pool gradient from strided reads of the (at most four) "
                             "windows that hold each input position and the windows' saved argmax, instead of "
                             "PyTorch's gather through the indices: the same gradient, ties included. For compiled "
                             "steps, where Inductor fuses it into one kernel; eager, its passes run one by one and "
                             "the stem is 2.3x slower")
    parser.add_argument("--sums-batch-norm", action="store_true",
                        help="compute each training batch norm's statistics from per-channel sums of x and x*x "
                             "(x shifted by the running mean) in one pass, instead of the Welford update, a division "
                             "per element, that Inductor generates for PyTorch's batch norm: the same statistics up "
                             "to rounding, PyTorch's backward formula, the same parameters and buffers. For compiled "
                             "steps, where the sums and the normalisation fuse into Inductor's kernels; eager, each "
                             "pass runs alone in fp32 and the step is 4.6x slower")


def resolve_computation_options(args, config):
    """How the ResNet stem and its batch norms are computed (mathematically the same model either way)."""
    config.update(stem_conv="space_to_depth" if args.space_to_depth_stem else "torchvision",
                  max_pool_backward="dense" if args.dense_max_pool_backward else "torchvision",
                  batch_norm="sums" if args.sums_batch_norm else "torchvision")


def apply_computation_options(model, config):
    """The model with its stem and batch norms computed as config says; its parameters and buffers, and their
    names, are unchanged."""
    if config["stem_conv"] == "space_to_depth":
        model.conv1 = SpaceToDepthConv(model.conv1)
    if config["max_pool_backward"] == "dense":
        model.maxpool = DenseMaxPool()
    if config["batch_norm"] == "sums":
        replace_batch_norms(model)
    return model


# ============================================================================ end of harness


def strategy_list(text):
    """'all' or a comma list of known strategies, in the order given."""
    if text.strip() == "all":
        return RUN_ORDER  # a tuple: "all", which skips what the backend cannot run; a list is what was named
    names = [name.strip() for name in text.split(",") if name.strip()]
    if "all" in names:
        raise argparse.ArgumentTypeError(f"all cannot be combined with other strategies in {text!r}")
    unknown = [name for name in names if name not in STRATEGIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown strategy {', '.join(unknown) or repr(text)} "
                                         f"(choose from {', '.join(STRATEGIES)}, all, or a comma list)")
    if len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(f"strategy listed twice in {text!r}")
    return names


def build_parser():
    parser = OneLineArgumentParser(description=__doc__.split("\n")[0],
                                   formatter_class=HelpFormatter)
    add_harness_arguments(parser)
    # the harness's --lr default is SGD's; here it follows --optimizer (main() applies DEFAULT_LR)
    parser._option_string_actions["--lr"].help = ("learning rate (default per --optimizer: " + ", ".join(
        f"{name} {lr:g}" for name, lr in DEFAULT_LR.items()) + ")")
    # for the strategies built on DDP (ddp, oss_ddp, zero1*)
    add_ddp_arguments(parser, cuda_graphs=False, fixed_loss_scale=False)
    parser.add_argument("--strategy", type=strategy_list, default="all",
                        help=f"one of {', '.join(STRATEGIES)}, a comma list, or all (those the backend can run)")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="sgd",
                        help="its state size (SGD momentum 1x, RMSprop with momentum and Adam 2x the parameters) "
                             "is what sharding saves")
    parser.add_argument("--model", default="resnet50", help="any torchvision classification model")
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="fairscale: resnet101, 28 px, 256/device, fp32, RMSprop lr 1e-4 momentum 0.9, NCHW; "
                             "options given explicitly override it (and are reported)")
    parser.add_argument("--sharded-reduce-buffer", type=non_negative_int, default=2**23,
                        help="ShardedDDP reduce_buffer_size in elements (fairscale's default; its docs advise 0 "
                             "on a single node)")
    parser.add_argument("--fsdp-units", choices=["block", "stage", "model"], default="model",
                        help="what fsdp_zero2/3 shard as one unit (one all-gather and one reduce-scatter each): "
                             "every block (ResNet bottleneck), every stage (layer1..4), or the whole model; block "
                             "and stage follow ResNet's layout and give coarser units for other models")
    parser.add_argument("--fsdp-param-dtype", choices=["fp32", "compute"], default="fp32",
                        help="fsdp_zero2/3: all-gather fp32 parameters (autocast casts them, as under DDP) or "
                             "parameters already in the autocast dtype (MixedPrecisionPolicy: half the bytes)")
    parser.add_argument("--cudnn-deterministic", action="store_true",
                        help="force deterministic cuDNN without autotuning, as fairscale's benchmark does")
    parser.add_argument("--phase-steps", type=non_negative_int, default=10,
                        help="steps of the instrumented pass that times forward/backward/step/sync (0: skip)")
    parser.add_argument("--profile-steps", type=non_negative_int, default=2,
                        help="steps of the profiled pass that counts collectives (0: skip)")
    parser.add_argument("--trace-dir", help="also keep each rank's profiler trace (chrome JSON) here")
    parser.add_argument("--table", nargs="+", metavar="RESULT_JSON",
                        help="print the comparison table of these result files and exit (no training)")
    return parser


def parse_arguments(argv=None):
    """The arguments, and the set of options given explicitly (a preset must not override those)."""
    args = build_parser().parse_args(argv)
    quiet = build_parser()
    for action in quiet._actions:
        action.default = argparse.SUPPRESS
    return args, set(vars(quiet.parse_args(argv)))


def apply_preset(args, explicit):
    """Fill the preset's values into options not given explicitly. Returns the explicit overrides as
    {option: {"preset": value, "given": value}}."""
    overrides = {}
    if args.preset is None:
        return overrides
    for name, value in PRESETS[args.preset].items():
        given = "global_batch_size" if name == "batch_size_per_device" and "global_batch_size" in explicit else name
        if given in explicit:
            if getattr(args, given) != value:
                overrides[given] = {"preset": value, "given": getattr(args, given)}
        else:
            setattr(args, name, value)
    return overrides


def model_problem(name, image_size):
    """Why a forward pass of the model in training mode on two images of this size would not give one logit
    row per image (auxiliary outputs, a fixed input size, an image too small), or None. Runs on the meta
    device: no memory, no computation."""
    model = meta_model(lambda: build_model(name))
    try:
        output = model(torch.empty(2, 3, image_size, image_size, device="meta"))
    except Exception as error:  # noqa: BLE001 - whatever the model says about this input is the reason
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    if not isinstance(output, torch.Tensor) or output.shape != (2, NUM_CLASSES):
        return f"its training-mode output is {type(output).__name__}, not one row of {NUM_CLASSES} logits per image"
    return None


def resolve_strategies(args, explicit):
    """The strategies to run, as notes for the user, or UsageError. Needs no process group."""
    backend = "nccl" if args.device == "cuda" else "gloo"
    notes = []
    strategies = list(args.strategy)
    refused = [name for name in strategies if (backend, name) in BACKEND_REFUSALS]
    if refused and args.strategy != RUN_ORDER:
        raise UsageError(f"--strategy {refused[0]} cannot run on {backend} ({args.device}): "
                         f"{BACKEND_REFUSALS[(backend, refused[0])]}")
    for name in refused:
        notes.append(f"--strategy all skips {name} on {backend}: {BACKEND_REFUSALS[(backend, name)]}")
        strategies = [s for s in strategies if s != name]
    wanted = [name for name in strategies if name in FAIRSCALE_STRATEGIES]
    if wanted:
        problem = fairscale_import_error()
        if problem:
            raise UsageError(f"--strategy {','.join(wanted)} needs fairscale, which cannot be imported ({problem}): "
                             f"pip install '.[fairscale]' (fairscale==0.4.13)")
    if "zero1_overlap" in strategies:
        # auto is fp16 on a GPU without bf16
        if args.precision == "fp16" or (args.precision == "auto" and args.device == "cuda" and torch.cuda.is_available()
                                        and not torch.cuda.is_bf16_supported()):
            raise UsageError("zero1_overlap cannot use fp16: its optimizer step runs inside backward, where a "
                             "GradScaler cannot unscale first; use bf16 or fp32")
        needed = 4 if args.static_graph else 3
        if args.warmup_steps < needed:
            raise UsageError(f"zero1_overlap needs --warmup-steps >= {needed} (got {args.warmup_steps}): its first "
                             f"{needed - 1} steps only learn DDP's buckets and update nothing")
    if args.compile or args.compile_mode:
        raise UsageError("--compile is not supported by oss_benchmark.py: the strategies' own hooks (fairscale, "
                         "the ZeRO comm hook, the phase instrumentation) are measured eagerly; ddp_resnet50.py "
                         "--compile measures compiled DDP")
    if args.comm_hook != "none":
        raise UsageError(f"--comm-hook {args.comm_hook} is not supported by oss_benchmark.py: it compares each "
                         f"strategy's own communication, which a compressed DDP all-reduce would change for some "
                         f"and not others; ddp_resnet50.py --comm-hook measures it")
    if args.fsdp_param_dtype == "compute" and any(name.startswith("fsdp") for name in strategies):
        if args.device == "cpu":
            raise UsageError("--fsdp-param-dtype compute needs --device cuda: CPU autocast runs BatchNorm in fp32 "
                             "and refuses the bf16 weights FSDP would gather")
        if args.precision == "fp32":
            raise UsageError("--fsdp-param-dtype compute needs --precision bf16, fp16 or auto: with fp32 the "
                             "compute dtype is fp32, the same gathers as --fsdp-param-dtype fp32")
    if args.optimizer in ("adam", "adamw") and "momentum" in explicit:
        raise UsageError(f"--momentum does not apply to --optimizer {args.optimizer} (its betas are PyTorch's "
                         f"defaults); drop it")
    if args.model not in torchvision.models.list_models(module=torchvision.models):
        raise UsageError(f"--model {args.model} is not a torchvision classification model "
                         f"(e.g. resnet50, resnet101, resnet18, convnext_tiny)")
    problem = model_problem(args.model, args.image_size)
    if problem:
        raise UsageError(f"--model {args.model} cannot be trained here at {args.image_size} px: {problem}")
    return strategies, notes


def fairscale_import_error():
    try:
        import fairscale.nn.data_parallel  # noqa: F401
        import fairscale.optim  # noqa: F401
    except Exception as error:  # noqa: BLE001 - an old fairscale may fail on a new torch with any error
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    return None


def output_for(strategy, output, several):
    if output is None or not several:
        return output
    stem, extension = os.path.splitext(output)
    return f"{stem}-{strategy}{extension or '.json'}"


def build_model(name):
    return torchvision.models.get_model(name, weights=None, num_classes=NUM_CLASSES)


def optimizer_arguments(config):
    """Keyword arguments of the optimizer class, and the implementation they select: the same for every strategy
    (zero1_overlap passes them to the optimizer's functional twin, which has the same kernels) and on the CPU,
    where the tests run these very paths. Adam and AdamW are fused; SGD is not, because FSDP2's DTensor has no
    rule for the fused SGD kernel, and RMSprop has no fused kernel: both run the multi-tensor foreach kernels."""
    name = config["optimizer"]
    kwargs = {"lr": config["lr"]}
    if name in ("sgd", "rmsprop"):
        kwargs["momentum"] = config["momentum"]
    implementation = "fused" if name in ("adam", "adamw") else "foreach"
    kwargs[implementation] = True
    return kwargs, implementation


def state_tensors_per_parameter(config):
    """Optimizer state size in units of the parameters: what sharding the optimizer state divides."""
    name, momentum = config["optimizer"], config["momentum"] > 0
    return {"sgd": int(momentum), "adam": 2, "adamw": 2, "rmsprop": 1 + int(momentum)}[name]


def channels_last_strides(shape):
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def restride_channels_last(tensor):
    """Re-stride a densely stored 4-D tensor as channels_last over the same memory, keeping its values."""
    values = tensor.detach().clone()
    tensor.data = torch.as_strided(tensor.data, tensor.shape, channels_last_strides(tensor.shape))
    tensor.data.copy_(values)


def restore_channels_last(parameters):
    """Flat-bucket sharding (fairscale OSS, ShardedDDP's reduce buckets, ZeroRedundancyOptimizer) re-points each
    parameter, or gradient, at a slice of one buffer with view_as, which silently turns a channels_last weight
    contiguous: every convolution would convert it back, forward and backward, and DDP warns that its bucket
    strides no longer match. Re-stride each 4-D parameter and bucketed gradient as channels_last over the very
    same slice (same bytes, so the buckets' collectives still cover it). Returns how many were restored."""
    restored = 0
    with torch.no_grad():
        for param in parameters:
            if param.dim() != 4:
                continue
            for tensor in (param, param.grad):
                if tensor is None or tensor.stride() == channels_last_strides(tensor.shape):
                    continue
                if not tensor.is_contiguous():
                    raise RuntimeError(f"cannot restore channels_last over a strided tensor {tuple(tensor.shape)}")
                restride_channels_last(tensor)
                restored += tensor is param
    return restored


def parameter_layout(model):
    """How many convolution weights this rank holds in channels_last strides (FSDP2: its local shards)."""
    weights = [local_tensor(p) for p in model.parameters() if p.dim() == 4]
    return {"conv_weights": len(weights),
            "channels_last": sum(1 for p in weights if p.dim() == 4 and p.stride() == channels_last_strides(p.shape))}


def fsdp_units(module, granularity="block"):
    """The submodules FSDP shards one by one (the root is always a unit too, for what is left over).
    block: the children of the outermost Sequential containers (a ResNet's bottlenecks, a ViT's encoder
    blocks); stage: those containers themselves (a ResNet's layer1..layer4); model: none, one unit for all."""
    if granularity == "model":
        return []
    units = []
    for child in module.children():
        if isinstance(child, torch.nn.Sequential):
            blocks = [block for block in child.children() if any(True for _ in block.parameters())]
            units += blocks if granularity == "block" else [child] if blocks else []
        else:
            units += fsdp_units(child, granularity)
    return units


class Setup:
    """One strategy's wrapped model and optimizer, and how to step, zero and check it."""

    def __init__(self, model, optimizer, scaler=None, zero_grad=None, step_in_backward=False, sync_owner=None,
                 sync_method=None, units=(), owned=None, optimizer_impl=None):
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.optimizer_impl = optimizer_impl  # when this strategy cannot use the launch's kernels
        self.zero_grad = zero_grad or (lambda: optimizer.zero_grad(set_to_none=True))
        self.step_in_backward = step_in_backward
        self.sync_owner, self.sync_method = sync_owner, sync_method  # the method that broadcasts parameters
        self.units = list(units)  # FSDP modules, for the explicit unshard of the instrumented pass
        self.owned = owned  # () -> parameters whose optimizer state lives on this rank
        self.layout_pending = False  # zero1_overlap flattens its parameters at its third step


def wrap_strategy(strategy, model, config, device, mesh, channels_last):
    """The strategy's model and optimizer around a model that is already on its device."""
    opt_class, kwargs, fp16 = OPTIMIZERS[config["optimizer"]], config["optimizer_kwargs"], config["grad_scaler"]
    if strategy in ("ddp", "zero1", "zero1_overlap", "oss_ddp"):
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                        bucket_cap_mb=config["bucket_cap_mb"], static_graph=config["static_graph"],
                                        **ddp_buffer_option(config),
                                        gradient_as_bucket_view=config["gradient_as_bucket_view"])
    if strategy == "ddp":
        optimizer = opt_class(model.parameters(), **kwargs)
        return Setup(model, optimizer, torch.amp.GradScaler(device.type) if fp16 else None,
                     owned=lambda: list(model.parameters()))
    if strategy in FAIRSCALE_STRATEGIES:
        from fairscale.nn.data_parallel import ShardedDataParallel
        from fairscale.optim import OSS
        from fairscale.optim.grad_scaler import ShardedGradScaler
        optimizer = OSS(model.parameters(), optim=opt_class, **kwargs)  # after DDP, as fairscale documents
        zero_grad = None
        if strategy == "oss_sharded_ddp":
            model = ShardedDataParallel(model, optimizer, reduce_buffer_size=config["sharded_reduce_buffer"],
                                        broadcast_buffers=config["broadcast_buffers"])
            # Its first forward would re-flatten the parameters; do that setup now, then fix the layout once.
            model.refresh_trainable()
            # Its own zero_grad keeps the gradients that are views of its reduce buckets.
            zero_grad = lambda: model.zero_grad(set_to_none=True)  # noqa: E731
        if channels_last:
            restore_channels_last(model.parameters())
        return Setup(model, optimizer, ShardedGradScaler() if fp16 else None, zero_grad=zero_grad,
                     sync_owner=optimizer, sync_method="_broadcast_params",
                     owned=lambda: [p for g in optimizer.optim.param_groups for p in g["params"]])
    if strategy in ("zero1", "zero1_overlap"):
        from torch.distributed.optim import ZeroRedundancyOptimizer
        overlap = strategy == "zero1_overlap"
        impl = None
        if overlap and kwargs.get("fused"):
            # The comm hook steps a functional twin of the optimizer whose fused Adam keeps its step counter on
            # the CPU, which the CUDA kernel refuses (seen on the H200, torch 2.11): foreach kernels there.
            kwargs, impl = {**{k: v for k, v in kwargs.items() if k != "fused"}, "foreach": True}, "foreach"
        # One flat buffer per rank: one broadcast per rank after the step instead of one per parameter.
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=opt_class,
                                            parameters_as_bucket_view=not overlap, overlap_with_ddp=overlap, **kwargs)
        setup = Setup(model, optimizer, torch.amp.GradScaler(device.type) if fp16 else None,
                      step_in_backward=overlap, sync_owner=None if overlap else optimizer, optimizer_impl=impl,
                      sync_method=None if overlap else "_sync_params",
                      owned=lambda: [p for g in optimizer.optim.param_groups for p in g["params"]])
        if overlap:
            from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import hook_with_zero_step
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
            # shard_buckets splits each DDP bucket over the ranks: whole buckets per rank leave the state uneven.
            model.register_comm_hook(None, hook_with_zero_step(allreduce_hook, model, optimizer, shard_buckets=True))
            setup.layout_pending = channels_last
        elif channels_last:
            restore_channels_last(model.parameters())
        return setup
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    reshard = strategy == "fsdp_zero3"
    units = fsdp_units(model, config["fsdp_units"])
    # compute: all-gather the parameters in autocast's dtype (half the bytes), reduce the gradients in fp32
    policy = MixedPrecisionPolicy(param_dtype=fsdp_gather_dtype(config), reduce_dtype=torch.float32)
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    optimizer = opt_class(model.parameters(), **kwargs)
    return Setup(model, optimizer, ShardedGradScaler(device=device.type) if fp16 else None, units=[*units, model],
                 owned=lambda: list(model.parameters()))


def fsdp_gather_dtype(config):
    """The dtype FSDP2 all-gathers parameters in: None keeps them fp32 (autocast casts per operation, as
    under DDP); with --fsdp-param-dtype compute, autocast's dtype (bf16/fp16)."""
    return AUTOCAST_DTYPES[config["precision"]] if config["fsdp_param_dtype"] == "compute" else None


def train_step(setup, images, labels, config, marker=None):
    """One training step. In the instrumented pass, marker.close(phase) ends each phase, and FSDP's
    all-gather is done up front (unshard) so that it can be timed apart from forward."""
    mark = marker.close if marker is not None else (lambda phase: None)
    if marker is not None and setup.units:
        for unit in setup.units:
            unit.unshard()
        mark("parameter_sync_before_forward")
    dtype = AUTOCAST_DTYPES[config["precision"]]
    with torch.autocast(config["device"], dtype=dtype, enabled=dtype is not None):
        loss = F.cross_entropy(setup.model(images), labels)
    setup.zero_grad()
    mark("forward")
    (setup.scaler.scale(loss) if setup.scaler is not None else loss).backward()
    mark("backward")
    if setup.step_in_backward:
        if setup.layout_pending and any(p.dim() == 4 and p.stride() != channels_last_strides(p.shape)
                                        for p in setup.model.parameters()):
            restore_channels_last(setup.model.parameters())
            setup.layout_pending = False
    elif setup.scaler is not None:
        setup.scaler.step(setup.optimizer)
        setup.scaler.update()
    else:
        setup.optimizer.step()
    mark("optimizer_step")
    return loss.detach()


class PhaseMarker:
    """Phase boundaries of the instrumented pass: CUDA events on the GPU (read after one synchronize, so no
    host sync between phases), the host clock on the CPU, where every operation and every collective the
    strategy waits for has finished when the call returns.

    With synchronize=True (the host-cost pass) the device is synchronised at every boundary and the host clock
    read before and after: a phase's host time is then the time the host took to queue it from an idle GPU
    (its Python, dispatch and launches, plus any wait the strategy itself makes), which set beside the GPU's
    time says how close the step is to being bound by the host."""

    def __init__(self, device, synchronize=False):
        self.device, self.cuda, self.synchronize = device, device.type == "cuda", synchronize
        self.steps = []

    def now(self):
        """(CUDA event or None, host clock when the phase ended, host clock when the next one may start)."""
        event = None
        if self.cuda and not self.synchronize:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        ended = time.perf_counter()
        if self.synchronize and self.cuda:
            torch.cuda.synchronize(self.device)
        return event, ended, time.perf_counter() if self.synchronize else ended

    def start_step(self):
        self.steps.append([("start", self.now())])

    def close(self, phase):
        self.steps[-1].append((phase, self.now()))

    def phase_times_ms(self):
        """{phase: [ms per step]}: CUDA event times on the GPU (host clock in the synchronised pass and on the
        CPU); a phase closed twice in a step (the optimizer step around OSS's broadcast) adds up."""
        per_phase = {}
        for marks in self.steps:
            totals = {}
            for (_, (event0, _, start)), (phase, (event1, ended, _)) in zip(marks, marks[1:]):
                elapsed = event0.elapsed_time(event1) if event1 is not None else (ended - start) * 1e3
                totals[phase] = totals.get(phase, 0.0) + elapsed
            for phase, value in totals.items():
                per_phase.setdefault(phase, []).append(value)
        return per_phase


@contextlib.contextmanager
def timed_parameter_sync(setup, marker):
    """OSS and ZeroRedundancyOptimizer broadcast the parameters at the end of their step(): split it there."""
    if setup.sync_owner is None:
        yield
        return
    original = getattr(setup.sync_owner, setup.sync_method)

    def timed(*args, **kwargs):
        marker.close("optimizer_step")
        outcome = original(*args, **kwargs)
        marker.close("parameter_sync")
        return outcome

    setattr(setup.sync_owner, setup.sync_method, timed)
    try:
        yield
    finally:
        delattr(setup.sync_owner, setup.sync_method)


def instrumented_pass(setup, images, labels, config, device):
    """Median time per phase over config['phase_steps'] extra steps (after the timed ones), then the host's
    cost of each phase over as many steps with the device synchronised at every phase boundary."""
    if not config["phase_steps"]:
        return None
    phases = {}
    for synchronize, prefix in ((False, ""), (True, "host_")):
        marker = PhaseMarker(device, synchronize)
        with timed_parameter_sync(setup, marker):
            for _ in range(config["phase_steps"]):
                marker.start_step()  # in the synchronised pass this mark waits for the device first
                train_step(setup, images, labels, config, marker)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times = marker.phase_times_ms()
        step_totals = [sum(times[phase][i] for phase in times) for i in range(config["phase_steps"])]
        phases[f"{prefix}phases_ms"] = {phase: {"median": median(values), "mad": summarize(values)["mad"]}
                                        for phase, values in times.items()}
        phases[f"{prefix}step_ms_median"] = median(step_totals)
    return phases


ELEMENT_BYTES = {"float": 4, "double": 8, "c10::half": 2, "c10::bfloat16": 2, "long int": 8, "int64_t": 8,
                 "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
                 "float32": 4, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2, "long": 8, "int64": 8,
                 "int32": 4, "short": 2, "byte": 1, "char": 1}


def collective_kind(op_name):
    name = op_name.lower().replace("allgather", "all_gather").replace("allreduce", "all_reduce")
    for marker, kind in (("reduce_scatter", "reduce-scatter"), ("all_gather", "all-gather"),
                         ("all_reduce", "all-reduce"), ("broadcast", "broadcast"), ("reduce", "reduce")):
        if marker in name:
            return kind
    return "other"


def element_count(dims):
    """Elements of a recorded shape ([4, 3]) or of a list of shapes ([[4, 3], [7]])."""
    if not isinstance(dims, list):
        return 0
    if all(isinstance(d, int) for d in dims):
        return math.prod(dims)
    return sum(element_count(d) for d in dims)


def collectives_from_trace(events, steps):
    """Collectives per step by kind from a profiler trace. The c10d:: dispatcher ops are what the strategy asked
    for, on any backend (gloo runs a reduce-scatter as an all-reduce underneath); their input tensor says how
    many elements (an all-gather's input is this rank's shard). A tensor list carries no dtype in the trace,
    so the element size comes from the backend's own event of that size (gloo:*, nccl:*, record_param_comms)."""
    sizes = {}
    for event in events:
        name, args = event.get("name", ""), event.get("args") or {}
        if name == "record_param_comms" and "dtype" in args:
            for key in ("In msg nelems", "Out msg nelems"):
                sizes.setdefault(args.get(key), ELEMENT_BYTES.get(str(args["dtype"]).lower()))
        elif name.split(":")[0] in ("gloo", "nccl", "ucc", "mpi") and ":" in name:
            for dims, kind in zip(args.get("Input Dims") or [], args.get("Input type") or []):
                sizes.setdefault(element_count(dims), ELEMENT_BYTES.get(str(kind).lower()))
    totals, unknown = {}, 0
    for event in events:
        name, args = event.get("name", ""), event.get("args") or {}
        if not name.startswith("c10d::"):
            continue
        op = name[len("c10d::"):]
        index = 1 if any(word in op for word in ("gather", "scatter", "alltoall")) else 0
        dims, types = args.get("Input Dims") or [], args.get("Input type") or []
        elements = element_count(dims[index]) if index < len(dims) else 0
        size = ELEMENT_BYTES.get(str(types[index]).lower()) if index < len(types) else None
        if size is None:
            size = sizes.get(elements)
        if size is None and elements:
            unknown += 1
            size = 4
        entry = totals.setdefault(collective_kind(op), {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += elements * size
    per_step = {kind: {"count": value["count"] / steps, "bytes": value["bytes"] / steps}
                for kind, value in totals.items()}
    return per_step, unknown


@contextlib.contextmanager
def without_kineto_chatter():
    """The profiler's C++ side prints its stages (USDT:, STAGE:) and, on a machine without a GPU, a device-count
    ERROR straight to file descriptor 2. Hold stderr in a file meanwhile and pass on every other line."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines(keepends=True)
                    if not re.match(r"(USDT|STAGE):|ERROR:.*gpuGetDeviceCount", line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def count_collectives(setup, images, labels, config, device, trace_path=None):
    """Profile config['profile_steps'] more steps (host-side events only: no CUPTI) and count the collectives."""
    if not config["profile_steps"]:
        return None
    from torch.profiler import ProfilerActivity, profile
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "trace.json")
        with without_kineto_chatter(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
            for _ in range(config["profile_steps"]):
                train_step(setup, images, labels, config)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        profiler.export_chrome_trace(trace_path or path)
        with open(trace_path or path) as stream:
            events = json.load(stream).get("traceEvents", [])
    per_step, unknown = collectives_from_trace(events, config["profile_steps"])
    return {"per_step": per_step, "unknown_dtype_assumed_4_bytes": unknown}


# Wire bytes each rank sends per input byte, averaged over ranks, for ring/chain algorithms (NCCL's on one node).
def wire_factor(kind, world_size):
    n = world_size
    return {"all-reduce": 2 * (n - 1) / n, "reduce-scatter": (n - 1) / n, "all-gather": n - 1,
            "broadcast": (n - 1) / n, "reduce": (n - 1) / n}.get(kind, 0.0)


def analytic_volumes(strategy, parameter_bytes, buffer_bytes, world_size, gathered_bytes=None):
    """Input bytes per step and rank by kind (an all-gather's input is one shard). P = parameter bytes:
    DDP all-reduces P and broadcasts the buffers; ZeRO-1 (OSS, ZeroRedundancyOptimizer) adds a broadcast of P
    in total, one shard from each rank; ShardedDDP reduces P to the owners instead; FSDP reduce-scatters P and
    all-gathers the shards once (ZeRO-2) or twice (ZeRO-3: forward and backward)."""
    p, b, n = parameter_bytes, buffer_bytes, world_size
    g = p if gathered_bytes is None else gathered_bytes  # FSDP2 may all-gather in the compute dtype
    return {"ddp": {"all-reduce": p, "broadcast": b},
            "oss_ddp": {"all-reduce": p, "broadcast": p + b},
            "oss_sharded_ddp": {"reduce": p, "broadcast": p + b},
            "zero1": {"all-reduce": p, "broadcast": p + b},
            "zero1_overlap": {"all-reduce": p, "broadcast": p + b},
            "fsdp_zero2": {"all-gather": g / n, "reduce-scatter": p},
            "fsdp_zero3": {"all-gather": 2 * g / n, "reduce-scatter": p}}[strategy]


def wire_bytes(volumes, world_size):
    return sum(volume * wire_factor(kind, world_size) for kind, volume in volumes.items())


def local_tensor(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def optimizer_state_bytes(optimizer):
    """Bytes of optimizer state on this rank (OSS and ZeRO keep it in their inner .optim), without the
    one-number step counters of Adam and RMSprop."""
    inner = getattr(optimizer, "optim", optimizer)
    return sum(local_tensor(value).numel() * local_tensor(value).element_size()
               for per_parameter in inner.state.values() for value in per_parameter.values()
               if isinstance(value, torch.Tensor) and value.dim() > 0)


def full_parameters(model):
    """Every parameter whole, as a replica holds it: FSDP's sharded DTensors are gathered one at a time."""
    for param in model.parameters():
        yield param.full_tensor() if hasattr(param, "full_tensor") else param


def local_analysis(setup, config, phases, collectives, model_numbers):
    owned = sum(local_tensor(p).numel() for p in setup.owned())
    per_parameter = state_tensors_per_parameter(config)
    element_size = model_numbers["parameter_bytes"] // model_numbers["parameters"]
    return {"phases": phases, "collectives": collectives, "owned_parameters": owned,
            "optimizer_state_bytes": optimizer_state_bytes(setup.optimizer),
            "expected_optimizer_state_bytes": per_parameter * owned * element_size,
            "parameter_layout": parameter_layout(setup.model)}


def combine_analysis(strategy, config, everyone, model_numbers, world_size):
    """Rank 0's view plus every rank's figures, with the analytic volumes and memory expectations beside them."""
    rank0, parameters = everyone[0], model_numbers["parameters"]
    gather_dtype = fsdp_gather_dtype(config) if strategy.startswith("fsdp") else None
    gathered_bytes = model_numbers["parameter_bytes"] * (
        torch.empty((), dtype=gather_dtype).element_size() / 4 if gather_dtype is not None else 1)
    analytic = analytic_volumes(strategy, model_numbers["parameter_bytes"], model_numbers["buffer_bytes"],
                                world_size, gathered_bytes)
    per_parameter = state_tensors_per_parameter(config)
    ddp_state = per_parameter * model_numbers["parameter_bytes"]
    collectives = None
    if rank0["collectives"] is not None:
        measured = rank0["collectives"]["per_step"]
        collectives = {
            "source": "torch.profiler c10d:: ops (record_shapes), element size from the backend's events",
            "profiled_steps": config["profile_steps"], "measured_per_step": measured,
            "measured_per_step_per_rank": [entry["collectives"]["per_step"] for entry in everyone],
            "unknown_dtype_assumed_4_bytes": rank0["collectives"]["unknown_dtype_assumed_4_bytes"],
            "analytic_bytes_per_step": analytic,
            "measured_over_analytic": {kind: measured.get(kind, {"bytes": 0})["bytes"] / volume
                                       for kind, volume in analytic.items() if volume},
            "wire_bytes_per_rank_measured": wire_bytes({k: v["bytes"] for k, v in measured.items()}, world_size),
            "wire_bytes_per_rank_analytic": wire_bytes(analytic, world_size),
            "wire_model": "ring/chain average per rank: all-reduce 2(N-1)/N, reduce-scatter (N-1)/N, "
                          "all-gather (N-1) x shard, broadcast and reduce (N-1)/N of the input bytes"}
    phases = rank0["phases"]
    return {
        "model": config["model"], **model_numbers,
        "phase_steps": config["phase_steps"], "phase_note": PHASE_NOTES[strategy],
        "phases_ms": phases["phases_ms"] if phases else None,
        "phase_sum_ms_median": phases["step_ms_median"] if phases else None,
        "phases_ms_per_rank": [{k: v["median"] for k, v in e["phases"]["phases_ms"].items()} if e["phases"] else None
                               for e in everyone],
        "host_phases_ms": phases["host_phases_ms"] if phases else None,
        "host_phase_sum_ms_median": phases["host_step_ms_median"] if phases else None,
        "host_phase_sum_ms_median_per_rank": [e["phases"]["host_step_ms_median"] if e["phases"] else None
                                              for e in everyone],
        "collectives": collectives,
        "memory": {
            "optimizer_state_tensors_per_parameter": per_parameter,
            "owned_parameter_fraction_per_rank": [e["owned_parameters"] / parameters for e in everyone],
            "optimizer_state_bytes_per_rank": [e["optimizer_state_bytes"] for e in everyone],
            "expected_optimizer_state_bytes_per_rank": [e["expected_optimizer_state_bytes"] for e in everyone],
            "expected_optimizer_state_saving_bytes_vs_ddp":
                ddp_state - max(e["expected_optimizer_state_bytes"] for e in everyone)},
        "parameter_layout_per_rank": [e["parameter_layout"] for e in everyone],
    }


def workload_heading(result):
    config, world = result["config"], result["world"]
    parts = [config.get("model", "?"), config.get("optimizer", "?"), config["precision"],
             f"{config['image_size']} px", f"{config['batch_size_per_device']}/device",
             f"{world['world_size']} x {config['device']}", config["memory_format"]]
    if config.get("preset"):
        parts.append(f"preset {config['preset']}")
    return " | ".join(str(part) for part in parts)


def number(value, digits=0):
    return "-" if value is None else f"{value:,.{digits}f}"


def analysis_row(result, baseline):
    analysis, throughput = result.get("analysis") or {}, result["throughput"]
    phases = analysis.get("phases_ms") or {}
    phase = {name: (phases.get(name) or {}).get("median") for name in PHASES}
    sync = None if phase["parameter_sync"] is None and phase["parameter_sync_before_forward"] is None else \
        (phase["parameter_sync"] or 0.0) + (phase["parameter_sync_before_forward"] or 0.0)
    collectives = analysis.get("collectives") or {}
    measured = collectives.get("measured_per_step") or {}
    counts = ", ".join(f"{measured[kind]['count']:g} {kind}" for kind in COLLECTIVE_KINDS if kind in measured)
    measured_mib = sum(v["bytes"] for v in measured.values()) / 2**20 if measured else None
    analytic = collectives.get("analytic_bytes_per_step")
    analytic_mib = sum(analytic.values()) / 2**20 if analytic else None
    memory = analysis.get("memory") or {}
    state = max(memory["optimizer_state_bytes_per_rank"]) / 2**20 if memory else None
    expected = memory["expected_optimizer_state_saving_bytes_vs_ddp"] / 2**20 if memory else None
    peak = (result["memory"] or {}).get("peak_allocated_mib")
    base_peak = (baseline["memory"] or {}).get("peak_allocated_mib") if baseline else None
    relative = throughput["rank0_median_images_per_second"] / baseline["throughput"]["rank0_median_images_per_second"] \
        if throughput and baseline and baseline["throughput"] else None
    host = analysis.get("host_phase_sum_ms_median")
    return (f"| {result['strategy']} | {'-' if relative is None else f'{relative:.1%}'} | "
            f"{number(phase['forward'], 2)} | {number(phase['backward'], 2)} | {number(phase['optimizer_step'], 2)} | "
            f"{number(sync, 2)} | {number(host, 2)} | {counts or '-'} | {number(measured_mib, 1)} ({number(analytic_mib, 1)}) | "
            f"{number(state, 1)} | {number(expected, 1)} | "
            f"{number(base_peak - peak if peak is not None and base_peak is not None else None, 0)} |")


def print_strategy_table(results):
    """The seed's table (strategy | median img/s ± MAD | peak MiB), then the measured explanation, per workload."""
    groups = {}
    for result in results:
        groups.setdefault(workload_heading(result), []).append(result)
    for heading, members in groups.items():
        members = sorted(members, key=lambda r: STRATEGIES.index(r["strategy"]) if r["strategy"] in STRATEGIES
                         else len(STRATEGIES))
        baseline = next((r for r in members if r["strategy"] == "ddp" and r["status"] == "ok"), None)
        epoch_lengths = sorted({(r["throughput"] or {}).get("rank0_epochs", {}).get("steps_per_epoch")
                                for r in members} - {None})
        print(f"\n{heading}\n")
        if epoch_lengths:  # fairscale's own statistic: each epoch's throughput, median and MAD over the epochs
            print(f"| strategy | Median throughput (img/s) (rank 0) ± MAD | per epoch of "
                  f"{' or '.join(map(str, epoch_lengths))} steps: median ± MAD (epochs) | Peak memory (MiB) |")
            print("|---|---|---|---|")
        else:
            print("| strategy | Median throughput (img/s) (rank 0) ± MAD | Peak memory (MiB) |")
            print("|---|---|---|")
        for result in members:
            throughput, peak = result["throughput"], (result["memory"] or {}).get("peak_allocated_mib")
            name = result["strategy"] if result["status"] == "ok" else f"{result['strategy']} ({result['status']})"
            speed = "-" if not throughput else (f"{throughput['rank0_median_images_per_second']:,.0f} ± "
                                                f"{throughput['rank0_mad_images_per_second']:,.0f}")
            if epoch_lengths:
                epochs = (throughput or {}).get("rank0_epochs") or {}
                speed += " | " + ("-" if not epochs.get("count") else
                                  f"{epochs['median']:,.0f} ± {epochs['mad']:,.0f} ({epochs['count']})")
            print(f"| {name} | {speed} | {number(peak)} |")
        analysed = [result for result in members if result.get("analysis") is not None]
        if analysed:  # results of ddp_resnet50.py, or of a run stopped by a signal, have no analysis
            print("\n| strategy | vs ddp | forward ms | backward ms | optimizer step ms | parameter sync ms | "
                  "host ms per step | collectives per step | MiB per step measured (analytic) | "
                  "optimizer state MiB/rank | expected state saving MiB | peak saving vs ddp MiB |")
            print("|---|---|---|---|---|---|---|---|---|---|---|---|")
            for result in analysed:
                print(analysis_row(result, baseline))
    sys.stdout.flush()


def read_results(paths):
    results = []
    for path in paths:
        try:
            with open(path) as stream:
                result = json.load(stream)
        except (OSError, ValueError) as error:
            raise UsageError(f"--table: cannot read {path}: {error}") from None
        if not isinstance(result, dict) or not {"strategy", "status", "config", "world", "throughput",
                                                "memory"} <= set(result):
            raise UsageError(f"--table: {path} is not a benchmark result (no strategy, status, config, ...)")
        try:
            workload_heading(result)
            if result["throughput"]:
                float(result["throughput"]["rank0_median_images_per_second"])
                float(result["throughput"]["rank0_mad_images_per_second"])
        except (KeyError, TypeError, ValueError) as error:
            raise UsageError(f"--table: {path} is not an oss_benchmark.py result ({type(error).__name__}: "
                             f"{error})") from None
        results.append(result)
    return results


def run_strategy(config, result, launch, device, monitor, stop, mesh, hardware, wall_start):
    """Build, measure, instrument and profile one strategy; write its result. Returns (exit code, signal)."""
    rank, world_size, strategy = launch["rank"], launch["world_size"], config["strategy"]
    if rank == 0:
        print_environment(result, config)
    torch.manual_seed(config["seed"])  # identical initial weights on every rank and for every strategy
    model = build_model(config["model"]).to(device)
    model_numbers = {"parameters": sum(p.numel() for p in model.parameters()),
                     "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                     "buffers": sum(1 for _ in model.buffers()),
                     "buffer_bytes": sum(b.numel() * b.element_size() for b in model.buffers())}
    # FSDP2 refuses non-contiguous (channels_last) parameters: its inputs stay channels_last, so cuDNN still
    # runs channels_last convolutions and converts each weight on the fly.
    parameter_format = "contiguous" if strategy.startswith("fsdp") else config["memory_format"]
    if parameter_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
    setup = wrap_strategy(strategy, model, config, device, mesh, parameter_format == "channels_last")
    images, labels = make_synthetic_batch(config, rank, device)

    record = measure(lambda: train_step(setup, images, labels, config), config, device, rank, world_size,
                     monitor, stop)
    if not record["signal"]:  # every rank agreed on the signal, so all of them run the passes or none
        if rank == 0 and (config["phase_steps"] or config["profile_steps"]):
            print(f"  instrumented pass ({config['phase_steps']} steps), profiled pass "
                  f"({config['profile_steps']} steps)", flush=True)
        phases = instrumented_pass(setup, images, labels, config, device)
        trace = os.path.join(config["trace_dir"], f"{os.path.splitext(os.path.basename(config['output']))[0]}"
                                                  f"-rank{rank}.trace.json") if config["trace_dir"] else None
        collectives = count_collectives(setup, images, labels, config, device, trace)
        local = local_analysis(setup, config, phases, collectives, model_numbers)
        everyone = gather_to_all(local, monitor, world_size)
        if rank == 0:
            result["analysis"] = {"parameter_memory_format": parameter_format, "fsdp_units": len(setup.units),
                                  "optimizer_impl": setup.optimizer_impl or config["optimizer_impl"],
                                  **combine_analysis(strategy, config, everyone, model_numbers, world_size)}
    inject_fault(config, rank, 0, "desync", setup.model)
    record.update(hardware=hardware, checksums=parameter_checksums(full_parameters(setup.model)))
    return finish_run(result, record, monitor, lambda: build_model(config["model"]), wall_start), record["signal"]


def resolve_configs(args, strategies, overrides, launch, cuda_available, device_count, bf16_supported):
    """One harness config per strategy (its own --output when there are several), checked before any GPU work."""
    configs = []
    for strategy in strategies:
        per_strategy = argparse.Namespace(**vars(args))
        per_strategy.output = output_for(strategy, args.output, len(strategies) > 1)
        config = resolve_harness_config(per_strategy, launch, strategy, cuda_available, device_count, bf16_supported)
        resolve_ddp_options(per_strategy, config, launch["world_size"])
        # Only options and what follows from them, the same for every strategy of the launch: what a strategy
        # makes of them (its parameter layout, its FSDP units) goes into the result's analysis.
        config.update(model=args.model, optimizer=args.optimizer, preset=args.preset, preset_overrides=overrides,
                      sharded_reduce_buffer=args.sharded_reduce_buffer, cudnn_deterministic=args.cudnn_deterministic,
                      fsdp_units=args.fsdp_units, fsdp_param_dtype=args.fsdp_param_dtype,
                      phase_steps=args.phase_steps, profile_steps=args.profile_steps, trace_dir=args.trace_dir,
                      strategies_in_launch=strategies)
        config["optimizer_kwargs"], config["optimizer_impl"] = optimizer_arguments(config)
        config["optimizer_state_tensors_per_parameter"] = state_tensors_per_parameter(config)
        configs.append(config)
    return configs


def print_launch_notes(args, explicit, notes, overrides, configs):
    """Everything the launch does differently from what was literally asked, said before it starts."""
    for note in notes:
        print(f"note: {note}")
    for option, values in overrides.items():
        print(f"note: --preset {args.preset}: --{option.replace('_', '-')} {values['given']} given explicitly "
              f"overrides the preset's {values['preset']}")
    if "lr" not in explicit and args.preset is None:
        print(f"note: --optimizer {args.optimizer} uses lr {args.lr:g} (pass --lr to change it)")
    fsdp = [config["strategy"] for config in configs if config["strategy"].startswith("fsdp")]
    if fsdp and configs[0]["memory_format"] == "channels_last":
        print(f"note: {', '.join(fsdp)} keep their parameters contiguous (FSDP2 refuses channels_last parameters); "
              f"their inputs stay channels_last")
    if len(configs) > 1:
        print(f"note: {len(configs)} strategies, one result each: {', '.join(c['output'] for c in configs)}")
    sys.stdout.flush()


def main(argv=None):
    started_at = datetime.datetime.now(datetime.timezone.utc)
    wall_start = time.perf_counter()
    args, explicit = parse_arguments(argv)
    if args.table is not None:
        if explicit - {"table"}:
            raise UsageError(f"--table only reads result files: drop --{sorted(explicit - {'table'})[0]}")
        print_strategy_table(read_results(args.table))
        return EXIT_OK
    overrides = apply_preset(args, explicit)
    if "lr" not in explicit and args.preset is None:
        args.lr = DEFAULT_LR[args.optimizer]
    strategies, notes = resolve_strategies(args, explicit)
    if args.cudnn_deterministic and args.cudnn_benchmark:
        raise UsageError("--cudnn-deterministic turns cuDNN's autotuning off: drop --cudnn-benchmark")
    if args.cudnn_deterministic and args.cudnn_benchmark_limit is not None:
        raise UsageError("--cudnn-deterministic turns cuDNN's autotuning off: drop --cudnn-benchmark-limit")
    if args.trace_dir:
        try:
            os.makedirs(args.trace_dir, exist_ok=True)
        except OSError as error:
            raise UsageError(f"--trace-dir {args.trace_dir} cannot be made ({error.strerror})") from None
        if not os.access(args.trace_dir, os.W_OK | os.X_OK):
            raise UsageError(f"--trace-dir {args.trace_dir} is not a writable directory")
    launch = detect_launch(os.environ)
    if launch["world_size"] < 2:
        raise UsageError("sharding needs at least 2 ranks: launch with torchrun --nproc-per-node 2 (or srun with "
                         "2 tasks); python oss_benchmark.py --table FILES only prints results")
    cuda_available = args.device == "cuda" and torch.cuda.is_available()
    device_count = torch.cuda.device_count() if cuda_available else 0
    configs = resolve_configs(args, strategies, overrides, launch, cuda_available, device_count,
                              cuda_available and torch.cuda.is_bf16_supported())
    rank, world_size = launch["rank"], launch["world_size"]
    stop = StopRequest()
    stop.install()
    device = setup_device(configs[0], launch, device_count)
    for config in configs:
        config["cpu_threads_per_rank"] = configs[0].get("cpu_threads_per_rank")
        config["cudnn_benchmark_limit"] = configs[0]["cudnn_benchmark_limit"]  # what setup_device() resolved
        if args.cudnn_deterministic:
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
            config["cudnn_benchmark"], config["cudnn_benchmark_limit"] = False, None
    result = base_result(configs[0], launch, started_at)
    store = monitor = None
    finished, exit_code, strategy_start = [], EXIT_OK, wall_start
    try:
        store, monitor = init_distributed(configs[0], launch, device)
        hardware = collect_local_hardware(device, rank)
        check_rank_agreement(configs[0], hardware, monitor, world_size)
        mesh = None
        if any(s.startswith("fsdp") for s in strategies):
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh(device.type, (world_size,))
        if rank == 0:
            print_launch_notes(args, explicit, notes, overrides, configs)
        for config in configs:
            strategy_start = time.perf_counter()
            result = base_result(config, launch, datetime.datetime.now(datetime.timezone.utc))
            code, signum = run_strategy(config, result, launch, device, monitor, stop, mesh, hardware,
                                        strategy_start)
            finished.append(result)
            exit_code = exit_code or code
            gc.collect()  # the previous strategy's model, optimizer and buffers, before the next one measures
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            if signum:
                break
        if rank == 0:
            print_strategy_table(finished)
        return exit_code
    except UsageError:
        raise
    except BaseException as error:  # noqa: BLE001 - every failure must end in a result, not a traceback
        if rank == 0 and finished:
            print_strategy_table(finished)
        return fail(error, result, rank, world_size, store, device, strategy_start)
    finally:
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


if __name__ == "__main__":
    run_guarded(main)
