"""Where a 2-GPU DDP step loses time against a 1-GPU step: the native script's own step, profiled per kernel.

The probe takes ddp_resnet50.py's options and builds exactly what the script builds (its config, model, DDP
wrapper, optimizer, batch and train_step), runs warm-up steps, then profiles a few steps with torch.profiler
(CUDA activity) and summarises each rank's GPU timeline: the compute stream's busy time and idle gaps, NCCL's
kernels and how much of them no computation hides, and the kernels by name, per step. `--compare` prints what
the 2-GPU summary has that the 1-GPU one has not.

    torchrun --nproc-per-node 1 docs/diagnostics/ddp-scaling/probe.py --out DIR --name 1gpu [script options]
    torchrun --nproc-per-node 2 docs/diagnostics/ddp-scaling/probe.py --out DIR --name 2gpu [script options]
    python docs/diagnostics/ddp-scaling/probe.py --compare DIR/1gpu-rank0.json DIR/2gpu-rank0.json
    python docs/diagnostics/ddp-scaling/probe.py --from-trace DIR/2gpu-rank0.trace.json.gz DIR/2gpu-rank0.json
"""
import gzip
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

import ddp_resnet50 as bench  # noqa: E402

WARMUP, ACTIVE = 15, 5


def union(intervals):
    """Sorted, merged (start, end) intervals."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def length(intervals):
    return sum(end - start for start, end in intervals)


def intersection(a, b):
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append([start, end])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def summarise(trace_events, steps, step_ms):
    """Per-step figures (ms) of one rank's GPU timeline from a chrome trace's events. The first profiled step
    is left out (the profiler's start slows it): the steps are told apart by the compute stream's kernel count,
    the same in every step of this workload."""
    kernels = [e for e in trace_events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not kernels:
        return {"steps": steps, "step_ms_events": step_ms, "kernels": 0}
    streams = {}
    for e in kernels:
        streams[e["args"].get("stream")] = streams.get(e["args"].get("stream"), 0) + e["dur"]
    busiest = sorted((e for e in kernels if e["args"].get("stream") == max(streams, key=streams.get)),
                     key=lambda e: e["ts"])
    if steps > 1 and len(busiest) % steps == 0:
        boundary = busiest[len(busiest) // steps]["ts"]
        kernels = [e for e in kernels if e["ts"] >= boundary]
        steps, step_ms = steps - 1, step_ms[1:]
    per_stream = {}
    for e in kernels:
        per_stream.setdefault(e["args"].get("stream"), []).append(e)
    busy = {s: union([(e["ts"], e["ts"] + e["dur"]) for e in es]) for s, es in per_stream.items()}
    compute = max(busy, key=lambda s: length(busy[s]))
    window = (min(e["ts"] for e in kernels), max(e["ts"] + e["dur"] for e in kernels))
    nccl = [e for e in kernels if "nccl" in e["name"].lower()]
    nccl_busy = union([(e["ts"], e["ts"] + e["dur"]) for e in nccl])
    hidden = intersection(nccl_busy, busy[compute])
    gaps, previous = [], None
    for e in sorted(per_stream[compute], key=lambda e: e["ts"]):
        if previous is not None:
            gap = e["ts"] - (previous["ts"] + previous["dur"])
            if gap > 20:
                gaps.append((gap, previous["name"][:90], e["name"][:90]))
        if previous is None or e["ts"] + e["dur"] > previous["ts"] + previous["dur"]:
            previous = e
    families = {}
    for e in per_stream[compute]:
        row = families.setdefault(e["name"][:120], [0, 0.0])
        row[0] += 1
        row[1] += e["dur"]
    per_step = 1.0 / steps
    return {
        "steps": steps,
        "step_ms_events": step_ms,
        "window_ms_per_step": (window[1] - window[0]) / 1e3 * per_step,
        "compute_stream": compute,
        "streams": {str(s): {"kernels_per_step": len(per_stream[s]) * per_step,
                             "busy_ms_per_step": length(busy[s]) / 1e3 * per_step} for s in per_stream},
        "compute_idle_ms_per_step": ((window[1] - window[0]) - length(busy[compute])) / 1e3 * per_step,
        "compute_gaps_over_20us_ms_per_step": sum(g[0] for g in gaps) / 1e3 * per_step,
        "largest_compute_gaps": [{"us": round(g[0], 1), "after": g[1], "before": g[2]}
                                 for g in sorted(gaps, reverse=True)[:12]],
        "nccl_kernels_per_step": len(nccl) * per_step,
        "nccl_busy_ms_per_step": length(nccl_busy) / 1e3 * per_step,
        "nccl_hidden_by_compute_ms_per_step": length(hidden) / 1e3 * per_step,
        "nccl_exposed_ms_per_step": (length(nccl_busy) - length(hidden)) / 1e3 * per_step,
        "compute_kernels_by_name": {name: {"count_per_step": n * per_step, "ms_per_step": us / 1e3 * per_step}
                                    for name, (n, us) in sorted(families.items(), key=lambda kv: -kv[1][1])},
    }


def profile_run(argv, out, name):
    args = bench.parse_arguments([*argv, "--output", str(out / f"{name}-unused.json"), "--overwrite"])
    launch = bench.detect_launch(os.environ)
    cuda = args.device == "cuda" and torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    config = bench.resolve_harness_config(args, launch, bench.STRATEGY, cuda, count,
                                          cuda and torch.cuda.is_bf16_supported())
    bench.resolve_ddp_options(args, config, launch["world_size"])
    config.update(model="resnet50", optimizer="sgd", optimizer_impl=bench.sgd_implementation(config))
    rank, world_size = launch["rank"], launch["world_size"]
    out.mkdir(parents=True, exist_ok=True)
    device = bench.setup_device(config, launch, count)
    bench.init_distributed(config, launch, device)
    torch.manual_seed(config["seed"])
    model = bench.build_model().to(device)
    if config["memory_format"] == "channels_last":
        model = model.to(memory_format=torch.channels_last)
    if world_size > 1:
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                        bucket_cap_mb=config["bucket_cap_mb"], static_graph=config["static_graph"],
                                        **bench.ddp_buffer_option(config),
                                        gradient_as_bucket_view=config["gradient_as_bucket_view"])
    optimizer = bench.make_optimizer(model.parameters(), config)
    scaler = torch.amp.GradScaler(device.type) if config["grad_scaler"] else None
    images, labels = bench.make_synthetic_batch(config, rank, device)
    for _ in range(WARMUP):
        bench.train_step(model, optimizer, scaler, images, labels, config)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    if world_size > 1:
        dist.barrier()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(ACTIVE + 1)] if device.type == "cuda" else []
    with torch.profiler.profile(activities=activities) as prof:
        for index in range(ACTIVE):
            if events:
                events[index].record()
            bench.train_step(model, optimizer, scaler, images, labels, config)
        if events:
            events[-1].record()
            torch.cuda.synchronize(device)
    step_ms = [a.elapsed_time(b) for a, b in zip(events, events[1:])]
    trace = out / f"{name}-rank{rank}.trace.json"
    prof.export_chrome_trace(str(trace))
    summary = summarise(json.loads(trace.read_text())["traceEvents"], ACTIVE, step_ms)
    summary.update(name=name, rank=rank, world_size=world_size, argv=argv, torch=torch.__version__,
                   environment={k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_NCCL_"))})
    (out / f"{name}-rank{rank}.json").write_text(json.dumps(summary, indent=1))
    if rank != 0:
        trace.unlink()
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    print(f"[rank {rank}] {name}: step {sorted(step_ms)[len(step_ms) // 2] if step_ms else 0:.2f} ms, compute idle "
          f"{summary.get('compute_idle_ms_per_step', 0):.2f} ms, NCCL exposed "
          f"{summary.get('nccl_exposed_ms_per_step', 0):.2f} ms a step", flush=True)


def compare(base_path, other_path):
    base, other = (json.loads(pathlib.Path(p).read_text()) for p in (base_path, other_path))
    for key in ("window_ms_per_step", "compute_idle_ms_per_step", "compute_gaps_over_20us_ms_per_step",
                "nccl_busy_ms_per_step", "nccl_hidden_by_compute_ms_per_step", "nccl_exposed_ms_per_step"):
        print(f"{key:40s} {base.get(key, 0):9.3f} {other.get(key, 0):9.3f} {other.get(key, 0) - base.get(key, 0):+9.3f}")
    a, b = base["compute_kernels_by_name"], other["compute_kernels_by_name"]
    rows = []
    for name in set(a) | set(b):
        ka, kb = a.get(name, {"count_per_step": 0, "ms_per_step": 0}), b.get(name, {"count_per_step": 0, "ms_per_step": 0})
        rows.append((kb["ms_per_step"] - ka["ms_per_step"], kb["count_per_step"] - ka["count_per_step"], name))
    total = sum(r[0] for r in rows)
    print(f"compute-stream kernel time, 2nd minus 1st: {total:+.3f} ms a step; largest changes:")
    for delta, count, name in sorted(rows, key=lambda r: -abs(r[0]))[:25]:
        print(f"  {delta:+8.3f} ms {count:+7.1f} kernels  {name}")


def from_trace(trace_path, steps, summary_path):
    """Summarise a kept trace again (the device run gzips rank 0's)."""
    opener = gzip.open if trace_path.endswith(".gz") else open
    with opener(trace_path, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    summary = json.loads(pathlib.Path(summary_path).read_text())
    summary.update(summarise(events, steps, summary["step_ms_events"][-steps:]))
    pathlib.Path(summary_path).write_text(json.dumps(summary, indent=1))


def main():
    if sys.argv[1:2] == ["--compare"]:
        return compare(sys.argv[2], sys.argv[3])
    if sys.argv[1:2] == ["--from-trace"]:  # --from-trace TRACE SUMMARY: redo SUMMARY's figures from TRACE
        return from_trace(sys.argv[2], ACTIVE, sys.argv[3])
    argv, probe = sys.argv[1:], {}
    for flag in ("--out", "--name"):
        index = argv.index(flag)
        probe[flag] = argv[index + 1]
        del argv[index:index + 2]
    profile_run(argv, pathlib.Path(probe["--out"]), probe["--name"])


if __name__ == "__main__":
    main()
