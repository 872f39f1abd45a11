"""Lightning against native at the same host moment: blocks of each, interleaved in one process.

At 32 images per GPU both scripts are bound by the host launching kernels, and the host's pace drifts between runs,
so separate runs of the two scripts cannot tell a few per cent apart. This runs the real Lightning twin (its main(),
Trainer, strategy, LightningModule and hooks) and, from inside its on_train_batch_end hook, native's real training
step (ddp_resnet50.build_step) in native's timed loop (the harness's before_step and after_step), in blocks:

    N0  L1  N1  L2  N2 ... Ln  Nn      (N: native block, L: Lightning block, each --block-steps steps)

Every block is timed by the host clock between device synchronizations, and each Lightning block is compared with
the mean of the two native blocks around it, which cancels a drift that is linear over the three blocks. Both kinds
pay the same drain of the GPU queue at each block boundary. The twin's own result file (whose step times include
the native blocks) is written to a temporary folder and discarded; this writes its own JSON.

    python experiments/lightning-interleaved/interleave.py --batch-size-per-device 32 --warmup-steps 20 \\
        --block-steps 20 --blocks 40 --output-json out.json
    python experiments/lightning-interleaved/interleave.py --devices 2 ... --output-json out-2gpu.json

Every other option is the scripts' own (given to both; the twin's --devices, --num-nodes and --lightning-matched
to the twin only). --cuda-graphs is refused: the uncaptured loop is the question.
"""
import datetime
import importlib.util
import os
import pathlib
import platform
import socket
import statistics
import sys
import tempfile
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import probe_common as common  # noqa: E402

ROOT = HERE.parents[1]
TWIN_ONLY = {"--devices": 1, "--num-nodes": 1, "--lightning-matched": 0}  # option: values it takes


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def native_arguments(rest):
    """The scripts' options without the twin's own."""
    kept, skip = [], 0
    for arg in rest:
        if skip:
            skip -= 1
        elif arg.split("=")[0] in TWIN_ONLY:
            skip = TWIN_ONLY[arg.split("=")[0]] if "=" not in arg else 0
        else:
            kept.append(arg)
    return kept


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_module_class(native_argv, block_steps, blocks):
    class InterleavedBenchmark(twin.ResNet50Benchmark):
        """The twin's LightningModule; after its warm-up, native blocks run from on_train_batch_end."""

        instance = None

        def __init__(self, run, refusal):
            super().__init__(run, refusal)
            type(self).instance = self
            self.blocks, self.native, self.native_step, self.native_index, self.block_start = [], None, None, 0, None

        def on_train_start(self):
            super().on_train_start()
            run = self.run
            args = native.parse_arguments(native_argv)
            cuda = args.device == "cuda"
            config = native.resolve_harness_config(args, run.launch, native.SCRIPT, native.STRATEGY, cuda,
                                                   torch.cuda.device_count() if cuda else 0,
                                                   cuda and torch.cuda.is_bf16_supported())
            config.update(model="resnet50", optimizer="sgd",
                          optimizer_impl=native.sgd_implementation(cuda, config["grad_scaler"]),
                          steps=block_steps * (blocks + 1))
            # native's Run without its constructor (the twin's Run owns the process groups)
            self.native = native.Run.__new__(native.Run)
            self.native.__dict__.update(
                config=config, launch=run.launch, rank=run.rank, world_size=run.world_size, device=self.device,
                monitor=run.monitor, started=None, losses=[], marks=[],
                record={"rank": run.rank}, events=[torch.cuda.Event(enable_timing=True) for _ in range(
                    config["steps"] + 1)] if self.device.type == "cuda" else [])
            self.native_step, _ = native.build_step(self.native)
            self.gpu_name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None

        def run_native(self, steps, record):
            """Native's step in native's timed loop (measure(): before_step, the step, after_step with its loss
            kept, CUDA-event mark and progress line)."""
            synchronize(self.device)
            started = time.perf_counter()
            for _ in range(steps):
                self.native.before_step(self.native_index)
                self.native.after_step(self.native_index, self.native_step())
                self.native_index += 1
            synchronize(self.device)
            if record:
                self.blocks.append({"kind": "native", "steps": steps, "seconds": time.perf_counter() - started})

        def on_train_batch_end(self, outputs, batch, batch_idx):
            super().on_train_batch_end(outputs, batch, batch_idx)
            warmup, done = self.config["warmup_steps"], batch_idx + 1
            if self.trainer.should_stop or done < warmup or (done - warmup) % block_steps:
                return
            if done == warmup:  # native's own warm-up, then N0
                self.run_native(warmup, record=False)
            else:
                synchronize(self.device)
                self.blocks.append({"kind": "lightning", "steps": block_steps,
                                    "seconds": time.perf_counter() - self.block_start})
            self.run_native(block_steps, record=True)
            self.block_start = time.perf_counter()

    return InterleavedBenchmark


def summarize_blocks(blocks, images_per_step):
    for block in blocks:
        block["images_per_second"] = images_per_step * block["steps"] / block["seconds"]
    native_rates = [b["images_per_second"] for b in blocks if b["kind"] == "native"]
    lightning_rates = [b["images_per_second"] for b in blocks if b["kind"] == "lightning"]
    # Lightning block i ran between native blocks i and i + 1
    ratios = [rate / ((native_rates[i] + native_rates[i + 1]) / 2) for i, rate in enumerate(lightning_rates)]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    low, high = pool.bootstrap_median_interval([[ratio] for ratio in ratios])  # the blocks resampled
    seconds = {kind: sum(b["seconds"] for b in blocks if b["kind"] == kind) for kind in ("native", "lightning")}
    steps = {kind: sum(b["steps"] for b in blocks if b["kind"] == kind) for kind in ("native", "lightning")}
    return {"median_ratio": statistics.median(ratios), "ratio_quartiles": [quartiles[0], quartiles[2]],
            "median_ratio_95pct_interval": [low, high], "ratios": ratios,
            "native_median_images_per_second": statistics.median(native_rates),
            "lightning_median_images_per_second": statistics.median(lightning_rates),
            "total_ratio": steps["lightning"] / seconds["lightning"] / (steps["native"] / seconds["native"])}


def main(argv=None):
    parser = common.OneLineArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--block-steps", type=common.positive_int, default=20)
    parser.add_argument("--blocks", type=common.positive_int, default=30,
                        help="Lightning blocks (one more native block runs)")
    parser.add_argument("--output-json", required=True)
    options, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if "--cuda-graphs" in rest:
        raise common.UsageError("--cuda-graphs is not interleaved: the uncaptured loop is the question")
    common.check_json_path(options.output_json, "--output-json")
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix="interleave-") as scratch:
        native_argv = native_arguments(rest) + ["--output", os.path.join(scratch, "native.json"), "--overwrite"]
        module_class = make_module_class(native_argv, options.block_steps, options.blocks)
        twin.ResNet50Benchmark = module_class  # the real twin main() builds this subclass
        try:
            code = twin.main(rest + ["--steps", str(options.block_steps * options.blocks),
                                     "--output", os.path.join(scratch, "twin.json"), "--overwrite"])
        except twin.UsageError as error:  # the twin's (and native's) bad input: one line
            raise common.UsageError(str(error)) from None
    module = module_class.instance
    if code != 0 or module is None or module.run.rank != 0:
        return code
    config = module.config
    summary = summarize_blocks(module.blocks, config["global_batch_size"])
    common.write_json(options.output_json, {
        "diagnostic": "lightning-interleaved", "started_at": started_at, "argv": rest,
        "block_steps": options.block_steps, "blocks": options.blocks,
        "native_block": "native's timed loop: its step and measure()'s per-step harness work",
        "world_size": module.run.world_size, "timed_by": "rank 0's host clock",
        "batch_size_per_device": config["batch_size_per_device"],
        "native_batch_size_per_device": module.native.config["batch_size_per_device"],
        "precision": config["precision"], "device": config["device"], "hostname": socket.gethostname(),
        "python": platform.python_version(), "torch": torch.__version__,
        "lightning": module.run.result["software"].get("lightning"), "gpu": module.gpu_name,
        "git": module.run.result["git"], "summary": summary, "block_times": module.blocks})
    print(f"Lightning/native, {len(summary['ratios'])} Lightning blocks of {options.block_steps} steps, each "
          f"against the native blocks around it: median {summary['median_ratio']:.3f} (quartiles "
          f"{summary['ratio_quartiles'][0]:.3f}-{summary['ratio_quartiles'][1]:.3f}, 95 % interval of the median "
          f"{summary['median_ratio_95pct_interval'][0]:.3f}-{summary['median_ratio_95pct_interval'][1]:.3f}); "
          f"all blocks {summary['total_ratio']:.3f}; native {summary['native_median_images_per_second']:,.0f}, "
          f"Lightning {summary['lightning_median_images_per_second']:,.0f} img/s (block medians)")
    return 0


twin = load(ROOT / "lightning" / "ddp_resnet50.py", "lightning_twin")
native = common.bench  # ddp_resnet50.py
pool = load(HERE / "pool.py", "interleave_pool")

if __name__ == "__main__":
    common.run_guarded(main)
