"""Native PyTorch DDP training benchmark of a randomly initialised torchvision ResNet-50.

Each rank trains on its own synthetic ImageNet-shaped batch that lives on its device, so the numbers
measure the model's computation and DDP's gradient all-reduce, not data loading. Warm-up steps are
excluded; the timed steps are measured with CUDA events (no host sync inside the loop, except fp16's
dynamic GradScaler, which reads its overflow flag every step) and with the host clock around the whole timed
region. Rank 0 prints a Markdown table and writes one JSON result.

Launch recipes:

    # one device
    python ddp_resnet50.py --output result-1gpu.json
    # all GPUs of a workstation (weak scaling: a fixed 256 images per GPU)
    torchrun --standalone --nproc-per-node 8 ddp_resnet50.py --output result-8gpu.json
    # strong scaling: a fixed global batch, split over the ranks
    torchrun --standalone --nproc-per-node 8 ddp_resnet50.py --global-batch-size 1024
    # Slurm, one task per GPU (MASTER_ADDR/PORT derived from the job when unset)
    srun --ntasks-per-node 4 --gpus-per-node 4 python ddp_resnet50.py --output result-4gpu.json
    # several nodes through torchrun
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint $HEAD:29500 ddp_resnet50.py
    # CPU smoke run (gloo), as in CI
    torchrun --standalone --nproc-per-node 2 ddp_resnet50.py --device cpu --image-size 32 \
        --batch-size-per-device 4 --warmup-steps 2 --steps 4 --output /tmp/smoke.json

Numbers: images_per_second = global images of the timed steps / wall time of the timed region
(max over ranks). Step times are pooled over ranks. Exit codes: 0 ok, 1 error, 2 bad input,
3 parameters out of sync, 4 out of memory, 128+N interrupted by signal N.
"""

import argparse
import contextlib
import datetime
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

BENCHMARK = "ddp_resnet50.py"
STRATEGY = "ddp"
NUM_CLASSES = 1000


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


def parse_arguments(argv=None):
    parser = OneLineArgumentParser(description=__doc__.split("\n")[0],
                                   formatter_class=HelpFormatter)
    add_harness_arguments(parser)
    add_ddp_arguments(parser, cuda_graphs=True, fixed_loss_scale=True)
    add_computation_arguments(parser)
    return parser.parse_args(argv)


def build_model():
    return torchvision.models.resnet50(weights=None, num_classes=NUM_CLASSES)


def make_optimizer(parameters, config):
    return torch.optim.SGD(parameters, lr=config["lr"], momentum=config["momentum"],
                           fused=config["optimizer_impl"] == "fused")


def train_step(model, optimizer, scaler, images, labels, config):
    with autocast_for(config):
        loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    elif config["loss_scale"] is not None:  # fp16 with a fixed scale: no overflow check, no host sync
        (loss * config["loss_scale"]).backward()
        unscale_gradients(model.parameters(), config["loss_scale"])
        optimizer.step()
    else:
        loss.backward()
        optimizer.step()
    return loss.detach()


def resolve_config(args, launch):
    """Every option checked and resolved, before any process group or GPU work. Returns (config, GPU count)."""
    cuda_available = args.device == "cuda" and torch.cuda.is_available()
    device_count = torch.cuda.device_count() if cuda_available else 0
    bf16_supported = cuda_available and torch.cuda.is_bf16_supported()
    config = resolve_harness_config(args, launch, STRATEGY, cuda_available, device_count, bf16_supported)
    resolve_ddp_options(args, config, launch["world_size"])
    resolve_computation_options(args, config)
    config.update(model="resnet50", optimizer="sgd", optimizer_impl=sgd_implementation(config))
    return config, device_count


def build_step(config, device, rank, world_size):
    """The model (identical initial weights on every rank), its DDP wrapper, optimizer and batch, and the
    training step that measure() times. Returns (step, model)."""
    torch.manual_seed(config["seed"])
    model = apply_computation_options(build_model(), config).to(device)
    if config["memory_format"] == "channels_last":
        model = model.to(memory_format=torch.channels_last)
    if world_size > 1:
        # A captured all-reduce must come from a DDP built on a side stream (PyTorch's CUDA graph notes).
        with torch.cuda.stream(torch.cuda.Stream()) if config["cuda_graphs"] else contextlib.nullcontext():
            model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                            bucket_cap_mb=config["bucket_cap_mb"],
                                            static_graph=config["static_graph"],
                                            **ddp_buffer_option(config),
                                            gradient_as_bucket_view=config["gradient_as_bucket_view"])
            hook = comm_hook_function(config)
            if hook is not None:  # --comm-hook: PyTorch's compression of the all-reduce
                model.register_comm_hook(None, hook)
    optimizer = make_optimizer(model.parameters(), config)
    scaler = torch.amp.GradScaler(device.type) if config["grad_scaler"] else None
    if config["compile"]:
        model = torch.compile(model, mode=None if config["compile_mode"] == "default" else config["compile_mode"])
    images, labels = make_synthetic_batch(config, rank, device)

    step = lambda: train_step(model, optimizer, scaler, images, labels, config)  # noqa: E731
    if config["cuda_graphs"]:
        step = GraphedStep(step, eager_steps=config["warmup_steps"] - 1)
    return step, model


def main(argv=None):
    started_at = datetime.datetime.now(datetime.timezone.utc)
    wall_start = time.perf_counter()
    args = parse_arguments(argv)
    launch = detect_launch(os.environ)
    config, device_count = resolve_config(args, launch)
    rank, world_size = launch["rank"], launch["world_size"]
    stop = StopRequest()
    stop.install()
    device = setup_device(config, launch, device_count)
    result = base_result(config, launch, started_at)
    store = monitor = step = None
    try:
        store, monitor = init_distributed(config, launch, device)
        hardware = collect_local_hardware(device, rank)
        check_rank_agreement(config, hardware, monitor, world_size)
        if rank == 0:
            print_environment(result, config)

        step, model = build_step(config, device, rank, world_size)
        record = measure(step, config, device, rank, world_size, monitor, stop)
        inject_fault(config, rank, 0, "desync", model)
        record.update(hardware=hardware, checksums=parameter_checksums(model.parameters()))
        return finish_run(result, record, monitor, build_model, wall_start)
    except UsageError:
        raise
    except BaseException as error:  # noqa: BLE001 - every failure must end in a result, not a traceback
        return fail(error, result, rank, world_size, store, device, wall_start)
    finally:
        shut_down(step)


def shut_down(step):
    """Free a captured step's graph, then the process group: a live graph holding NCCL kernels makes
    destroy_process_group hang (pytorch#115388; two 2-GPU --cuda-graphs runs did, after writing their results)."""
    if isinstance(step, GraphedStep):
        step.reset()
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


if __name__ == "__main__":
    run_guarded(main)
