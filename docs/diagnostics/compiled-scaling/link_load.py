"""A controlled test of the power share: NCCL traffic between the two GPUs without a second training rank.

The compiled one-GPU step runs at the H200's 700 W limit, and on two GPUs the same step ran at a 3 % lower SM
clock (README.md beside this file). If it is the communication's watts that cost the clock, the one-GPU runs
themselves must slow down when the same traffic flows between their GPUs. This probe makes that traffic from two
processes of its own, one per GPU, beside the two one-GPU benchmark runs:

    torchrun --nproc-per-node 2 docs/diagnostics/compiled-scaling/link_load.py --mode busy [--seconds 50]
        [--megabytes 97.5] [--period-ms 39] [--json FILE]

- `--mode busy`: an all-reduce of `--megabytes` (ResNet-50's fp32 gradients: 97.5 MiB) every `--period-ms` (a
  compiled 2-GPU step), as DDP's tail makes it; each all-reduce is timed with CUDA events, so its share of the
  GPU's time (the SMs it takes from the benchmark beside it) is known and can be told apart from a clock effect.
- `--mode idle`: the NCCL group is set up and does one all-reduce, then waits: the links are mapped and the
  second CUDA context exists, without traffic.

It writes (rank 0) the mode, the all-reduces made, their median time and their share of the wall time, and the
UTC window it ran, to line up with the GPU telemetry (tools/telemetry.py). `--device cpu` runs the same on gloo
(the CI test).
"""
import pathlib
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
import ddp_resnet50 as bench  # noqa: E402  (the harness's one-line errors, statistics and JSON writer)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import probe_checks  # noqa: E402


def main():
    parser = bench.OneLineArgumentParser(description=__doc__.splitlines()[0])  # bad input: one line, exit 2
    parser.add_argument("--mode", choices=["busy", "idle"], required=True)
    parser.add_argument("--seconds", type=bench.positive_float, default=50.0)
    parser.add_argument("--megabytes", type=bench.bucket_megabytes, default=97.5)
    parser.add_argument("--period-ms", type=bench.positive_float, default=39.0)
    probe_checks.add_distributed_arguments(parser)
    args = parser.parse_args()
    probe_checks.check_distributed_launch(args, "with 2 or more processes, the traffic is between ranks")

    rank, device = probe_checks.start_distributed(args.device)
    with probe_checks.fits_in_memory(f"--megabytes {args.megabytes:g}"):
        buffer = torch.ones(int(args.megabytes * 2**20) // 4, device=device)
    dist.all_reduce(buffer)  # the group and its links are set up before the window starts
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    started, begin = bench.utc_text(time.time()), time.perf_counter()
    times = []
    if args.mode == "idle":
        time.sleep(args.seconds)
    else:
        period = args.period_ms / 1000
        while time.perf_counter() - begin < args.seconds:
            tick = time.perf_counter()
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                dist.all_reduce(buffer)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                dist.all_reduce(buffer)
                times.append((time.perf_counter() - tick) * 1000)
            buffer.fill_(1.0)  # keep the values finite
            time.sleep(max(0.0, period - (time.perf_counter() - tick)))
    wall = time.perf_counter() - begin
    stopped = bench.utc_text(time.time())
    dist.barrier()
    stats = bench.summarize(times) if times else None
    result = {"mode": args.mode, "world_size": dist.get_world_size(), "megabytes": args.megabytes,
              "period_ms": args.period_ms if args.mode == "busy" else None, "all_reduces": len(times),
              "all_reduce_ms": stats, "busy_share": sum(times) / 1000 / wall if times else 0.0,
              "wall_s": wall, "window_utc": [started, stopped],
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__}
    if rank == 0:
        median = f", median {stats['median']:.3f} ms, {100 * result['busy_share']:.2f} % of the time" if stats else ""
        print(f"link load: {args.mode}, {result['all_reduces']} all-reduces of {args.megabytes:g} MB{median}, "
              f"{wall:.1f} s from {started}", flush=True)
        if args.json:
            bench.write_json_atomically(args.json, result)
    dist.destroy_process_group()


if __name__ == "__main__":
    bench.run_guarded(main)
