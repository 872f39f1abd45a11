"""Where the native script's training step spends its GPU time: its own step, profiled per kernel.

The probe takes ddp_resnet50.py's options and builds exactly what the script builds (its configuration, `Run`
and `build_step`: model, DDP wrapper, optimizer, batch, compile and CUDA graph when asked), runs the script's
warm-up steps, then profiles 5 steps with torch.profiler (CUDA activity) and summarises each rank's GPU timeline:
the compute stream's busy time and idle gaps, NCCL's kernels and how much of them no computation hides, and the
kernels by name, per step. `--compare` prints what the second summary has that the first has not.

    torchrun --nproc-per-node 1 experiments/step-profile/probe.py --out DIR --name 1gpu [script options]
    torchrun --nproc-per-node 2 experiments/step-profile/probe.py --out DIR --name 2gpu [script options]
    python experiments/step-profile/probe.py --compare DIR/1gpu-rank0.json DIR/2gpu-rank0.json
    python experiments/step-profile/probe.py --from-trace DIR/2gpu-rank0.trace.json DIR/2gpu-rank0.json
"""
import gzip
import json
import os
import pathlib
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import probe_common as common  # noqa: E402

bench = common.bench

ACTIVE = 5  # profiled steps; the first is left out of the summary


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
    def by_stream(events):
        streams = {}
        for e in events:
            streams.setdefault(e["args"].get("stream"), []).append(e)
        return streams

    per_stream = by_stream(kernels)
    compute = max(per_stream, key=lambda s: length(union([(e["ts"], e["ts"] + e["dur"]) for e in per_stream[s]])))
    ordered = sorted(per_stream[compute], key=lambda e: e["ts"])
    if steps > 1 and len(ordered) % steps == 0:
        boundary = ordered[len(ordered) // steps]["ts"]
        kernels = [e for e in kernels if e["ts"] >= boundary]
        steps, step_ms = steps - 1, step_ms[1:]
        per_stream = by_stream(kernels)
    busy = {s: union([(e["ts"], e["ts"] + e["dur"]) for e in es]) for s, es in per_stream.items()}
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
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise common.UsageError(f"--out {out} cannot be made ({error.strerror})") from None
    args = bench.parse_arguments([*argv, "--output", str(out / f"{name}-unused.json"), "--overwrite"])
    launch = bench.detect_launch(os.environ)
    cuda = args.device == "cuda" and torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    config = bench.resolve_harness_config(args, launch, bench.SCRIPT, bench.STRATEGY, cuda, count,
                                          cuda and torch.cuda.is_bf16_supported())
    config.update(model="resnet50", optimizer="sgd",  # as the script's main() chooses them
                  optimizer_impl=bench.sgd_implementation(cuda, config["grad_scaler"]))
    rank, world_size = launch["rank"], launch["world_size"]
    run, step = bench.Run(config, launch, count), None
    try:
        run.join_ranks()
        step, _ = bench.build_step(run)
        for _ in range(config["warmup_steps"]):
            step()
        profile_steps(run.device, rank, world_size, step, argv, out, name)
    finally:
        bench.shut_down(step)


def profile_steps(device, rank, world_size, step, argv, out, name):
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
            step()
        if events:
            events[-1].record()
            torch.cuda.synchronize(device)
    step_ms = [a.elapsed_time(b) for a, b in zip(events, events[1:])]
    trace = out / f"{name}-rank{rank}.trace.json"
    prof.export_chrome_trace(str(trace))
    summary = summarise(json.loads(trace.read_text())["traceEvents"], ACTIVE, step_ms)
    summary.update(profiled_step_ms=step_ms, name=name, rank=rank, world_size=world_size, argv=argv,
                   torch=torch.__version__,
                   environment={k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_NCCL_"))})
    (out / f"{name}-rank{rank}.json").write_text(json.dumps(summary, indent=1))
    if rank != 0:
        trace.unlink()
    if world_size > 1:
        dist.barrier()
    print(f"[rank {rank}] {name}: step {sorted(step_ms)[len(step_ms) // 2] if step_ms else 0:.2f} ms, compute idle "
          f"{summary.get('compute_idle_ms_per_step', 0):.2f} ms, NCCL exposed "
          f"{summary.get('nccl_exposed_ms_per_step', 0):.2f} ms a step", flush=True)


def compare(base_path, other_path):
    base, other = (json.loads(pathlib.Path(p).read_text()) for p in (base_path, other_path))
    for key in ("window_ms_per_step", "compute_idle_ms_per_step", "compute_gaps_over_20us_ms_per_step",
                "nccl_busy_ms_per_step", "nccl_hidden_by_compute_ms_per_step", "nccl_exposed_ms_per_step"):
        first, second = base.get(key, 0), other.get(key, 0)
        print(f"{key:40s} {first:9.3f} {second:9.3f} {second - first:+9.3f}")
    a, b = base["compute_kernels_by_name"], other["compute_kernels_by_name"]
    rows = []
    for name in set(a) | set(b):
        none = {"count_per_step": 0, "ms_per_step": 0}
        ka, kb = a.get(name, none), b.get(name, none)
        rows.append((kb["ms_per_step"] - ka["ms_per_step"], kb["count_per_step"] - ka["count_per_step"], name))
    total = sum(r[0] for r in rows)
    print(f"compute-stream kernel time, 2nd minus 1st: {total:+.3f} ms a step; largest changes:")
    for delta, count, name in sorted(rows, key=lambda r: -abs(r[0]))[:25]:
        print(f"  {delta:+8.3f} ms {count:+7.1f} kernels  {name}")


def from_trace(trace_path, steps, summary_path):
    """Summarise a kept trace again (the device run gzips rank 0's)."""
    opener = gzip.open if str(trace_path).endswith(".gz") else open
    with opener(trace_path, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    summary = json.loads(pathlib.Path(summary_path).read_text())
    summary.update(summarise(events, steps, summary["profiled_step_ms"]))
    pathlib.Path(summary_path).write_text(json.dumps(summary, indent=1))


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    for mode, run in (("--compare", compare),
                      ("--from-trace", lambda trace, summary: from_trace(trace, ACTIVE, summary))):
        if argv[:1] == [mode]:
            if len(argv) != 3:
                raise common.UsageError(f"{mode} takes two files")
            return run(*argv[1:])
    probe = {}
    for flag in ("--out", "--name"):
        if flag not in argv or argv.index(flag) + 1 >= len(argv):
            raise common.UsageError(f"the probe needs {flag} (see the docstring)")
        index = argv.index(flag)
        probe[flag] = argv[index + 1]
        del argv[index:index + 2]
    profile_run(argv, pathlib.Path(probe["--out"]), probe["--name"])
    return 0


if __name__ == "__main__":
    common.run_guarded(main)
