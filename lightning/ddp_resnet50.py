"""PyTorch Lightning twin of ddp_resnet50.py: the same ResNet-50 benchmark, with Lightning running the loop.

The same randomly initialised torchvision ResNet-50, synthetic batch per rank, SGD, batch modes, warm-up, timed
steps, checks and result JSON as the native script, so that the two compare exactly: the difference is what
Lightning takes over (process start, DDP wrapper, mixed precision, backward and optimizer step, the loop) and what
that costs. A default run is stock Lightning: its DDPStrategy (DDP built on a side CUDA stream) and its own
per-step loop, including the SIGTERM broadcast before every step. --lightning-matched matches native on those two
points (lightning/README.md).

Launch recipes:

    # one GPU (or a CI smoke run on one GPU)
    python lightning/ddp_resnet50.py --output result-1gpu.json
    # Lightning's own launcher: it starts one process per GPU (--devices) itself
    python lightning/ddp_resnet50.py --devices 8 --output result-8gpu.json
    # the same, matched to native: DDP on the current stream, no per-step SIGTERM broadcast
    python lightning/ddp_resnet50.py --devices 8 --lightning-matched --output result-8gpu-matched.json
    # Slurm, one task per GPU: --ntasks-per-node must equal --devices, the node count --num-nodes
    srun --nodes 2 --ntasks-per-node 4 --gpus-per-node 4 python lightning/ddp_resnet50.py --devices 4 --num-nodes 2
    # torchrun: --nproc-per-node must equal --devices
    torchrun --standalone --nproc-per-node 8 lightning/ddp_resnet50.py --devices 8
    # CPU smoke run (gloo), as in the tests
    python lightning/ddp_resnet50.py --device cpu --devices 2 --image-size 32 --batch-size-per-device 4 \\
        --warmup-steps 2 --steps 4 --output /tmp/smoke.json

Numbers: images_per_second = global images of the timed steps / wall time of the timed region (the slowest
rank's). Step times are pooled over ranks. Exit codes: 0 ok, 1 error, 2 bad input, 3 parameters out of sync,
4 out of memory, 128+N stopped by signal N.
"""

import argparse
import contextlib
import datetime
import importlib.metadata
import inspect
import json
import logging
import math
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

try:
    import lightning as L
    from lightning.pytorch.plugins import MixedPrecision
    from lightning.pytorch.plugins.environments import SLURMEnvironment
    from lightning.pytorch.strategies import DDPStrategy
    from lightning.pytorch.utilities.exceptions import SIGTERMException
except ImportError:
    print("lightning/ddp_resnet50.py: error: Lightning is not installed: pip install '.[lightning]'", file=sys.stderr)
    sys.exit(2)

SCRIPT, STRATEGY = "lightning/ddp_resnet50.py", "lightning_ddp"
TRAINER_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}  # fp32 keeps TF32, as native


def parse_arguments(argv=None):
    parser = OneLineArgumentParser(SCRIPT, __doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=1, help="processes (devices) per node (%(default)s)")
    parser.add_argument("--num-nodes", type=int, default=1, help="nodes (%(default)s)")
    parser.add_argument("--lightning-matched", action="store_true",
                        help="match native: DDP built on the current CUDA stream instead of Lightning's side stream "
                             "(except with --cuda-graphs, which needs the side stream), and no per-step SIGTERM "
                             "broadcast (a rank that gets SIGTERM still stops after its step, as Lightning does)")
    return parse_arguments_with_extras(parser, argv)


def train_step(module, images, labels, config):
    """The whole step under manual optimization (--cuda-graphs), as native's: forward, zero_grad, backward with
    DDP's all-reduce (manual_backward: the precision plugin scales the loss), the optimizer step (the plugin's
    scaler unscales the gradients first)."""
    optimizer = module.optimizers()
    if module.sync_buffers:  # rank 0's buffers before the forward, as DDP's forward would (on_train_start says why)
        broadcast_buffers_now(module.trainer)
    dtype = AUTOCAST_DTYPES[config["precision"]]
    # a CUDA graph's capture must not keep autocast's cache of cast weights (Lightning's before 2.6 keeps it)
    with torch.autocast(config["device"], dtype=dtype, enabled=dtype is not None, cache_enabled=False):
        loss = F.cross_entropy(module.model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    module.manual_backward(loss)
    optimizer.step()
    return loss.detach()


class ResNet50Benchmark(L.LightningModule):
    """The model, its optimizer and input, and the hooks through which the harness's Run times Lightning's loop."""

    def __init__(self, run):
        super().__init__()
        config, self.run, self.config = run.config, run, run.config
        torch.manual_seed(config["seed"])  # identical initial weights on every rank
        model = build_model()
        if (config["stem_conv"], config["max_pool_backward"], config["batch_norm"]) != ("torchvision",) * 3:
            model = import_extras().apply_computation_options(model, config)
        self.model = model.to(memory_format=torch.channels_last if config["memory_format"] == "channels_last"
                              else torch.contiguous_format)
        if config["compile"]:  # the ResNet alone: DDP wraps this module, and Dynamo splits the graph at its buckets
            self.model = torch.compile(self.model, mode=None if config["compile_mode"] == "default"
                                       else config["compile_mode"])
        self.automatic_optimization = not config["cuda_graphs"]  # a capture needs the whole step in training_step
        self.whole_step = self.loss = None
        self.sync_buffers = False
        self.exit_code = EXIT_CODES["error"]

    def setup(self, stage):
        self.run.join_ranks()  # Lightning has made the process group: the harness's gloo group

    def configure_optimizers(self):
        return make_sgd(self.parameters(), self.config)

    def train_dataloader(self):
        # one plain integer per step, nothing to copy to the device; every rank sees all of them (no sampler)
        return torch.utils.data.DataLoader(range(self.config["warmup_steps"] + self.config["steps"]), batch_size=None)

    def on_train_start(self):
        config, run, trainer = self.config, self.run, self.trainer
        if not config["lightning_sigterm_sync"]:
            turn_off_the_sigterm_broadcast(trainer)
        ddp = trainer.strategy.model if isinstance(trainer.strategy.model, DistributedDataParallel) else None
        if ddp is not None and config["comm_hook"] != "none" and self.device.type == "cpu":
            ddp.register_comm_hook(None, import_extras().comm_hook(config))  # Lightning registers it on CUDA only
        self.images, self.labels = run.synthetic_batch()
        self.whole_step = lambda: train_step(self, self.images, self.labels, config)  # manual optimization
        if config["cuda_graphs"]:
            self.whole_step = import_extras().GraphedStep(self.whole_step, eager_steps=config["warmup_steps"] - 1)
        # Under manual optimization Lightning runs training_step inside DDP's forward, and its forward redirection
        # leaves require_forward_param_sync False after every step: DDP would broadcast the buffers only before the
        # first forward. With --broadcast-buffers the step broadcasts them itself, captured with it as in native.
        self.sync_buffers = not self.automatic_optimization and config["broadcast_buffers"] and ddp is not None

    def training_step(self, batch, batch_idx):
        if self.automatic_optimization:  # Lightning runs zero_grad, backward with DDP's all-reduce and the step
            loss = F.cross_entropy(self.model(self.images), self.labels)
        elif getattr(self.whole_step, "graph", None) is not None:
            loss = replay_counted_as_a_step(self.optimizers(), self.whole_step)
        else:
            loss = self.whole_step()  # eager, or the capture (counted by LightningOptimizer.step itself)
        self.loss = loss.detach()  # stays on the device: reading it would sync
        return loss

    def on_train_batch_start(self, batch, batch_idx):
        if self.sync_buffers:
            leave_the_buffer_broadcast_to_the_step(self.trainer)
        self.run.before_step(batch_idx)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.run.after_step(batch_idx, self.loss)

    def on_train_end(self):
        rank_record = self.run.collect_record(self.model.parameters())
        if self.config["collective_probe"]:  # every rank, after its timed steps
            self.run.result["collective_probe"] = import_extras().probe_collectives(self.run)
        self.exit_code = self.run.finish(rank_record)


def build_step(run):
    """The LightningModule and the Trainer that runs it: Lightning's DDPStrategy (matched: CurrentStreamDDPStrategy)
    with the DDP options, its precision flag or plugin, its barebones loop. Returns (trainer, module)."""
    config, strategy, plugins = run.config, "auto", []  # one device: no DDP wrapper, as native
    module = ResNet50Benchmark(run)
    if run.world_size > 1:
        # --cuda-graphs keeps Lightning's side stream: a captured all-reduce must come from a DDP built on one
        matched = config["lightning_variant"] == "matched" and not config["cuda_graphs"]
        kind = CurrentStreamDDPStrategy if matched else DDPStrategy
        strategy = kind(process_group_backend=config["backend"], timeout=run.timeout, **run.ddp_options(),
                        ddp_comm_hook=import_extras().comm_hook(config) if config["comm_hook"] != "none" else None)
    precision = config["trainer_precision"]
    if config["loss_scale"] not in (None, "dynamic"):  # Lightning refuses a precision flag beside the plugin
        precision = None
        scaler = import_extras().FixedLossScaler(config["loss_scale"])  # no host read: the step can be captured
        plugins.append(MixedPrecision("16-mixed", config["device"], scaler))
    if run.launch["launcher"] == "slurm":  # srun's tasks even in a job named like an interactive one; no requeue
        plugins.append(SLURMEnvironment(auto_requeue=False))
    for name in ("lightning.pytorch", "lightning.fabric"):  # the benchmark's output, not Lightning's tips about it
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", ".*(does not have many workers|barebones=True|LeafSpec|srun).*")
    trainer = L.Trainer(accelerator="gpu" if config["device"] == "cuda" else "cpu", devices=config["devices"],
                        num_nodes=config["num_nodes"], strategy=strategy, precision=precision, plugins=plugins or None,
                        max_epochs=1, max_steps=config["warmup_steps"] + config["steps"], barebones=True,
                        use_distributed_sampler=False)
    return trainer, module


def measure(trainer, module):
    """Warm-up, then the timed steps, in Lightning's loop (the module's hooks time them)."""
    trainer.fit(module)


@record  # under torchrun, a failing rank's traceback is the job's root cause
def main(argv=None):
    args = parse_arguments(argv)
    launch = plan_launch(args, os.environ)
    cuda = args.device == "cuda" and torch.cuda.is_available()
    device_count = torch.cuda.device_count() if cuda else 0
    config = resolve_harness_config(args, launch, SCRIPT, STRATEGY, cuda, device_count,
                                    cuda and torch.cuda.is_bf16_supported())
    config.update(model="resnet50", optimizer="sgd", optimizer_impl=sgd_implementation(cuda, config["grad_scaler"]),
                  trainer_precision=TRAINER_PRECISION[config["precision"]],
                  **lightning_variant(config.pop("lightning_matched"), launch["world_size"] > 1, cuda,
                                      config["cuda_graphs"]))
    refusal = output_refusal(config)
    if refusal:
        raise UsageError(refusal)
    run, module = Run(config, launch, device_count), None
    run.meet_within()  # before Lightning makes the process group: join_ranks() ends it
    if run.rank > 0:  # Lightning's connect gives up at --timeout with a C++ stack: reach the master's store first
        dist.TCPStore(launch["master_addr"], launch["master_port"], is_master=False, timeout=2 * run.timeout,
                      wait_for_workers=False)
    try:
        trainer, module = build_step(run)
        measure(trainer, module)
        return module.exit_code
    except SIGTERMException:  # Lightning stops after the step in which SIGTERM came: its exit code, not 0
        return 128 + signal.SIGTERM
    except (KeyboardInterrupt, SystemExit) as stop:  # Ctrl-C: Lightning kills its other processes, then exits 1
        if not isinstance(stop, KeyboardInterrupt) and not isinstance(stop.__context__, KeyboardInterrupt):
            raise
        print(f"{SCRIPT}: interrupted (SIGINT) on rank {run.rank}\n", end="", file=sys.stderr, flush=True)  # 1 write
        return 128 + signal.SIGINT
    except Exception as error:  # noqa: BLE001 - one rank out of memory: its "oom" result; else raised again
        return run.out_of_memory(error)
    finally:
        run.meeting.cancel()  # a fit that ended before it met the others
        shut_down(getattr(module, "whole_step", None))


def lightning_variant(matched, several, cuda, cuda_graphs):
    """What runs, as the result records it: stock Lightning keeps its DDP on a side stream and its per-step SIGTERM
    broadcast (both only with several processes); matched drops them, but --cuda-graphs needs manual optimization
    and the side stream (a captured all-reduce must come from a DDP built on one)."""
    return {"lightning_variant": "matched" if matched else "stock",
            "lightning_ddp_side_stream": several and cuda and (not matched or cuda_graphs),
            "lightning_sigterm_sync": several and not matched, "lightning_manual_optimization": cuda_graphs}


def plan_launch(args, env):
    """Who starts the processes: srun or torchrun (their layout must match --devices and --num-nodes), else
    Lightning itself, which runs this script again for each further process with LOCAL_RANK and NODE_RANK set."""
    if min(args.devices, args.num_nodes) < 1:
        raise UsageError("--devices and --num-nodes must be positive")
    launch = detect_launch(env)
    if launch["launcher"] in ("slurm", "torchrun"):
        if (launch["local_world_size"], launch["num_nodes"]) != (args.devices, args.num_nodes):
            raise UsageError(f"{launch['launcher']} started {launch['local_world_size']} processes per node on "
                             f"{launch['num_nodes']} node(s): give --devices {launch['local_world_size']} "
                             f"--num-nodes {launch['num_nodes']}")
        env.setdefault("MASTER_PORT", str(launch["master_port"]))  # Lightning then uses the port the result records
        return launch
    if launch["launcher"] == "env":
        raise UsageError("RANK and WORLD_SIZE without torchrun: start the twin with --devices and --num-nodes (it "
                          "starts its own processes), under torchrun or under srun")
    given = {name: env.get(name, "0") for name in ("NODE_RANK", "LOCAL_RANK", "MASTER_PORT")}
    if not all(re.fullmatch(r"\d{1,5}", text) for text in given.values()) or int(given["MASTER_PORT"]) > 65535:
        raise UsageError(", ".join(f"{name}={text!r}" for name, text in given.items()) + " must be integers "
                          "(MASTER_PORT up to 65535)")
    (node_rank, local_rank, port), world = map(int, given.values()), args.devices * args.num_nodes
    if not (node_rank < args.num_nodes and local_rank < args.devices):
        raise UsageError(f"NODE_RANK={node_rank} LOCAL_RANK={local_rank} do not fit --num-nodes {args.num_nodes} "
                          f"--devices {args.devices}")
    if world > 1 and "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):  # (as
        # Lightning's SLURMEnvironment.detect(), which takes the job for srun's tasks and waits for them)
        raise UsageError("inside a Slurm job, start the twin under srun with one task per device")
    if world > 1 and args.num_nodes == 1 and "MASTER_PORT" not in env:  # a free port, for Lightning and the result
        with socket.create_server(("127.0.0.1", 0)) as probe:
            port = probe.getsockname()[1]
        env["MASTER_PORT"] = str(port)
    return {**launch, "launcher": "lightning" if world > 1 else "single", "rank": node_rank * args.devices +
            local_rank, "world_size": world, "local_rank": local_rank, "local_world_size": args.devices,
            "num_nodes": args.num_nodes, "master_addr": env.get("MASTER_ADDR") or "127.0.0.1", "master_port": port}


# ---------------------------------------------------------------------------- Lightning's private names
# What --lightning-matched and --cuda-graphs need of Lightning (and of DDP) beyond its public API, all here. Checked
# with Lightning 2.6.6 and torch 2.11-2.14; tests/test_lightning.py fails with a clear message when an upgrade removes
# one of PRIVATE_NAMES.
PRIVATE_NAMES = (  # module, class, attribute (an instance attribute is named in its __init__)
    ("lightning.pytorch.strategies.ddp", "DDPStrategy", "_setup_model"),
    ("lightning.pytorch.strategies.ddp", "DDPStrategy", "_ddp_kwargs"),
    ("lightning.pytorch.loops.training_epoch_loop", "_TrainingEpochLoop", "_broadcast_sigterm_tensor"),
    ("lightning.pytorch.core.optimizer", "LightningOptimizer", "_on_before_step"),
    ("lightning.pytorch.core.optimizer", "LightningOptimizer", "_on_after_step"),
    ("torch.nn.parallel.distributed", "DistributedDataParallel", "_sync_buffers"),
    ("torch.nn.parallel.distributed", "DistributedDataParallel", "require_forward_param_sync"))


class CurrentStreamDDPStrategy(DDPStrategy):
    """--lightning-matched: Lightning's DDPStrategy with DDP built on the current CUDA stream, as native builds it.
    Lightning builds it on a new side stream, PyTorch's rule for DDP inside a captured CUDA graph."""

    def _setup_model(self, model):
        return DistributedDataParallel(module=model, device_ids=self.determine_ddp_device_ids(), **self._ddp_kwargs)


def turn_off_the_sigterm_broadcast(trainer):
    """--lightning-matched: no broadcast of a SIGTERM flag from rank 0 before every step (a device sync)."""
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None


def broadcast_buffers_now(trainer):
    trainer.strategy.model._sync_buffers()


def leave_the_buffer_broadcast_to_the_step(trainer):
    trainer.strategy.model.require_forward_param_sync = False  # train_step broadcasts them, not DDP's forward


def replay_counted_as_a_step(optimizer, graphed_step):
    """A replay steps the optimizer out of Lightning's sight: count it as LightningOptimizer.step does."""
    optimizer._on_before_step()
    loss = graphed_step()
    optimizer._on_after_step()
    return loss


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
