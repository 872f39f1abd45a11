"""Lightning against native at the same host moment: blocks of each, interleaved in one process.

At 32 images per GPU both scripts are bound by the host launching kernels, and the host's pace on the device
machines drifts by up to 30 % over tens of seconds, so separate runs of the two scripts cannot tell a few per
cent apart. This runs the real Lightning twin (its main(), Trainer, strategy, LightningModule and hooks) and,
from inside its on_train_batch_end hook, native's real training step (ddp_resnet50.build_step) in blocks:

    N0  L1  N1  L2  N2 ... Ln  Nn      (N: native block, L: Lightning block, each --block-steps steps)

A native block runs native's step with the per-step work of native's timed loop (measure(): fault hooks, the
loss kept, a CUDA-event mark, the progress check, the SIGTERM agreement round), which the twin's hooks do in
a Lightning block. Every block is timed by the host clock between device synchronizations, and each Lightning
block is compared with the mean of the two native blocks around it, which cancels a drift that is linear over
the three blocks.
Both kinds pay the same drain of the GPU queue at each block boundary. The twin's own result file (whose step
times include the native blocks) is written to a temporary directory and discarded; this writes its own JSON.

    python docs/diagnostics/lightning-interleaved/interleave.py --batch-size-per-device 32 --warmup-steps 20 \\
        --block-steps 20 --blocks 40 --output-json out.json
    torchrun --nproc-per-node 2 docs/diagnostics/lightning-interleaved/interleave.py --devices 2 ...

Every other option is the scripts' own (given to both; the twin's --devices, --num-nodes and --lightning-*
to the twin only). --cuda-graphs is refused: the uncaptured loop is the question.
"""
import datetime
import importlib.util
import os
import pathlib
import platform
import shutil
import socket
import statistics
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[3]
TWIN_ONLY_WITH_VALUE = ("--devices", "--num-nodes")


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def native_arguments(rest):
    """The scripts' options without the twin's own (--devices N, --num-nodes N, --lightning-*)."""
    kept, skip = [], False
    for arg in rest:
        if skip:
            skip = False
        elif arg in TWIN_ONLY_WITH_VALUE:
            skip = True
        elif not (arg.startswith("--lightning-") or arg.split("=")[0] in TWIN_ONLY_WITH_VALUE):
            kept.append(arg)
    return kept


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_module_class(native_argv, block_steps, blocks):
    class InterleavedBenchmark(twin.ResNet50Benchmark):
        """The twin's LightningModule; after its warm-up, native blocks run from on_train_batch_end."""

        instance = None

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            type(self).instance = self
            self.blocks, self.native_loop, self.block_start = [], None, None

        def on_train_start(self):
            super().on_train_start()
            self.gpu_name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None
            # native's options resolved for the twin's launch (plan_launch: detect_launch plus Lightning's own
            # launcher, whose workers detect_launch alone would take for single processes)
            try:
                config, _ = native.resolve_config(native.parse_arguments(native_argv),
                                                  twin.plan_launch(self.args, os.environ))
            except native.UsageError as error:  # reported by the twin's run_guarded, as its own bad input is
                raise twin.UsageError(str(error)) from None
            self.native_batch_size_per_device = config["batch_size_per_device"]
            native_step, _ = native.build_step(config, self.device, self.global_rank, self.trainer.world_size)
            # native's timed loop (measure()'s TimedLoop) with the twin's stop rounds; its progress lines count all
            # the native blocks' steps, N0 ... Nn
            total = block_steps * (blocks + 1)
            self.native_loop = native.TimedLoop(native_step, config, self.global_rank, self.trainer.world_size,
                                                self.monitor, self.stop, twin.StepTimer(self.device, total), total)

        def run_native(self, steps, record):
            """A native block: native's step with the per-step work of native's timed loop (fault hooks, the loss
            kept on the device, a CUDA-event mark, the progress check, the SIGTERM agreement round, which on
            several ranks is a gloo all-reduce), as the twin's hooks do in a Lightning block. Its warm-up
            (record False) runs as measure()'s warm-up does."""
            synchronize(self.device)
            first = self.native_loop.record["steps_run"]
            started = time.perf_counter()
            if not self.native_loop.run(steps, timed=record):
                self.trainer.should_stop = True
            synchronize(self.device)
            if record:  # the steps run: fewer when a stop request ended the block
                self.blocks.append({"kind": "native", "steps": self.native_loop.record["steps_run"] - first,
                                    "seconds": time.perf_counter() - started})

        def on_train_batch_end(self, outputs, batch, batch_idx):
            super().on_train_batch_end(outputs, batch, batch_idx)
            warmup, done = self.config["warmup_steps"], batch_idx + 1
            if done < warmup or (done - warmup) % block_steps:
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
    native = [b["images_per_second"] for b in blocks if b["kind"] == "native"]
    lightning = [b["images_per_second"] for b in blocks if b["kind"] == "lightning"]
    # Lightning block i ran between native blocks i and i + 1
    ratios = [rate / ((native[i] + native[i + 1]) / 2) for i, rate in enumerate(lightning)]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    low, high = pool.bootstrap_median_interval([[ratio] for ratio in ratios])  # the blocks resampled
    return {"median_ratio": statistics.median(ratios), "ratio_quartiles": [quartiles[0], quartiles[2]],
            "median_ratio_95pct_interval": [low, high], "ratios": ratios,
            "native_median_images_per_second": statistics.median(native),
            "lightning_median_images_per_second": statistics.median(lightning),
            "total_ratio": (sum(b["steps"] for b in blocks if b["kind"] == "lightning")
                            / sum(b["seconds"] for b in blocks if b["kind"] == "lightning"))
            / (sum(b["steps"] for b in blocks if b["kind"] == "native")
               / sum(b["seconds"] for b in blocks if b["kind"] == "native"))}


def main(argv=None):
    parser = twin.OneLineArgumentParser(description=__doc__.split("\n")[0])  # bad input: one line, exit 2
    parser.add_argument("--block-steps", type=twin.positive_int, default=20)
    parser.add_argument("--blocks", type=twin.positive_int, default=30,
                        help="Lightning blocks (one more native block runs)")
    parser.add_argument("--output-json", required=True)
    options, rest = parser.parse_known_args(argv)
    if "--cuda-graphs" in rest:
        raise twin.UsageError("--cuda-graphs is not interleaved: the uncaptured loop is the question")
    try:  # before the run, not after it
        twin.check_output_path(options.output_json, overwrite=True)
    except twin.UsageError as error:
        raise twin.UsageError(str(error).replace("--output", "--output-json", 1)) from None
    scratch = tempfile.mkdtemp(prefix="interleave-")
    native_argv = native_arguments(rest) + ["--output", os.path.join(scratch, "native.json")]
    module_class = make_module_class(native_argv, options.block_steps, options.blocks)
    twin.ResNet50Benchmark = module_class  # the real twin main() builds this subclass
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:
        code = twin.main(rest + ["--steps", str(options.block_steps * options.blocks),
                                 "--output", os.path.join(scratch, "twin.json"), "--overwrite"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    module = module_class.instance
    if code != 0 or module is None or module.global_rank != 0:
        return code
    config = module.config
    summary = summarize_blocks(module.blocks, config["global_batch_size"])
    result = {"diagnostic": "lightning-interleaved", "started_at": started_at, "argv": rest,
              "block_steps": options.block_steps, "blocks": options.blocks,
              "native_block": "native's timed loop: its step and measure()'s per-step harness work",
              "world_size": module.trainer.world_size, "timed_by": "rank 0's host clock",
              "batch_size_per_device": config["batch_size_per_device"],
              "native_batch_size_per_device": module.native_batch_size_per_device, "precision": config["precision"],
              "device": config["device"], "hostname": socket.gethostname(), "python": platform.python_version(),
              "torch": torch.__version__, "lightning": twin.package_version("lightning"),
              "gpu": module.gpu_name,
              "summary": summary, "block_times": module.blocks}
    twin.write_json_atomically(options.output_json, result)  # the harness's atomic write
    print(f"Lightning/native, {len(summary['ratios'])} Lightning blocks of {options.block_steps} steps, each "
          f"against the native blocks around it: median {summary['median_ratio']:.3f} (quartiles "
          f"{summary['ratio_quartiles'][0]:.3f}-{summary['ratio_quartiles'][1]:.3f}, 95 % interval of the median "
          f"{summary['median_ratio_95pct_interval'][0]:.3f}-{summary['median_ratio_95pct_interval'][1]:.3f}); "
          f"all blocks {summary['total_ratio']:.3f}; native {summary['native_median_images_per_second']:,.0f}, "
          f"Lightning {summary['lightning_median_images_per_second']:,.0f} img/s (block medians)")
    return 0


twin = load(ROOT / "lightning" / "ddp_resnet50.py", "lightning_twin")
native = load(ROOT / "ddp_resnet50.py", "native_ddp")
pool = load(pathlib.Path(__file__).with_name("pool.py"), "interleave_pool")

if __name__ == "__main__":
    twin.run_guarded(main)  # bad input: one line, exit 2
