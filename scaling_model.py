"""Predict a data-parallel strategy's step time at N GPUs from one-GPU runs and a measured or preset link, and check
the predictions against the committed multi-rank runs and against published measurements.

    python scaling_model.py RESULT.json [RESULT.json ...] --gpus 2,8,64,512 --link nvlink4
    python scaling_model.py RESULT.json --gpus 2 --probe probe.json      # the link collective_probe.py measured
    python scaling_model.py RESULT.json --gpus 2 --bandwidth 10 --latency 25
    python scaling_model.py --validate results/ --json validation.json --plot validation.png
    python scaling_model.py --check-doc docs/scaling.md    # exit 1 when a generated block is stale (--update-doc)

RESULT: one-GPU results of ddp_resnet50.py or its Lightning twin (one per GPU, e.g. a run on each GPU of a node),
for each strategy of the package's scaling.py (the model: the one-GPU step, the straggler, the exposed communication, the
kernels data parallelism adds, the optimizer's change). Links come from a collective probe or a preset (each with
its source); per-kernel costs from the probe's local copy or the committed one-GPU kernel profile; how far apart
GPUs run the step from the committed one-GPU runs of the workload. Multi-rank results are never fitted to:
--validate predicts each committed multi-rank run from its one-GPU counterpart, and each published measurement
(docs/published/) from its published one-GPU figure and link, and reports the error in percentage points of
efficiency (img/s over N times the one-GPU img/s) beside the error of a constant efficiency.
Exit codes: 0 ok (and --check-doc: the document is current), 1 a stale document, 2 bad input (one line).
"""

import argparse
import functools
import io
import math
import pathlib
import re
import statistics
import sys
import tempfile
from collections import Counter

from resnet50_ddp_benchmarks.analysis import (OneLineArgumentParser, UsageError, check_documents, document_problem,
    find_result_files, is_comparison, is_harness_cost, is_number, load_json, rank_devices, read_json, run_cli,
    update_documents, write_atomically, write_json_atomically)
from resnet50_ddp_benchmarks.scaling import (COMMUNICATION, GPUS, KERNEL_PROFILE, LINK_PRESETS, NCCL_CHANNELS, OVERHEAD,
    STRATEGIES, Baseline, LocalCosts, Topology, datasheet, ddp_buckets, facts_for, figure_baseline, given_link,
    kernel_profile_costs, make_link, predict, preset_link, probe_costs, probe_link, workload_of)

PROG = "scaling_model.py"
ROOT = pathlib.Path(__file__).resolve().parent
ONE_GPU_BENCHMARKS = ("ddp_resnet50.py", "lightning/ddp_resnet50.py")
BENCHMARKS = (*ONE_GPU_BENCHMARKS, "oss_benchmark.py")
PUBLISHED = ROOT / "docs" / "published" / "resnet50_multi_gpu.json"


# ------------------------------------------------------------------------------------------------- reading input

def one_gpu_result(path):
    """A one-GPU run that the model can start from, or one line saying why not."""
    result = load_json(path, "result")
    problem = document_problem(result)
    if problem:
        raise UsageError(f"{path}: {problem}")
    world = world_size(result)
    if world != 1:
        raise UsageError(f"{path}: a {world}-rank result; the model starts from one-GPU runs "
                         f"(multi-rank results are for --validate)")
    if result.get("benchmark") not in ONE_GPU_BENCHMARKS:
        raise UsageError(f"{path}: a one-rank {result.get('benchmark')} run wraps the model in its strategy; "
                         f"start from a ddp_resnet50.py one-GPU run of the same workload")
    if result.get("status") != "ok" or not result.get("step_times_ms_per_rank"):
        raise UsageError(f"{path}: status {result.get('status')!r}, no timed steps to start from")
    return result


def baseline_of(paths):
    results = [one_gpu_result(path) for path in paths]
    keys = {workload_key(r) for r in results}
    if len(keys) > 1:
        raise UsageError("the one-GPU results ran different workloads: give runs of one workload")
    return Baseline([str(p) for p in paths], results, "given", gpu_spread(results[0])[0])


WORKLOAD_DEFAULTS = {"model": "resnet50", "memory_format": "contiguous", "compile": False, "compile_mode": None,
                     "coordinate_descent_tuning": False, "cuda_graphs": False, "loss_scale": None,
                     "grad_scaler": False, "stem_conv": "torchvision", "max_pool_backward": "torchvision",
                     "batch_norm": "torchvision", "cudnn_benchmark": True, "tf32": True, "cudnn_deterministic": False,
                     "cpu_threads_per_rank": None}


# Environment variables that change what is computed (not where caches live)
COMPUTE_ENVIRONMENT = re.compile(r"TORCHINDUCTOR_(?!CACHE_DIR|FX_GRAPH_CACHE|AUTOGRAD_CACHE)|TORCH_CUDNN_")


def workload_key(result):
    """What one rank computes: the configuration and compute-changing environment a one-GPU counterpart must
    share with a multi-rank run (an unset option and its default are the same)."""
    config = result["config"]
    keys = ("device", "image_size", "batch_size_per_device", "precision", *WORKLOAD_DEFAULTS)
    values = tuple((key, config.get(key) if config.get(key) is not None else WORKLOAD_DEFAULTS.get(key))
                   for key in keys)
    environment = ((result.get("software") or {}).get("environment") or {}).items()
    return values + tuple(sorted((k, v) for k, v in environment if COMPUTE_ENVIRONMENT.match(k)))


def local_costs(baseline, probe, args):
    """Per-kernel and copy costs: the probe's local copy, else the kernel profile (GPU) with the HBM datasheet."""
    result = baseline.results[0]
    cuda = result["config"]["device"] == "cuda"
    sms = ((result.get("hardware") or {}).get("ranks") or [{}])[0].get("multiprocessors")
    # NCCL's channels hold SMs while they run; on the CPU the scripts give each rank cpu_count // ranks threads, so
    # every core computes and gloo's threads take their whole time from the computation.
    sm_share = (NCCL_CHANNELS / sms if sms else 0.0) if cuda else 1.0
    if isinstance(probe, dict) and isinstance(probe.get("collectives"), dict) and "local_copy" in probe["collectives"]:
        return probe_costs(probe, args.probe, sm_share)
    if not cuda:
        raise UsageError("a CPU run needs a probe (--probe, or its result's collective_probe): the per-copy cost "
                         "and copy bandwidth come from its local copy")
    name = ((result.get("hardware") or {}).get("ranks") or [{}])[0].get("gpu_name")
    memory = args.memory_bandwidth or (datasheet(name) or [None] * 2)[1]
    if memory is None:
        raise UsageError(f"no HBM bandwidth known for {name!r}: give --memory-bandwidth GB/s")
    return kernel_profile_costs(pathlib.Path(args.kernel_profile), memory, sm_share)


def topology_of(args, probe):
    if probe is not None:
        intra = probe_link(probe, args.probe)
    elif args.bandwidth is not None:
        intra = given_link(args.bandwidth, args.latency)
    else:
        intra = preset_link(args.link)
    return Topology(intra, preset_link(args.inter_node_link), args.gpus_per_node, args.nics_per_node or
                    args.gpus_per_node)


def read_probe(path):
    data = load_json(path, "probe")
    probe = data.get("collective_probe", data) if isinstance(data, dict) else None
    if not isinstance(probe, dict) or not str(probe.get("schema", "")).startswith("collective_probe/"):
        raise UsageError(f"{path}: no collective_probe.py output (nor a result holding one)")
    return probe


# ---------------------------------------------------------------------------------------------------- printing

def describe_terms(prediction, names):
    parts = [f"{name} {100 * prediction.terms[name] / prediction.step_ms:.2f}" for name in names
             if abs(prediction.terms.get(name, 0.0)) >= 5e-4]
    return ", ".join(parts) or "-"


def prediction_table(predictions, basis=None):
    """A Markdown table of the predictions; basis: a function of a prediction saying what it rests on (a column)."""
    lines = ["| strategy | GPUs | step ms | img/s | efficiency | compute % | per-step overhead % | straggler % | "
             "exposed communication % | added kernels and optimizer % |" + (" basis |" if basis else ""),
             "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if basis else "")]
    for p in predictions:
        share = {name: 100 * p.terms[name] / p.step_ms for name in ("compute", "per-step overhead", "straggler")}
        lines.append(f"| {p.strategy} | {p.n} | {p.step_ms:.2f} | {p.images_per_second:,.0f} | "
                     f"{100 * p.efficiency:.1f} % | {share['compute']:.1f} | {share['per-step overhead']:.2f} | "
                     f"{share['straggler']:.2f} | {describe_terms(p, COMMUNICATION)} | {describe_terms(p, OVERHEAD)} |"
                     + (f" {basis(p)} |" if basis else ""))
    return "\n".join(lines)


def workload_line(baseline):
    c = baseline.config
    mode = "compiled" if c.get("compile") else "eager"
    mode += ", captured" if c.get("cuda_graphs") else ""
    return (f"{c.get('model', 'resnet50')}, {c['image_size']} px, {c['batch_size_per_device']} images per GPU, "
            f"{c['precision']}, {mode}, {c.get('optimizer', 'sgd')}: one GPU {baseline.images_per_second:,.0f} "
            f"img/s, {baseline.step_ms:.2f} ms a step ({', '.join(baseline.paths)})")


# --------------------------------------------------------------------------------------------------- validation

def read_results(folders):
    """([(path, result)] of every valid result under the folders, [{path, reason}] of every other file), paths
    relative to the repository."""
    for folder in folders:
        if not pathlib.Path(folder).is_dir():
            raise UsageError(f"--validate {folder}: not a folder")
    loaded, skipped = [], []
    for path in find_result_files(folders):
        document, problem = read_result(str(pathlib.Path(path).resolve()))
        if problem:
            skipped.append({"path": relative(path), "reason": problem})
        else:
            loaded.append((relative(path), document))
    return loaded, skipped


@functools.lru_cache(maxsize=None)
def read_result(path):
    """(a valid result, None) or (None, why the file is none), read once."""
    document, problem = read_json(path)
    if problem is None:
        problem = ("a comparison (compare.py), not a result" if is_comparison(document) else
                   "a harness-cost measurement, not a result" if is_harness_cost(document) else
                   document_problem(document))
    return (None, problem) if problem else (document, None)


def relative(path):
    path = pathlib.Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def world_size(result):
    return (result.get("world") or {}).get("world_size", 1)


def machine_kind(path):
    """A campaign folder's machine kind: nvidia-h200-x2-2026-11-30b -> nvidia-h200-x2."""
    folder = pathlib.PurePath(path).parent.name
    return re.sub(r"-\d{4}-\d{2}-\d{2}[a-z]?$", "", folder)


def can_start_from(result):
    return (world_size(result) == 1 and result["benchmark"] in ONE_GPU_BENCHMARKS and result.get("status") == "ok"
            and bool(result.get("step_times_ms_per_rank")))


@functools.lru_cache(maxsize=1)
def committed_one_gpu_runs():
    """{(benchmark, workload_key): [(path, result)]} of every committed one-GPU run the model can start from."""
    runs = {}
    for path, result in read_results([ROOT / "results"])[0]:
        if can_start_from(result):
            runs.setdefault((result["benchmark"], workload_key(result)), []).append((path, result))
    return runs


def gpu_spread(result):
    """How far apart GPUs run a result's benchmark and workload: the relative standard deviation of each GPU's
    mean img/s over the committed one-GPU runs of them (0 where fewer than 3 GPUs ran it), the GPUs, the runs, and
    the fastest GPU's mean over the slowest's less 1."""
    per_gpu = {}
    for _, run in committed_one_gpu_runs().get((result["benchmark"], workload_key(result)), []):
        per_gpu.setdefault(rank_devices(run)[0], []).append(run["throughput"]["images_per_second"])
    means = [statistics.fmean(rates) for rates in per_gpu.values()]
    spread = statistics.stdev(means) / statistics.fmean(means) if len(means) >= 3 else 0.0
    return spread, len(means), sum(map(len, per_gpu.values())), max(means) / min(means) - 1 if means else 0.0


def find_counterpart(path, result, same):
    """The one-GPU runs of the same workload (`same`: all of them) a multi-rank run is measured against: on its own
    GPUs (same folder first), else in its folder, else on its machine kind. Lightning runs prefer Lightning's."""
    own = result["benchmark"] if result["benchmark"] in ONE_GPU_BENCHMARKS else "ddp_resnet50.py"
    folder, uuids = str(pathlib.PurePath(path).parent), set(rank_devices(result))
    levels = (("same GPUs, same folder", lambda p, r: rank_devices(r)[0] in uuids and str(pathlib.PurePath(p).parent)
               == folder), ("same GPUs, another folder", lambda p, r: rank_devices(r)[0] in uuids),
              ("other GPUs, same folder", lambda p, r: str(pathlib.PurePath(p).parent) == folder),
              ("other GPUs, same machine kind", lambda p, r: machine_kind(p) == machine_kind(path)))
    for match, accept in levels:
        for pool, note in (([(p, r) for p, r in same if r["benchmark"] == own], ""), (same, ", ddp_resnet50.py")):
            runs = [(p, r) for p, r in pool if accept(p, r)]
            if runs:
                covered = {rank_devices(r)[0] for _, r in runs} & uuids
                share = f" ({len(covered)} of {len(uuids)})" if match.startswith("same") and covered < uuids else ""
                note = note if own != "ddp_resnet50.py" else ""
                return Baseline([p for p, _ in runs], [r for _, r in runs], match + share + note,
                                gpu_spread(runs[0][1])[0])
    return None


POWER_CAP = ("the power cap: compiled one-GPU steps already run at the GPU's power limit, so the power NCCL and "
             "the links add costs clock (no one-GPU figure gives it)")
# The mechanisms a run can have that the model has no term for: a short name (the tables') and what it costs.
NOT_MODELLED = {
    "host-bound": "the one-GPU step is the host's pace, not the GPU's (its runs' median host lead under 1 ms)",
    "OSS's device sync": "fairscale OSS synchronises the device before its broadcasts: the host's run-ahead is lost",
    "ShardedDDP's host work": "ShardedDDP's blocking per-buffer broadcasts and Python gradient hooks cost host time",
    "FSDP2's host work": "FSDP2's per-parameter host work each step",
    "Lightning's side stream": "Lightning builds DDP on a side stream",
    "Lightning's SIGTERM check": "Lightning's per-step SIGTERM check synchronises the host",
    "a communication hook": "a DDP communication hook: the backward waits for each all-reduce's copy back",
    "the power cap": POWER_CAP,
    "a CUDA graph": "a kernel's cost inside a CUDA graph (the per-kernel cost comes from an uncaptured profile)",
    "the DDP optimizer": "the compiled graph split at each bucket (TorchDynamo's DDP optimizer): the breaks cost "
                         "host time and fusion",
    "the Python reducer": "compiled autograd's Python reducer"}


def host_leads(results):
    """Median host lead (ms) of each run that recorded it: how far the host ran ahead of the GPU."""
    return [statistics.median(lead) for r in results for lead in r.get("host_lead_ms_per_rank") or [] if lead]


def not_modelled(result, baseline, workload_leads=()):
    """The mechanisms (NOT_MODELLED's names) a run's configuration has and the model has no term for, decided from
    the configs and the one-GPU runs alone. workload_leads: host leads of every one-GPU run of the workload, for
    counterparts that predate the host lead's record."""
    config, strategy = result["config"], result.get("strategy")
    leads = host_leads(baseline.results) or list(workload_leads)
    found = {"host-bound": bool(leads) and statistics.median(leads) < 1.0,
             "OSS's device sync": strategy == "oss_ddp",
             "ShardedDDP's host work": strategy == "oss_sharded_ddp",
             "FSDP2's host work": strategy in ("fsdp_zero2", "fsdp_zero3"),
             "Lightning's side stream": result.get("benchmark") == "lightning/ddp_resnet50.py"
             and config.get("lightning_ddp_side_stream") is not False,
             "Lightning's SIGTERM check": bool(config.get("lightning_sigterm_sync")),
             "a communication hook": config.get("comm_hook") not in (None, "none"),
             "the power cap": bool(config.get("compile")),
             "a CUDA graph": bool(config.get("cuda_graphs")),
             "the DDP optimizer": bool(config.get("compile")) and config.get("compiled_ddp") in (None, "ddp_optimizer"),
             "the Python reducer": config.get("compiled_ddp") == "python_reducer"}
    return [name for name, present in found.items() if present]


def cannot_predict(path, result):
    if world_size(result) < 2:
        return None
    if result.get("status") != "ok" or not result.get("throughput", {}).get("images_per_second"):
        return f"status {result.get('status')!r}: no throughput"
    strategy = result.get("strategy")
    if result["benchmark"] not in BENCHMARKS or strategy not in (*STRATEGIES, "lightning_ddp"):
        return f"strategy {strategy!r} of {result['benchmark']} is not modelled"
    if strategy.startswith("fsdp") and result["config"].get("fsdp_units", "model") != "model":
        return f"FSDP2 in {result['config']['fsdp_units']} units: only one unit (the whole model) is modelled"
    return None


def validate_run(path, result, baseline, args, workload_leads):
    n = world_size(result)
    strategy = "ddp" if result["strategy"] == "lightning_ddp" else result["strategy"]
    probe = result.get("collective_probe")
    link = probe_link(probe, "the run's collective_probe") if probe else preset_link(args.link or "nvlink4")
    topology = Topology(link, preset_link(args.inter_node_link), args.gpus_per_node, args.nics_per_node or
                        args.gpus_per_node)
    local = local_costs(baseline, probe, argparse.Namespace(**{**vars(args), "probe": "the run's probe"}))
    prediction = predict(strategy, n, baseline, workload_of(result["config"], strategy), topology, local)
    measured = result["throughput"]["images_per_second"] / (n * baseline.images_per_second)
    missing = not_modelled(result, baseline, workload_leads)
    return {"path": path, "benchmark": result["benchmark"], "strategy": result["strategy"], "gpus": n,
            "nodes": len((result.get("hardware") or {}).get("hostnames") or []) or 1,
            "mode": run_mode(result["config"]), "measured": round(100 * measured, 3),
            "predicted": round(100 * prediction.efficiency, 3),
            "error": round(100 * (prediction.efficiency - measured), 3),
            "measured_images_per_second": round(result["throughput"]["images_per_second"], 1),
            "predicted_images_per_second": round(prediction.images_per_second, 1),
            "one_gpu_runs": baseline.paths, "one_gpu_match": baseline.match,
            "one_gpu_images_per_second": round(baseline.images_per_second, 1),
            "like_for_like": baseline.match.startswith("same GPUs"), "covered": not missing,
            "not_modelled": missing, "terms_ms": {k: round(v, 4) for k, v in prediction.terms.items()}}


def run_mode(config):
    mode = "compiled" if config.get("compile") else "eager"
    if config.get("compile"):
        mode += f" ({config.get('compiled_ddp') or 'ddp_optimizer'})"
    return mode + (", captured" if config.get("cuda_graphs") else "")


def validate(folders, args):
    """Every multi-rank result under the folders predicted from its one-GPU counterpart, and every row of the
    published table from its one-GPU figure and link; each beside a constant efficiency (summarise_validation)."""
    loaded, skipped = read_results(folders)
    workloads, runs = {}, []
    for path, result in loaded:
        if can_start_from(result):
            workloads.setdefault(workload_key(result), []).append((path, result))
    for path, result in loaded:
        if world_size(result) < 2:
            continue
        reason, same = cannot_predict(path, result), workloads.get(workload_key(result), [])
        baseline = None if reason else find_counterpart(path, result, same)
        if reason or baseline is None:
            skipped.append({"path": path, "reason": reason or "no one-GPU run of this workload"})
            continue
        try:
            runs.append(validate_run(path, result, baseline, args, host_leads(r for _, r in same)))
        except UsageError as error:  # e.g. a CPU run without a probe, a probe that cannot be used
            skipped.append({"path": path, "reason": str(error)})
    if not runs:
        multi = sum(world_size(r) > 1 for _, r in loaded)
        reasons = "; ".join(f"{count} x {reason}" for reason, count in
                            Counter(s["reason"] for s in skipped).most_common(3))
        raise UsageError(f"--validate {' '.join(map(str, folders))}: nothing validated: {len(loaded)} results "
                         f"({multi} multi-rank), {len(skipped)} file{'s' * (len(skipped) != 1)} skipped"
                         + (f" ({reasons})" if reasons else ""))
    published, published_skipped = validate_published(PUBLISHED)
    return summarise_validation(runs, skipped, published, published_skipped)


# Published precisions: (the model's precision, which datasheet peak: 0 16-bit, 1 32-bit). TF32: fp32 storage.
PRECISIONS = {"fp32": ("fp32", 1), "tf32": ("fp32", 1), "amp fp16": ("fp16", 0)}
DEFAULT_PAIR = ("results/nvidia-h200-x2-2026-11-30b/s4-native-1gpu-bf16-256-gpu0.json",
                "results/nvidia-h200-x2-2026-11-30b/s4-native-1gpu-bf16-256-gpu1.json")


def published_problem(row):
    """Why the model cannot predict a published row honestly, or None."""
    if "parameter_server" in row["implementation"] or "parameter server" in row["implementation"]:
        return "parameter servers, not an all-reduce: the model has no term for them"
    if row["batch_per_gpu"] is None:
        return "batch per GPU not known, so neither is the step the communication overlaps"
    if row["link_gbytes_per_second"] is None:
        return "the link is not stated"
    if datasheet(row["gpu"]) is None or row["precision"] not in PRECISIONS:
        return f"no datasheet figures for the {row['gpu']} in {row['precision']}"
    if not (all(isinstance(row[key], str) for key in ("source", "organisation", "link", "link_basis")) and all(
            is_number(row[key]) and row[key] > 0 for key in ("batch_per_gpu", "gpus", "nodes", "gpus_per_node",
            "link_gbytes_per_second", "one_gpu_images_per_second", "n_gpu_images_per_second")) and row["gpus"] >= 2):
        return "not a multi-GPU row with positive figures"
    return None


def predict_published(row, spread):
    """A published row predicted from its one-GPU figure and link, as PyTorch's DDP with its defaults would run it:
    the step is the one-GPU figure's (batch / img/s), the roofline and copies the GPU's datasheet's, the per-kernel
    cost the H200 profile's, the link's bus bandwidth its published line rate (one port per node between nodes)."""
    sms, memory, *peaks = datasheet(row["gpu"])
    precision, peak = PRECISIONS[row["precision"]]
    config = {"device": "cuda", "model": "resnet50", "image_size": 224, "batch_size_per_device": row["batch_per_gpu"],
              "precision": precision, "memory_format": "channels_last", "optimizer": "sgd", "optimizer_impl": "foreach",
              "bucket_cap_mb": 25.0, "first_bucket_mb": 1.0, "broadcast_buffers": True,
              "gradient_as_bucket_view": False}
    baseline = figure_baseline(row["source"], config, row["one_gpu_images_per_second"], peaks[peak], spread)
    bandwidth, hop = row["link_gbytes_per_second"], LINK_PRESETS["pcie4" if "PCIe" in row["link"] else "nvlink4"]
    intra = make_link(row["link"], row["link_basis"], bandwidth, hop.hop_us)
    network = make_link(row["link"], row["link_basis"], bandwidth, LINK_PRESETS["ib-ndr400"].hop_us)
    local = kernel_profile_costs(KERNEL_PROFILE, memory, NCCL_CHANNELS / sms)
    topology = Topology(intra, network, row["gpus_per_node"], 1)
    return predict("ddp", row["gpus"], baseline, workload_of(config), topology, local)


def validate_published(path):
    """([every predicted row of the published table], [{row, organisation, gpu, gpus, nodes, reason} of the
    others]); the straggler spread: the committed eager step's."""
    document = load_json(path, "table of published measurements")
    rows = document.get("rows") if isinstance(document, dict) else None
    if not isinstance(rows, list):
        raise UsageError(f"{path}: no rows of published measurements")
    spread = gpu_spread(one_gpu_result(ROOT / DEFAULT_PAIR[0]))[0]
    predicted, skipped = [], []
    for index, row in enumerate(rows, 1):
        try:
            problem = published_problem(row)
            described = {"row": index, "organisation": row["organisation"], "gpu": row["gpu"], "gpus": row["gpus"],
                         "nodes": row["nodes"]}
        except (KeyError, TypeError):
            skipped.append({"row": index, "reason": "a field is missing or malformed"})
            continue
        if problem:
            skipped.append({**described, "reason": problem})
            continue
        prediction = predict_published(row, spread)
        measured = row["n_gpu_images_per_second"] / (row["gpus"] * row["one_gpu_images_per_second"])
        predicted.append({**described, "source": row["source"], "precision": row["precision"],
                          "batch": row["batch_per_gpu"], "link_gbps": row["link_gbytes_per_second"],
                          "one_gpu_images_per_second": row["one_gpu_images_per_second"],
                          "measured": round(100 * measured, 3), "predicted": round(100 * prediction.efficiency, 3),
                          "error": round(100 * (prediction.efficiency - measured), 3),
                          "terms_ms": {k: round(v, 4) for k, v in prediction.terms.items()}})
    return predicted, skipped


def errors(rows, constant):
    """The model's and the constant's absolute errors over rows (points), and the GPU and node counts they span."""
    model, fixed = [abs(r["error"]) for r in rows], [abs(constant - r["measured"]) for r in rows]
    return {"runs": len(rows), "gpus": sorted({r["gpus"] for r in rows}), "nodes": sorted({r["nodes"] for r in rows}),
            "max_abs_error_pp": round(max(model), 3), "mean_abs_error_pp": round(statistics.fmean(model), 3),
            "baseline_max_abs_error_pp": round(max(fixed), 3),
            "baseline_mean_abs_error_pp": round(statistics.fmean(fixed), 3)}


def summarise_validation(runs, skipped, published, published_skipped):
    """The errors of the model and of a constant efficiency (the baseline: the mean measured efficiency of the
    in-sample runs in the model's scope, or of every predicted run where none is) over each set of runs, and per
    group of in-sample runs."""
    in_scope = [r for r in runs if r["covered"] and r["like_for_like"]]
    fitted, which = (in_scope, "in the model's scope") if in_scope else (runs, "every predicted run")
    constant = round(statistics.fmean(r["measured"] for r in fitted), 3)
    for row in (*runs, *published):
        row["baseline_error"] = round(constant - row["measured"], 3)
    sets = {"in sample, in the model's scope": in_scope,
            "in sample, outside it": [r for r in runs if not r["covered"] and r["like_for_like"]],
            "in sample, one-GPU runs on other GPUs": [r for r in runs if not r["like_for_like"]],
            "in sample, every predicted run": runs,
            "published, one node": [r for r in published if r["nodes"] == 1],
            "published, across nodes": [r for r in published if r["nodes"] > 1],
            "published, every predicted row": published}
    groups = {}
    for run in runs:
        name = ("" if run["covered"] else "outside the scope: ") + run_group(run) + (
            "" if run["like_for_like"] else " (one-GPU runs on other GPUs)")
        groups.setdefault(name, []).append(run)
    return {"model": PROG,
            "units": {"measured": "% efficiency: img/s over N x the one-GPU img/s (in sample: of the same GPUs)",
                      "predicted": "% efficiency", "error": "percentage points (predicted - measured)",
                      "baseline_error": "percentage points (the constant - measured)"},
            "not_modelled": NOT_MODELLED,
            "constant_efficiency": {"value": constant, "fitted_to": f"the mean measured efficiency of {len(fitted)} "
                                    f"in-sample runs ({which})"},
            "sets": {name: errors(rows, constant) for name, rows in sets.items() if rows},
            "groups": {name: errors(rows, constant) for name, rows in sorted(groups.items())},
            "max_abs_error_pp": round(max((abs(r["error"]) for r in in_scope), default=0.0), 3),
            "covered_runs": len(in_scope), "predicted_runs": len(runs), "runs": runs, "skipped": skipped,
            "published": {"table": relative(PUBLISHED), "rows": published, "skipped": published_skipped}}


def run_group(run):
    if run["benchmark"] == "oss_benchmark.py":
        return f"oss_benchmark.py {run['strategy']}"
    return f"{'Lightning' if run['benchmark'].startswith('lightning') else 'native'} DDP, {run['mode']}"


def span(values):
    return f"{values[0]}" if values[0] == values[-1] else f"{values[0]}-{values[-1]}"


def errors_table(v, sets):
    lines = [f"| runs | n | GPUs | nodes | model: max abs error, points | mean | constant "
             f"{v['constant_efficiency']['value']:.2f} %: max | mean |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {name} | {s['runs']} | {span(s['gpus'])} | {span(s['nodes'])} | {s['max_abs_error_pp']:.2f} | "
              f"{s['mean_abs_error_pp']:.2f} | {s['baseline_max_abs_error_pp']:.2f} | "
              f"{s['baseline_mean_abs_error_pp']:.2f} |" for name, s in sets.items()]
    return "\n".join(lines)


def skipped_line(v):
    counts = Counter(s["reason"] for s in v["skipped"])
    return (f"Skipped in sample: {len(v['skipped'])} files (" + "; ".join(
        f"{count} x {reason}" for reason, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) + "); "
        f"published: {len(v['published']['skipped'])} rows (" + "; ".join(
            f"rows {', '.join(str(s['row']) for s in v['published']['skipped'] if s['reason'] == reason)}: {reason}"
            for reason in dict.fromkeys(s["reason"] for s in v["published"]["skipped"])) + ").")


# ------------------------------------------------------------------------------------------------------ the plot

def plot_predicted_against_measured(validation, path):
    """Predicted against measured efficiency of each validated run and published row (a validation dict as
    --validate writes it), saved to path (PNG, SVG or PDF by its suffix), written atomically."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(6.4, 6.0))
    runs, rows = validation["runs"], (validation.get("published") or {}).get("rows") or []
    values = [r[key] for r in (*runs, *rows) for key in ("measured", "predicted")]
    low, high = (min(values) - 1, max(values) + 1) if values else (90, 101)
    axes.fill_between([low, high], [low - 1, high - 1], [low + 1, high + 1], color="0.9", label="within 1 point")
    axes.plot([low, high], [low, high], color="0.5", linewidth=0.8)
    for chosen, marker, label in (([r for r in runs if r["covered"]], "o", "in sample, in the model's scope"),
                                  ([r for r in runs if not r["covered"]], "x", "in sample, outside it"),
                                  (rows, "^", "published")):
        axes.scatter([r["measured"] for r in chosen], [r["predicted"] for r in chosen], marker=marker, s=18,
                     label=f"{label} ({len(chosen)})")
    axes.set(xlim=(low, high), ylim=(low, high), xlabel="measured efficiency (%)",
             ylabel="predicted efficiency (%)",
             title=f"{len(runs)} runs, {len(rows)} published rows; in scope: max |error| "
                   f"{validation['max_abs_error_pp']:.2f} points")
    axes.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    image = io.BytesIO()
    try:
        figure.savefig(image, format=pathlib.Path(path).suffix[1:].lower())
    finally:
        plt.close(figure)
    write_output(path, lambda: write_atomically(path, image.getvalue()))


# -------------------------------------------------------------------------------------------------- command line

def parse_arguments(argv):
    parser = OneLineArgumentParser(prog=PROG, description=__doc__.split("\n")[0], allow_abbrev=False,
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add("results", nargs="*", help="one-GPU result JSON files of one workload (one per GPU)")
    add("--gpus", default="2,8,64,512", help="the GPU counts to predict, comma-separated")
    add("--strategies", default=",".join(STRATEGIES), help="the strategies to predict, comma-separated")
    link = parser.add_mutually_exclusive_group()
    link.add_argument("--link", choices=sorted(LINK_PRESETS), help="the link between a node's GPUs, from a preset")
    link.add_argument("--bandwidth", type=float, help="the link's bus bandwidth, GB/s (with --latency)")
    link.add_argument("--probe", help="collective_probe.py's JSON (or a result holding one): the measured link")
    add("--latency", type=float, help="with --bandwidth: a 2-rank all-reduce's latency, us")
    add("--inter-node-link", choices=sorted(LINK_PRESETS), default="ib-ndr400", help="the link between nodes")
    add("--gpus-per-node", type=int, default=8, help="GPUs joined by --link in each node")
    add("--nics-per-node", type=int, help="inter-node NICs per node (default: one per GPU)")
    add("--memory-bandwidth", type=float, help="the GPU's HBM bandwidth, GB/s (default: its datasheet's)")
    add("--kernel-profile", default=str(KERNEL_PROFILE), help="one-GPU kernel profile giving a kernel's cost")
    add("--gpu-spread", type=float, help="how far apart GPUs run the step: the relative standard deviation of their "
                                         "img/s, %% (default: the committed one-GPU runs' of the workload)")
    add("--json", help="write the predictions (or the validation) to this JSON file")
    add("--validate", nargs="+", metavar="FOLDER", help="predict every multi-rank result under these folders, and "
                                                        "the published measurements in docs/published/")
    add("--plot", help="with --validate: plot predicted against measured to this image file")
    add("--check-doc", metavar="MARKDOWN", help="exit 1 if a generated block of this document is stale")
    add("--update-doc", metavar="MARKDOWN", help="regenerate the generated blocks of this document in place")
    return parser.parse_args(argv)


def check_arguments(args):
    """Every bad option refused in one line before any work, the outputs included: (GPU counts, strategies)."""
    modes = [bool(args.results), bool(args.validate), bool(args.check_doc), bool(args.update_doc)]
    if sum(modes) != 1:
        raise UsageError("give one-GPU RESULT files, or one of --validate, --check-doc, --update-doc")
    if (args.bandwidth is None) != (args.latency is None):
        raise UsageError("--bandwidth and --latency go together")
    if args.bandwidth is not None and not (0 < args.bandwidth < math.inf and 0 <= args.latency < math.inf):
        raise UsageError("--bandwidth must be positive and --latency not negative")
    if args.gpus_per_node < 1 or (args.nics_per_node is not None and args.nics_per_node < 1):
        raise UsageError("--gpus-per-node and --nics-per-node must be positive")
    if args.memory_bandwidth is not None and not 0 < args.memory_bandwidth < math.inf:
        raise UsageError("--memory-bandwidth must be positive")
    if args.gpu_spread is not None and not 0 <= args.gpu_spread < math.inf:
        raise UsageError("--gpu-spread must be 0 or more")
    if args.plot and not args.validate:
        raise UsageError("--plot goes with --validate")
    if args.gpu_spread is not None and not args.results:
        raise UsageError("--gpu-spread goes with one-GPU RESULT files (--validate takes the committed runs' spread)")
    if args.results and args.link is None and args.bandwidth is None and args.probe is None:
        raise UsageError("give the link: --link PRESET, --bandwidth GB/s --latency us, or --probe FILE")
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path:
            check_output(option, path)
    return parse_counts(args.gpus), parse_strategies(args.strategies)


def check_output(option, path):
    """Refuse an output that cannot be written, before the work: a folder that is not there or takes no file, a
    plot format matplotlib does not write."""
    path = pathlib.Path(path)
    if path.is_dir() or not path.parent.is_dir():
        raise UsageError(f"{option} {path}: {'a folder' if path.is_dir() else 'its folder does not exist'}")
    try:
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as error:
        raise UsageError(f"{option} {path}: its folder takes no new file ({error.strerror or error})") from None
    if option == "--plot":
        try:
            from matplotlib.figure import Figure
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install -e '.[report]'") from None
        formats = Figure().canvas.get_supported_filetypes()
        if path.suffix[1:].lower() not in formats:
            raise UsageError(f"--plot {path}: give a file ending in .{', .'.join(sorted(formats))}")


def write_output(path, write):
    """Run write(), an output's atomic write; a failure (a full disk, a folder gone) in one line."""
    try:
        return write()
    except OSError as error:
        raise UsageError(f"{path}: not written ({error.strerror or error})") from None


def parse_counts(text):
    if not re.fullmatch(r"\s*\d{1,7}(\s*,\s*\d{1,7})*\s*", text or ""):
        raise UsageError(f"--gpus {text!r}: give GPU counts such as 2,8,64,512")
    counts = [int(part) for part in text.split(",")]
    if min(counts) < 1:
        raise UsageError("--gpus: every count must be at least 1")
    return counts


def parse_strategies(text):
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in chosen if name not in STRATEGIES]
    if unknown or not chosen:
        raise UsageError(f"--strategies: {', '.join(unknown) or 'none'} not among {', '.join(STRATEGIES)}")
    return chosen


def predictions_of(args, counts, strategies):
    probe = read_probe(args.probe) if args.probe else None
    baseline = baseline_of(args.results)
    topology, local = topology_of(args, probe), local_costs(baseline, probe, args)
    if args.gpu_spread is not None:
        baseline.gpu_spread = args.gpu_spread / 100
    predictions = [predict(strategy, n, baseline, workload_of(baseline.config, strategy), topology, local)
                   for strategy in strategies for n in counts]
    return baseline, topology, local, predictions


def main_predict(args, counts, strategies):
    baseline, topology, local, predictions = predictions_of(args, counts, strategies)
    print(workload_line(baseline))
    print(f"link: {topology.describe()}")
    print(f"per-kernel and copy costs: {local.source}; GPU-to-GPU spread {100 * baseline.gpu_spread:.2f} %")
    print(prediction_table(predictions))
    if args.json:
        write_output(args.json, lambda: write_json_atomically(args.json, {
            "model": PROG, "one_gpu_runs": baseline.paths, "link": topology.describe(), "local_costs": local.source,
            "gpu_spread": baseline.gpu_spread,
            "predictions": [{"strategy": p.strategy, "gpus": p.n, "step_ms": round(p.step_ms, 4),
                             "images_per_second": round(p.images_per_second, 1),
                             "efficiency": round(p.efficiency, 5),
                             "terms_ms": {k: round(v, 4) for k, v in p.terms.items()}} for p in predictions]}))
    return 0


def main_validate(args):
    validation = validate(args.validate, args)
    print(errors_table(validation, validation["sets"]))
    print(skipped_line(validation))
    if args.json:
        write_output(args.json, lambda: write_json_atomically(args.json, validation))
    if args.plot:
        plot_predicted_against_measured(validation, args.plot)
    return 0


# ------------------------------------------------------------------------------------ docs/scaling.md's tables

# A run of the fastest mode (the predictions start from the median run of its workload) and a compiled run.
FASTEST = "results/nvidia-h200-2026-12-01d/native-1gpu-fp16ls-256-best.json"
COMPILED = "results/nvidia-h200-x2-2026-11-30e/s10-native-1gpu-bf16-256-compile-gpu0.json"
DOC_COUNTS = "2,8,16,64,512"
# fairscale's benchmarks/oss.py on two consumer GPUs over PCIe with NCCL_P2P_DISABLE=1: each rank's img/s
SEED_RATES = {"ddp": 1795, "oss_ddp": 1645, "oss_sharded_ddp": 1468}
# fairscale's benchmark: ResNet-101 on 28 px MNIST, 256 images per rank, fp32, RMSprop (foreach, two state
# tensors), DistributedDataParallel with PyTorch's defaults (bucket_cap_mb left at its default, so DDP's first
# bucket is 1 MiB; no bucket views; buffers broadcast), ShardedDDP's default 2**23-element reduce buffer.
SEED_CONFIG = {"benchmark": "oss_benchmark.py", "strategy": "ddp", "device": "cuda", "model": "resnet101",
               "image_size": 28, "batch_size_per_device": 256, "precision": "fp32", "memory_format": "contiguous",
               "optimizer": "rmsprop", "optimizer_impl": "foreach", "bucket_cap_mb": 25.0, "first_bucket_mb": 1.0,
               "broadcast_buffers": True, "gradient_as_bucket_view": False, "sharded_reduce_buffer": 2 ** 23}
# The seed's GPUs are not named: the roofline and copies assume an RTX 3090's datasheet (35.6 TFLOP/s fp32,
# 936 GB/s, 82 SMs) and NCCL's two channels over shared memory; the kernel cost is the H200 profile's.
SEED_GPU = {"peak_tflops": 35.6, "memory_gbps": 936.0, "sms": 82, "channels": 2}
# PCIe without peer-to-peer: NCCL stages every transfer through host memory. PyTorch's comm_analysis.py profile
# for PCIe: about 10 GB/s effective bus bandwidth, 15 us base and 60 us per ring step (a 2-rank all-reduce: 135 us).
SEED_LINK = {"bandwidth": 10.0, "latency": 135.0}


def doc_arguments(**changes):
    """The command line's defaults, for the sections' fixed commands."""
    return argparse.Namespace(**{**vars(parse_arguments([])), **changes})


def section_predictions(paths, title):
    args = doc_arguments(results=list(paths), link="nvlink4", gpus=DOC_COUNTS)
    baseline, _, _, predictions = predictions_of(args, parse_counts(DOC_COUNTS), list(STRATEGIES))
    spread, gpus, runs, _ = gpu_spread(baseline.results[0])
    at_two = {p.strategy: p for p in predictions if p.n == 2}
    command = f"python scaling_model.py {' '.join(paths)} --gpus {DOC_COUNTS} --link nvlink4"
    return "\n".join([f"{title}: `{command}` (nodes of 8 GPUs on NVLink 4, joined by InfiniBand NDR 400, one NIC "
                      f"per GPU). {workload_line(baseline)}. GPU-to-GPU spread {100 * spread:.2f} % (the relative "
                      f"standard deviation of the mean img/s of {gpus} GPUs over {runs} committed one-GPU runs of "
                      f"this workload).", "",
                      prediction_table(predictions, lambda p: basis(p, baseline, at_two[p.strategy]))])


def basis(prediction, baseline, at_two):
    """What a prediction rests on: in-sample runs of its strategy, GPU count and mode in the model's scope, or an
    extrapolation: the mechanisms the model lacks for it, else the loss that grows most from its 2-GPU prediction
    (at_two) and the assumption that decides it."""
    mode = run_mode(baseline.config)
    checked = [r for r in committed_validation()["runs"] if r["covered"] and r["like_for_like"] and r["mode"] == mode
               and r["gpus"] == prediction.n and r["strategy"].replace("lightning_", "") == prediction.strategy]
    if checked:
        worst = max(abs(r["error"]) for r in checked)
        return f"validated: {len(checked)} run{'s' * (len(checked) > 1)} in sample, max abs error {worst:.2f} points"
    benchmark = baseline.results[0]["benchmark"] if prediction.strategy == "ddp" else "oss_benchmark.py"
    missing = not_modelled({"config": baseline.config, "strategy": prediction.strategy, "benchmark": benchmark},
                           baseline)
    if missing:
        return f"extrapolation, outside the model's scope: {', '.join(missing)}"
    if prediction.n == at_two.n:
        return "not checked: no in-sample run of this strategy in this mode"
    grown = {k: v - at_two.terms.get(k, 0.0) for k, v in prediction.terms.items() if k not in ("compute",
                                                                                               "per-step overhead")}
    largest = max(grown, key=grown.get)
    return f"extrapolation: {largest} grows most ({ASSUMPTIONS.get(largest, ASSUMPTIONS['link'])})"


# What decides a prediction's largest loss.
ASSUMPTIONS = {"straggler": "GPUs as far apart as the committed one-GPU runs, steps as uneven",
               "bucket copies": "the one-GPU profile's cost per kernel", "buffer copies": "the one-GPU profile's cost "
               "per kernel", "SM sharing": "NCCL's 16 channels' share of the SMs",
               "link": "the link presets' bus bandwidth, NCCL's latency model"}


def section_model_inputs(_=None):
    """The figures the model takes from the model's structure, the profile and the committed one-GPU runs."""
    baseline = baseline_of([ROOT / path for path in DEFAULT_PAIR])
    local = local_costs(baseline, None, doc_arguments())
    facts = facts_for(workload_of(baseline.config), baseline, local)
    rows = ["| input | value |", "|---|---|",
            f"| ResNet-50 (torchvision, meta device) | {sum(facts.param_numels):,} parameters in "
            f"{len(facts.param_numels)} tensors, {len(facts.buffer_bytes)} buffers |",
            f"| DDP's buckets at 25 MB | {len(ddp_buckets(facts, 25 * 2 ** 20))} |",
            f"| the backward's share of the default eager step (roofline) | {100 * facts.backward_share:.0f} % |",
            f"| a kernel's cost (the one-GPU profile) | {local.kernel_us:.2f} us |"]
    for name, path in (("the default eager step", DEFAULT_PAIR[0]), ("compiled", COMPILED),
                       ("the fastest mode", FASTEST)):
        spread, gpus, runs, extent = gpu_spread(one_gpu_result(ROOT / path))
        rows.append(f"| GPU-to-GPU spread, {name} | {100 * spread:.2f} % ({gpus} GPUs, {runs} runs; the fastest GPU "
                    f"{100 * extent:.1f} % faster than the slowest) |")
    return "\n".join(rows)


def section_predictions_default(_=None):
    return section_predictions(DEFAULT_PAIR, "The default eager step")


def median_run(reference):
    """The committed one-GPU run of reference's benchmark and workload with the median img/s (the lower middle one
    of an even count), and the img/s of them all."""
    result = one_gpu_result(ROOT / reference)
    key = (result["benchmark"], workload_key(result))
    runs = sorted((r["throughput"]["images_per_second"], p) for p, r in committed_one_gpu_runs()[key])
    return runs[(len(runs) - 1) // 2][1], [rate for rate, _ in runs]


def section_predictions_fastest(_=None):
    path, rates = median_run(FASTEST)
    return section_predictions([path], f"The fastest mode (compiled and captured), from the median of the "
                                       f"{len(rates)} committed runs of its workload ({min(rates):,.0f}-"
                                       f"{max(rates):,.0f} img/s)")


def section_nics(_=None):
    """DDP and the sharded strategies past one node with fewer NICs per node."""
    rows = ["| NICs per node | strategy | 64 GPUs: efficiency | exposed communication % | 512 GPUs: efficiency | "
            "exposed communication % |", "|---|---|---|---|---|---|"]
    for nics in (8, 2, 1):
        args = doc_arguments(results=list(DEFAULT_PAIR), link="nvlink4", nics_per_node=nics)
        for strategy in ("ddp", "zero1", "fsdp_zero2", "fsdp_zero3"):
            _, _, _, (at64, at512) = predictions_of(args, [64, 512], [strategy])
            rows.append(f"| {nics} | {strategy} | {100 * at64.efficiency:.1f} % | {describe_terms(at64, COMMUNICATION)}"
                        f" | {100 * at512.efficiency:.1f} % | {describe_terms(at512, COMMUNICATION)} |")
    command = (f"python scaling_model.py {' '.join(DEFAULT_PAIR)} --gpus 64,512 --link nvlink4 "
               f"--strategies ddp,zero1,fsdp_zero2,fsdp_zero3 --nics-per-node N")
    return (f"`{command}` for N = 8, 2, 1 (every row an extrapolation: nothing in sample has more than 2 GPUs; the "
            f"inter-node preset and the NIC count decide it):\n\n" + "\n".join(rows))


@functools.lru_cache(maxsize=1)
def committed_validation():
    return validate([ROOT / "results"], doc_arguments())


LOSS_GROUPS = (("eager, DDP's defaults (buffers broadcast, bucket views, 25 MB)",
                lambda r, c: r["mode"] == "eager" and c["bb"] and c["bv"] and c["cap"] == 25),
               ("eager, `--no-broadcast-buffers`", lambda r, c: r["mode"] == "eager" and not c["bb"]),
               ("eager, without bucket views (PyTorch's default)", lambda r, c: r["mode"] == "eager" and not c["bv"]),
               ("compiled, one graph (`no_optimization`)", lambda r, c: r["mode"].startswith("compiled (no_opt")))


def run_options(path):
    config = load_json(ROOT / path, "result")["config"]
    return {"bb": config.get("broadcast_buffers") is not False, "bv": bool(config.get("gradient_as_bucket_view")),
            "cap": config.get("bucket_cap_mb") or 25}


def section_two_gpu_losses(_=None):
    """What the model says each group of measured 2-GPU DDP runs loses to, in ms a step."""
    runs = [r for r in committed_validation()["runs"] if r["like_for_like"] and r["strategy"] in ("ddp",
            "lightning_ddp") and set(r["not_modelled"]) <= {"the power cap"}]
    rows = ["| runs (2 GPUs, 256 images per GPU, DDP) | n | measured loss, ms a step | predicted loss | "
            "on the link | straggler | DDP's added kernels | SM sharing | unexplained (mean) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for label, accept in LOSS_GROUPS:
        chosen = [r for r in runs if accept(r, run_options(r["path"])) and "256" in r["path"]]
        if not chosen:
            continue
        measured = [one_gpu_ms(r) * (100 / r["measured"] - 1) for r in chosen]
        parts = [statistics.fmean(loss_parts(r)[i] for r in chosen) for i in range(5)]
        predicted = sum(parts)
        rows.append(f"| {label} | {len(chosen)} | {min(measured):.2f}-{max(measured):.2f} | {predicted:.2f} | "
                    + " | ".join(f"{part:.2f}" for part in parts[:4])
                    + f" | {statistics.fmean(measured) - predicted:+.2f} |")
    return ("The DDP runs of `--validate results` in the model's scope, and the compiled ones that lack only the "
            "power cap, each against the one-GPU runs of its own GPUs (\"on the link\": the exposed all-reduce and "
            "the buffer broadcast; the optimizer's term is 0 for native DDP):\n\n" + "\n".join(rows))


def one_gpu_ms(run):
    terms = run["terms_ms"]
    return terms["compute"] + terms["per-step overhead"]


def loss_parts(run):
    t = run["terms_ms"]
    link = sum(t.get(name, 0.0) for name in COMMUNICATION)
    kernels = t.get("bucket copies", 0.0) + t.get("buffer copies", 0.0)
    return link, t["straggler"], kernels, t.get("SM sharing", 0.0), t.get("optimizer", 0.0)


def seed_baseline(compute_ms):
    """The seed's one-GPU step, known only through their vanilla DDP figure (no one-GPU run of theirs exists)."""
    return figure_baseline("fairscale's benchmarks/oss.py, vanilla DDP", SEED_CONFIG,
                           1e3 * SEED_CONFIG["batch_size_per_device"] / compute_ms, SEED_GPU["peak_tflops"], 0.0)


def seed_predictions(bandwidth, latency):
    """The seed's three strategies at 2 GPUs on a link: the one-GPU step solved from their vanilla DDP figure."""
    topology = Topology(given_link(bandwidth, latency), preset_link("ib-ndr400"))
    local = LocalCosts(kernel_profile_costs(KERNEL_PROFILE, SEED_GPU["memory_gbps"], 0).kernel_us,
                       SEED_GPU["memory_gbps"] / 2, SEED_GPU["memory_gbps"], SEED_GPU["channels"] / SEED_GPU["sms"],
                       "the H200 profile's kernel cost, an RTX 3090's memory bandwidth")
    target = 1e3 * SEED_CONFIG["batch_size_per_device"] / SEED_RATES["ddp"]
    compute = target
    for _ in range(50):  # the one-GPU step whose predicted DDP step is the seed's vanilla step
        ddp = predict("ddp", 2, seed_baseline(compute), workload_of(SEED_CONFIG, "ddp"), topology, local)
        compute += target - ddp.step_ms
    baseline = seed_baseline(compute)
    return {strategy: predict(strategy, 2, baseline, workload_of(SEED_CONFIG, strategy), topology, local)
            for strategy in SEED_RATES}


def section_seed(_=None):
    rows = ["| link (bus bandwidth, 2-rank all-reduce latency) | DDP img/s | OSS + DDP | OSS + ShardedDDP | "
            "OSS + DDP vs DDP | ShardedDDP vs DDP | what OSS + ShardedDDP adds, ms a step |",
            "|---|---|---|---|---|---|---|"]
    seed = SEED_RATES
    rows.append(f"| measured by the fairscale user | {seed['ddp']:,} | {seed['oss_ddp']:,} | "
                f"{seed['oss_sharded_ddp']:,} | {seed['oss_ddp'] / seed['ddp']:.3f} | "
                f"{seed['oss_sharded_ddp'] / seed['ddp']:.3f} | - |")
    for bandwidth, latency in ((SEED_LINK["bandwidth"], SEED_LINK["latency"]), (5.0, 135.0), (24.0, 20.0)):
        p = seed_predictions(bandwidth, latency)
        rate = {k: v.images_per_second / 2 for k, v in p.items()}
        added = {name: p["oss_sharded_ddp"].terms.get(name, 0.0) - p["ddp"].terms.get(name, 0.0)
                 for name in (*COMMUNICATION, *OVERHEAD)}
        parts = ", ".join(f"{name} {value:+.1f}" for name, value in added.items() if abs(value) >= 0.05)
        rows.append(f"| {bandwidth:g} GB/s, {latency:g} us | {rate['ddp']:,.0f} | {rate['oss_ddp']:,.0f} | "
                    f"{rate['oss_sharded_ddp']:,.0f} | {rate['oss_ddp'] / rate['ddp']:.3f} | "
                    f"{rate['oss_sharded_ddp'] / rate['ddp']:.3f} | {parts} |")
    return ("Per rank, as fairscale's benchmark reports (the one-GPU step is solved from the measured DDP figure, so "
            "the DDP column is that figure by construction):\n\n" + "\n".join(rows))


def section_validation_summary(_=None):
    v = committed_validation()
    scope, published = v["sets"]["in sample, in the model's scope"], v["sets"]["published, every predicted row"]
    gpu_names = sorted({next(key for key in GPUS if datasheet(key) == datasheet(r["gpu"])) for r in
                        v["published"]["rows"]})
    return "\n".join([
        f"`python scaling_model.py --validate results --json validation.json`. Validated in sample: "
        f"{scope['runs']} runs in the model's scope, each with {span(scope['gpus'])} GPUs on {span(scope['nodes'])} "
        f"node (this project's H200s, NVLink); out of sample: {published['runs']} published rows with "
        f"{span(published['gpus'])} GPUs on {span(published['nodes'])} nodes ({', '.join(gpu_names)}), of "
        f"{published['runs'] + len(v['published']['skipped'])} in `{v['published']['table']}`. The constant is "
        f"{v['constant_efficiency']['fitted_to']}, {v['constant_efficiency']['value']:.2f} %, predicted for every run "
        f"and row.", "", errors_table(v, v["sets"]), "", skipped_line(v), "",
        "Each group of in-sample runs:", "", errors_table(v, v["groups"])])


def section_validation(_=None):
    rows = ["| run | strategy | GPUs | the model's scope | one-GPU runs | measured | model | error, points | "
            "constant's error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(committed_validation()["runs"], key=lambda r: (not r["covered"], r["path"])):
        rows.append(f"| [{pathlib.PurePath(r['path']).name}](../{r['path']}) | {r['strategy']} | {r['gpus']} | "
                    f"{'in' if r['covered'] else 'out: ' + ', '.join(r['not_modelled'])} | "
                    f"{'own GPUs' if r['like_for_like'] else 'other GPUs'} | {r['measured']:.2f} % | "
                    f"{r['predicted']:.2f} % | {r['error']:+.2f} | {r['baseline_error']:+.2f} |")
    return "Every multi-rank run `--validate results` predicted:\n\n" + "\n".join(rows)


def section_validation_published(_=None):
    published = committed_validation()["published"]
    rows = ["| row | source | GPU | precision | batch per GPU | GPUs (nodes) | link, GB/s | one GPU, img/s | measured "
            "| model | error, points | constant's error |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in published["rows"]:
        rows.append(f"| {r['row']} | [{r['organisation']}]({r['source']}) | {r['gpu']} | {r['precision']} | "
                    f"{r['batch']} | {r['gpus']} ({r['nodes']}) | {r['link_gbps']:g} | "
                    f"{r['one_gpu_images_per_second']:,.0f} | {r['measured']:.2f} % | {r['predicted']:.2f} % | "
                    f"{r['error']:+.2f} | {r['baseline_error']:+.2f} |")
    rows += ["", "| row | source | GPU | GPUs (nodes) | skipped because |", "|---|---|---|---|---|"]
    rows += [f"| {r['row']} | {r.get('organisation', '-')} | {r.get('gpu', '-')} | {r.get('gpus', '-')} "
             f"({r.get('nodes', '-')}) | {r['reason']} |" for r in published["skipped"]]
    return f"Every row of `{published['table']}`, predicted or skipped:\n\n" + "\n".join(rows)


SECTIONS = {"model-inputs": section_model_inputs, "predictions": section_predictions_default,
            "predictions-fastest": section_predictions_fastest,
            "nics": section_nics, "two-gpu-losses": section_two_gpu_losses, "seed": section_seed,
            "validation-summary": section_validation_summary, "validation": section_validation,
            "validation-published": section_validation_published}


def main_doc(args):
    """The generated sections of one document checked or rewritten, through the documents' one engine."""
    path = pathlib.Path(args.check_doc or args.update_doc).resolve()
    if args.update_doc:
        return write_output(path, lambda: update_documents(SECTIONS, [path.name], path.parent))
    return check_documents(SECTIONS, [path.name], path.parent, fix=f"python scaling_model.py --update-doc {path}")


def main(argv=None):
    args = parse_arguments(sys.argv[1:] if argv is None else argv)
    counts, strategies = check_arguments(args)
    if args.validate:
        return main_validate(args)
    if args.check_doc or args.update_doc:
        return main_doc(args)
    return main_predict(args, counts, strategies)


if __name__ == "__main__":
    run_cli(main, PROG)
