"""What the benchmark's timed loop costs: the same training step, in the same process, timed in interleaved blocks
run bare (a plain loop between two CUDA events) and through the harness (ddp_resnet50.py's per-step work: the loss
kept, a CUDA event and the host clock after each step, the progress line, the stop agreement).

    python tools/harness_cost.py --blocks 20 --block-steps 25 --output cost.json [ddp_resnet50.py options]
    python tools/harness_cost.py --device cpu --image-size 32 --batch-size-per-device 4 --blocks 2 --block-steps 2

One process (the agreement across ranks is a background all-reduce whose cost shows in multi-GPU runs of the
benchmark itself). Warm-up: the script's --warmup-steps, then the blocks alternate, bare first, then harness first
in every other pair. The figure is the harness's throughput over the bare loop's, per pair and pooled over all
blocks: 1.0 means the harness costs nothing measurable; below 1 is what its per-step work costs.
"""
import contextlib
import importlib.util
import json
import math
import os
import pathlib
import statistics
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent


def load_native():
    spec = importlib.util.spec_from_file_location("ddp_resnet50", ROOT / "ddp_resnet50.py")
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    return native


def parse_arguments(native, argv, scratch):
    """The tool's own options, then the script's (its --output pointed into scratch: the tool writes no result)."""
    tool = native.OneLineArgumentParser("harness_cost.py", __doc__.split("\n")[0], add_help=False)
    tool.add_argument("--blocks", type=int, default=20, help="blocks of each kind, interleaved")
    tool.add_argument("--block-steps", type=int, default=25, help="training steps per block")
    tool.add_argument("--output", help="write the blocks' times and the ratios to this JSON file")
    own, rest = tool.parse_known_args(argv)
    if own.blocks < 1 or own.block_steps < 2:
        raise native.UsageError("--blocks must be at least 1 and --block-steps at least 2")
    if own.output is not None:  # the script's own rules for a result path, proved before any work
        overwrite = ["--overwrite"] if "--overwrite" in rest else []
        config = native.resolve_harness_config(native.parse_arguments(["--device", "cpu", "--output", own.output,
                                                                        *overwrite]), native.detect_launch({}),
                                               "harness_cost.py", "ddp", False, 0, False)
        refusal = native.output_refusal(config)
        if refusal:
            raise native.UsageError(refusal)
    if {"-h", "--help"} & set(rest):
        tool.print_help()
    return own, native.parse_arguments([*rest, "--output", os.path.join(scratch, "unused.json")])


def timed_block(run, step, steps, through_harness):
    """GPU milliseconds from the block's first step to its last, the device idle before it (host clock on the CPU)."""
    cuda = run.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(run.device)
    if through_harness:  # the benchmark's own loop over a fresh timed window of `steps` steps
        run.config.update(warmup_steps=0, steps=steps)
        run.losses, run.marks, run.record = [], [], {"rank": 0}
        run.events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)] if cuda else []
        for index in range(steps):
            run.before_step(index)
            run.after_step(index, step())
        if cuda:
            torch.cuda.synchronize(run.device)
            return run.events[0].elapsed_time(run.events[steps])
        return (run.marks[-1] - run.marks[0]) * 1e3
    start, end = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else (None, None)
    began = time.perf_counter()
    if cuda:
        start.record()
    for _ in range(steps):
        step()
    if cuda:
        end.record()
        torch.cuda.synchronize(run.device)
        return start.elapsed_time(end)
    return (time.perf_counter() - began) * 1e3


def host_cost_us(run, iterations=2000, repeats=5):
    """The harness's own host time per step: its loop around a step that does nothing, less a bare loop's (the
    fastest of a few interleaved repeats of each, so that a garbage collection in one does not decide)."""
    loss = torch.zeros((), device=run.device)
    nothing = lambda: loss  # noqa: E731 - the same step for both loops

    def bare():
        for _ in range(iterations):
            nothing()

    def harness():
        timed_block(run, nothing, iterations, through_harness=True)

    best = {bare: math.inf, harness: math.inf}
    for _ in range(repeats):
        for loop in best:
            began = time.perf_counter()
            loop()
            best[loop] = min(best[loop], time.perf_counter() - began)
    return (best[harness] - best[bare]) / iterations * 1e6


def main(argv=None):
    native = load_native()
    try:
        with tempfile.TemporaryDirectory(prefix="harness-cost-") as scratch:
            return measure(native, *parse_arguments(native, sys.argv[1:] if argv is None else argv, scratch))
    except native.UsageError as error:
        print(f"harness_cost.py: error: {error}", file=sys.stderr)
        return 2


def measure(native, own, args):
    cuda = args.device == "cuda" and torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    launch = native.detect_launch({})
    config = native.resolve_harness_config(args, launch, native.SCRIPT, native.STRATEGY, cuda, count,
                                           cuda and torch.cuda.is_bf16_supported())
    config.update(model="resnet50", optimizer="sgd", optimizer_impl=native.sgd_implementation(cuda, config["grad_scaler"]))
    recorded, run = dict(config), native.Run(config, launch, count)
    run.join_ranks()
    step, _ = native.build_step(run)
    for _ in range(config["warmup_steps"]):  # the script's warm-up (a CUDA graph's capture is its last step)
        step()
    blocks = []
    for pair in range(own.blocks):
        order = (False, True) if pair % 2 == 0 else (True, False)
        times = {harness: timed_block(run, step, own.block_steps, harness) for harness in order}
        blocks.append({"bare_ms": times[False], "harness_ms": times[True], "harness_first": order[0]})
    ratios = [b["bare_ms"] / b["harness_ms"] for b in blocks]
    host_us = host_cost_us(run)
    summary = {"tool": "harness_cost", "config": recorded, "blocks": own.blocks, "block_steps": own.block_steps,
               "block_times": blocks, "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
               "ratio_max": max(ratios), "harness_host_us_per_step": host_us,
               "ratio_pooled": sum(b["bare_ms"] for b in blocks) / sum(b["harness_ms"] for b in blocks),
               "software": run.result["software"], "git": run.result["git"], "hardware": run.hardware}
    print(f"harness / bare throughput: pooled {summary['ratio_pooled']:.4f}, median {summary['ratio_median']:.4f} "
          f"(min {summary['ratio_min']:.4f}, max {summary['ratio_max']:.4f}) over {own.blocks} pairs of "
          f"{own.block_steps} steps; the harness's own host time {host_us:.1f} us a step", flush=True)
    if own.output:
        temporary = f"{own.output}.{os.getpid()}.tmp"
        try:
            with open(temporary, "w") as stream:
                json.dump(summary, stream, indent=1)
            os.replace(temporary, own.output)
        except OSError as error:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            print(f"harness_cost.py: error: --output {own.output}: {error.strerror}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
