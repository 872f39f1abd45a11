"""Tables, plots and a regression check from the benchmarks' result files (schema/result.schema.json).

    python report.py results/                                   # Markdown report on stdout
    python report.py results/ runs/ --markdown report.md --plots plots/
    python report.py runs/ci.json --check-against results/nvidia-h200-x2-2026-11-30b --tolerance 5%
    python report.py results --markdown docs/results.md         # regenerate the committed report
    python report.py results --check-markdown docs/results.md   # exit 1 when that file is stale

Inputs are result files or folders, searched recursively for *.json (hidden files, such as a run's
half-written .tmp-*.json, are left out). A file that cannot be read, is not JSON, is not a result or has
another schema_version is skipped with a one-line warning on stderr; when every file is skipped, that is
one error line.

A configuration is everything that changes what is measured: the device (GPU name, or the CPU), the torch
version, model, image size, precision, memory format, compile mode, optimizer, then the benchmark, strategy,
script-specific options (e.g. DDP's bucket size, the Lightning twin's variant; shown next to the strategy where
they differ between runs), node count, world size, batch mode and batch sizes. Step counts, seeds, learning rate,
timeouts and output paths are not part of it; an option a result does not record takes the value its script
used before it was recorded (e.g. the Lightning twin's matched variant). Results with the same configuration are
repeats: the ok ones become one row (the median of each figure over the repeats, and the spread
(max - min) / median of their throughput, which says whether a re-run agrees within a few per cent); a result
that did not end ok gets a row of its own, marked with its status, and is left out of every comparison. A row
whose results found their own run unsteady (their stability says noisy: halves of the timed steps that differ,
or a host-bound step) is marked "noisy: repeat or interleave".

Peak memory is compared only between results that took it over the same steps (their memory window: older
results took it over the timed steps only); where a table mixes windows, each figure names its window.

Tables (Markdown): every configuration (rank 0's median throughput ± MAD, the all-GPU throughput, peak
memory); weak scaling (efficiency = throughput at N / (N x throughput at 1)) and strong scaling (speed-up);
Lightning over native DDP, with the twin's variant (stock or matched); the sharding strategies of
oss_benchmark.py with the memory they save against its ddp strategy. Throughput is images of all ranks / wall
time of the timed steps (`images_per_second`); peak memory is the largest `max_memory_allocated` over the ranks
(none on the CPU).

Regression check: every current result is compared with the reference result(s) of the same configuration
(software versions aside: catching what a new version costs is the point). A throughput drop or a peak
memory rise beyond the tolerance, or a status other than ok, is a violation: one line each, exit 1. Several
reference results of one configuration are repeats: the check compares with their median. A current result
without a reference is reported and not checked; when that leaves nothing checked and nothing failed, the
reference is incomparable (exit 2). Peak memory is only compared where both sides measured it (not on CPUs)
over the same window.

Exit codes: 0 fine, 1 regression or stale Markdown file, 2 unusable invocation (one line on stderr).
"""

import argparse
import hashlib
import json
import math
import pathlib
import re
import statistics
import sys
from collections import defaultdict, namedtuple

SCHEMA_VERSION = 1
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
STATUSES = ("ok", "oom", "desync", "error", "interrupted")
NATIVE, LIGHTNING, OSS = "ddp_resnet50.py", "lightning/ddp_resnet50.py", "oss_benchmark.py"
# oss_benchmark.py's strategies from the plainest to the most sharded; others follow alphabetically.
SHARDING_ORDER = ("ddp", "oss_ddp", "oss_sharded_ddp", "zero1", "zero1_overlap", "fsdp_zero2", "fsdp_zero3")
REPOSITORY = pathlib.Path(__file__).resolve().parent
NO_RESULTS = ("No results committed yet: run the benchmarks on a GPU machine, put the result files under "
              "`results/<machine kind>-<date>/` (see `results/README.md`) and run "
              "`python report.py results --markdown docs/results.md`.")
# What a result's memory.window says when it is absent: the scripts took peak memory over the timed steps only.
TIMED_STEPS = "timed steps"
# The Lightning twin's variants; results from before the choice ran what is now called matched.
LIGHTNING_VARIANTS, LIGHTNING_DEFAULT_VARIANT = ("stock", "matched"), "matched"
NOISY = "noisy: repeat or interleave"

SETUP_FIELDS = ("device", "device_name", "torch", "model", "image_size", "precision", "memory_format",
                "compile_mode", "optimizer")
# Options that a result carries only when they were given: their absence is the default, not worth a word.
ABSENT_BY_DEFAULT = {"inductor_environment"}
TORCH_CUDNN_BENCHMARK_LIMIT = 10  # torch.backends.cudnn.benchmark_limit's default (seen in torch 2.11 and 2.14)
RUN_FIELDS = ("benchmark", "strategy", "options", "num_nodes", "world_size", "batch_mode",
              "batch_size_per_device", "global_batch_size")
Config = namedtuple("Config", SETUP_FIELDS + RUN_FIELDS)
# Config entries that are keyed above, follow from a keyed one, or do not change what is measured;
# every other entry of a result's config is a script-specific option and part of the configuration.
NOT_OPTIONS = {"benchmark", "strategy", "device", "backend", "model", "image_size", "batch_mode",
               "batch_size_per_device", "global_batch_size", "warmup_steps", "steps", "precision_requested",
               "precision", "grad_scaler", "tf32", "memory_format_requested", "memory_format", "compile",
               "compile_mode", "optimizer", "lr", "seed", "timeout_s", "timeout", "output", "overwrite",
               "inject_fault", "inject_fault_rank", "inject_fault_step",
               # how the timed steps are summarised, not how they run
               "steps_per_epoch",
               # CPU runs: the cores shared out over the ranks, so it follows the world size.
               "cpu_threads_per_rank",
               # Lightning: its devices per node and nodes (the world), its precision name, its version.
               "devices", "num_nodes", "trainer_precision", "lightning",
               # oss_benchmark.py: the passes after the timed steps, the launch's other strategies, the
               # optimizer's arguments (lr and momentum, recorded on their own) and its state size (follows
               # from the optimizer and momentum).
               "optimizer_state_tensors_per_parameter",
               "phase_steps", "profile_steps", "trace_dir", "strategies_in_launch", "optimizer_kwargs"}

# The fields this report reads, with the types it can work with (a subset of the schema).
NUMBER, OPTIONAL_NUMBER, POSITIVE_INT = "number", "number or null", "positive integer"
REQUIRED_FIELDS = [
    ("benchmark", str), ("strategy", str), ("status", str), ("config", dict), ("world", dict),
    ("config.device", str), ("config.image_size", POSITIVE_INT), ("config.batch_mode", str),
    ("config.batch_size_per_device", POSITIVE_INT), ("config.global_batch_size", POSITIVE_INT),
    ("config.precision", str), ("config.memory_format", str), ("config.optimizer", str),
    ("world.world_size", POSITIVE_INT), ("world.num_nodes", POSITIVE_INT),
]
# An ok result is compared with others: it needs its throughput figures.
OK_FIELDS = ["throughput.images_per_second", "throughput.rank0_median_images_per_second",
             "throughput.rank0_mad_images_per_second"]
OPTIONAL_FIELDS = [
    ("config.model", str), ("config.compile_mode", str), ("software", dict), ("software.torch", str),
    ("software.environment", dict),
    ("hardware", dict), ("hardware.ranks", list), ("hardware.cpu", str), ("failure", dict),
    ("failure.message", str), ("throughput", dict), ("memory", dict),
    ("throughput.images_per_second", NUMBER), ("throughput.rank0_median_images_per_second", NUMBER),
    ("throughput.rank0_mad_images_per_second", NUMBER), ("memory.peak_allocated_mib", OPTIONAL_NUMBER),
    ("memory.peak_reserved_mib", OPTIONAL_NUMBER), ("memory.window", str), ("step_times_ms_per_rank", list),
    ("stability", dict), ("stability.noisy", bool), ("stability.reason", str),
    ("stability.second_half_over_first", NUMBER), ("stability.host_lead_ms_median", NUMBER),
    ("config.lightning_variant", str),
]


class UsageError(Exception):
    """An invocation this report cannot serve: one line on stderr, exit 2."""


class OneLineArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


# ---------------------------------------------------------------------------- reading results

def find_result_files(paths):
    files, seen = [], set()
    for given in paths:
        path = pathlib.Path(given)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.json")
                           if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts))
        elif path.is_file():
            found = [path]
        else:
            raise UsageError(f"{given}: no such file or folder")
        for file in found:
            if file.resolve() not in seen:
                seen.add(file.resolve())
                files.append(file)
    return files


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def lookup(result, dotted):
    value = result
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return KeyError
        value = value[part]
    return value


def has_type(value, expected):
    if expected == NUMBER:
        return is_number(value)
    if expected == OPTIONAL_NUMBER:
        return value is None or is_number(value)
    if expected == POSITIVE_INT:
        return isinstance(value, int) and not isinstance(value, bool) and value > 0
    return isinstance(value, expected) and not (expected is int and isinstance(value, bool))


def problem_with(result):
    """Why a parsed JSON document cannot be read as a result, or None."""
    if not isinstance(result, dict) or "schema_version" not in result:
        return "not a benchmark result (no schema_version)"
    if result["schema_version"] != SCHEMA_VERSION:
        return f"schema_version {result['schema_version']!r}, this report reads version {SCHEMA_VERSION}"
    for dotted, expected in REQUIRED_FIELDS:
        value = lookup(result, dotted)
        if value is KeyError:
            return f"not a benchmark result ({dotted} is missing)"
        if not has_type(value, expected):
            return f"{dotted} is {value!r}, not a {getattr(expected, '__name__', expected)}"
    for dotted, expected in OPTIONAL_FIELDS:
        value = lookup(result, dotted)
        if value is not KeyError and value is not None and not has_type(value, expected):
            return f"{dotted} is {value!r}, not a {getattr(expected, '__name__', expected)}"
    if result["status"] not in STATUSES:
        return f"status {result['status']!r} is none of {', '.join(STATUSES)}"
    if result["config"]["batch_mode"] not in ("per_device", "global"):
        return f"config.batch_mode {result['config']['batch_mode']!r} is neither per_device nor global"
    if result["config"].get("lightning_variant", LIGHTNING_DEFAULT_VARIANT) not in LIGHTNING_VARIANTS:
        return (f"config.lightning_variant {result['config']['lightning_variant']!r} is none of "
                f"{', '.join(LIGHTNING_VARIANTS)}")
    if result["status"] == "ok":
        missing = [dotted for dotted in OK_FIELDS if lookup(result, dotted) in (KeyError, None)]
        if missing:
            return f"status ok but {missing[0]} is missing"
        if not result["throughput"]["images_per_second"] > 0:
            return "status ok but throughput.images_per_second is not positive"
    per_rank = result.get("step_times_ms_per_rank") or []
    if not all(isinstance(times, list) and all(is_number(t) for t in times) for times in per_rank):
        return "step_times_ms_per_rank is not a list of lists of numbers"
    return None


def read_result_file(path):
    """(result, None) or (None, why it was skipped)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        return None, f"cannot be read ({error.__class__.__name__}: {error})"
    try:
        result = json.loads(text)
    except ValueError as error:
        return None, f"not JSON ({error})"
    problem = problem_with(result)
    return (None, problem) if problem else (result, None)


def options_of(config):
    """Script-specific settings as a hashable, sorted tuple of (name, JSON text)."""
    return tuple(sorted((name, json.dumps(value, sort_keys=True)) for name, value in config.items()
                        if name not in NOT_OPTIONS))


def device_name_of(config, hardware):
    if config["device"] == "cpu":
        return f"CPU ({hardware['cpu']})" if hardware.get("cpu") else None
    names = sorted({rank.get("gpu_name") for rank in hardware.get("ranks") or []
                    if isinstance(rank, dict) and isinstance(rank.get("gpu_name"), str)})
    return " + ".join(names) or None  # None: the run failed before it looked at its hardware


def effective_options(config, benchmark, world_size, environment=None):
    """The recorded options, with what a run used where it recorded nothing:
    - the compiled-DDP mode: a compiled run over several ranks split its graph at DDP's buckets (PyTorch's
      default, ddp_optimizer), in the native script and in the Lightning twin alike (Dynamo sees DDP around the
      compiled ResNet while it traces);
    - Inductor's coordinate-descent tuning (recorded since --coordinate-descent-tuning): on in the max-autotune
      modes and under TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1, off otherwise;
    - any other TORCHINDUCTOR_ variable the run was given (its cache folder aside), as inductor_environment:
      it changes what Inductor generates;
    - cuDNN's autotuning limit (recorded since --cudnn-benchmark-limit; null where a script left it alone):
      PyTorch's default, 10 algorithms per convolution, where cuDNN autotuned;
    - the DDP comm hook (recorded since --comm-hook): none, DDP's own all-reduce;
    - DDP's buffer broadcast (recorded since --broadcast-buffers): on, DDP's default;
    - the fp16 loss scale (recorded since --loss-scale): dynamic where the GradScaler ran, none otherwise;
    - how the ResNet stem was computed (recorded since --space-to-depth-stem and --dense-max-pool-backward, in the
      native script and the Lightning twin) and its batch norms (since --sums-batch-norm): as torchvision's modules;
    - the Lightning twin's variant (recorded since the twin ran Lightning's stock loop as well): matched."""
    config, environment = dict(config), environment or {}
    config.setdefault("comm_hook", "none")
    config.setdefault("broadcast_buffers", True)
    if config.get("loss_scale") is None:
        config["loss_scale"] = "dynamic" if config.get("grad_scaler") else None
    if benchmark in (NATIVE, LIGHTNING):
        config.setdefault("stem_conv", "torchvision")
        config.setdefault("max_pool_backward", "torchvision")
        config.setdefault("batch_norm", "torchvision")
    if benchmark == LIGHTNING:
        config.setdefault("lightning_variant", LIGHTNING_DEFAULT_VARIANT)
    if (config.get("compile") and world_size > 1 and config.get("compiled_ddp") is None and "compiled_ddp" in config
            and benchmark in (NATIVE, LIGHTNING)):
        config["compiled_ddp"] = "ddp_optimizer"
    if "coordinate_descent_tuning" not in config:
        config["coordinate_descent_tuning"] = bool(config.get("compile")) and (
            environment.get("TORCHINDUCTOR_COORDINATE_DESCENT_TUNING", "0").lower() in ("1", "true")
            or str(config.get("compile_mode")).startswith("max-autotune"))
    if config.get("cudnn_benchmark_limit") is None:
        config["cudnn_benchmark_limit"] = TORCH_CUDNN_BENCHMARK_LIMIT if config.get("cudnn_benchmark") else None
    inductor = {name: value for name, value in environment.items() if name.startswith("TORCHINDUCTOR_")
                and name not in ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING")}
    if inductor:
        config["inductor_environment"] = inductor
    return config


def make_run(path, result):
    world = result["world"]
    config = effective_options(result["config"], result["benchmark"], world["world_size"],
                               (result.get("software") or {}).get("environment"))
    hardware = result.get("hardware") or {}
    throughput = result.get("throughput") or {}
    memory = result.get("memory") or {}
    stability = result.get("stability") or {}
    key = Config(device=config["device"], device_name=device_name_of(config, hardware),
                 torch=(result.get("software") or {}).get("torch"), model=config.get("model") or "resnet50",
                 image_size=config["image_size"], precision=config["precision"],
                 memory_format=config["memory_format"], compile_mode=config.get("compile_mode"),
                 optimizer=config["optimizer"], benchmark=result["benchmark"], strategy=result["strategy"],
                 options=options_of(config), num_nodes=world["num_nodes"], world_size=world["world_size"],
                 batch_mode=config["batch_mode"], batch_size_per_device=config["batch_size_per_device"],
                 global_batch_size=config["global_batch_size"])
    return {"path": path, "config": key, "status": result["status"],
            "failure": (result.get("failure") or {}).get("message"),
            "images_per_second": throughput.get("images_per_second"),
            "rank0_median": throughput.get("rank0_median_images_per_second"),
            "rank0_mad": throughput.get("rank0_mad_images_per_second"),
            "peak_allocated_mib": memory.get("peak_allocated_mib"),
            "peak_reserved_mib": memory.get("peak_reserved_mib"),
            "memory_window": window_label(memory.get("window")),
            "noisy": stability.get("noisy") is True, "noisy_reason": stability.get("reason"),
            "step_times_ms": [t for times in result.get("step_times_ms_per_rank") or [] for t in times]}


def window_label(window):
    """A memory window in a few words: the recorded text up to its parenthesis, or the timed steps where a
    result recorded none."""
    return window.split(" (")[0].strip() or window if window else TIMED_STEPS


def name_unknown_gpus(runs):
    """A run that failed before it looked at its hardware (an OOM in the first step) takes the device name of
    the results next to it: one folder of results/ is one machine. Without such neighbours it stays unknown."""
    names = defaultdict(set)
    for run in runs:
        if run["config"].device_name:
            names[run["path"].parent, run["config"].device].add(run["config"].device_name)
    for run in runs:
        if run["config"].device_name is None:
            known = names[run["path"].parent, run["config"].device]
            unknown = "unknown GPU" if run["config"].device == "cuda" else "CPU"
            name = next(iter(known)) if len(known) == 1 else unknown
            run["config"] = run["config"]._replace(device_name=name)
    return runs


def load_runs(paths, what="input"):
    """Every readable result under paths; prints a warning for each file skipped. When every file found is
    skipped, one UsageError says so instead (no result at all is the caller's to judge)."""
    runs, skipped = [], []
    for path in find_result_files(paths):
        result, problem = read_result_file(path)
        if problem:
            skipped.append((path, problem))
        else:
            runs.append(make_run(path, result))
    if skipped and not runs:
        named = "; ".join(f"{path}: {problem}" for path, problem in skipped[:3])
        more = f"; {len(skipped) - 3} more" if len(skipped) > 3 else ""
        count = f"{len(skipped)} file{'s' * (len(skipped) > 1)}"
        raise UsageError(f"{'--check-against ' if what == 'reference' else ''}{', '.join(map(str, paths))}: "
                         f"no valid result file, {count} skipped as invalid ({named}{more})")
    for path, problem in skipped:
        print(f"report.py: warning: {what} {path}: skipped: {problem}", file=sys.stderr)
    return name_unknown_gpus(runs)


# ---------------------------------------------------------------------------- grouping

def order(config):
    """A sort key for configurations whose fields may be None."""
    return tuple((True, "") if value is None else (False, value) for value in config)


def aggregate(runs):
    """One row per configuration of ok repeats (medians, and the spread between repeats), one row per
    run that did not end ok. Sorted by configuration."""
    repeats, rows = defaultdict(list), []
    for run in runs:
        if run["status"] == "ok":
            repeats[run["config"]].append(run)
        else:
            rows.append(row_of([run], run["status"]))
    for config, members in repeats.items():
        rows.append(row_of(members, "ok"))
    return sorted(rows, key=row_order)


def row_order(row):
    """Setup, then benchmark and strategy, then the scaling series (batch mode, the batch it keeps), then
    the GPU count: a series reads top to bottom. Failed runs after the ok row of their configuration."""
    config = row["config"]
    kept = config.batch_size_per_device if config.batch_mode == "per_device" else config.global_batch_size
    return (order(setup_of(config)), config.benchmark, strategy_rank(config.strategy), config.options,
            config.batch_mode, kept, config.world_size, config.num_nodes, order(config), row["status"] != "ok",
            row["status"], [str(run["path"]) for run in row["runs"]])


def median_or_none(values):
    return None if not values or None in values else statistics.median(values)


def row_of(runs, status):
    throughputs = [run["images_per_second"] for run in runs]
    known = [value for value in throughputs if value is not None]
    spread = (max(known) - min(known)) / statistics.median(known) if len(known) > 1 else None
    return {"config": runs[0]["config"], "status": status, "runs": sorted(runs, key=lambda run: str(run["path"])),
            "images_per_second": median_or_none(throughputs), "spread": spread,
            "rank0_median": median_or_none([run["rank0_median"] for run in runs]),
            "rank0_mad": median_or_none([run["rank0_mad"] for run in runs]),
            "memory": memory_by_window(runs), "noisy": [run for run in runs if run["noisy"]],
            "step_times_ms": [t for run in runs for t in run["step_times_ms"]],
            "failure": runs[0]["failure"]}


def memory_by_window(runs):
    """{window: (peak allocated, peak reserved)}, the medians over the runs that measured memory over that window:
    figures taken over other steps are not pooled."""
    windows = defaultdict(list)
    for run in runs:
        if run["peak_allocated_mib"] is not None:
            windows[run["memory_window"]].append(run)
    return {window: (statistics.median(run["peak_allocated_mib"] for run in members),
                     median_or_none([run["peak_reserved_mib"] for run in members]))
            for window, members in sorted(windows.items())}


def common_window(*rows):
    """The memory window that every row measured (the latest scripts' where there are several), or None."""
    shared = set.intersection(*(set(row["memory"]) for row in rows))
    return min(shared, key=lambda window: (window == TIMED_STEPS, window)) if shared else None


def peak_mib(row, window=None, reserved=False):
    """A row's peak memory over a window (its only or preferred one by default), None where not measured."""
    window = window or common_window(row)
    return row["memory"][window][reserved] if window in row["memory"] else None


def setup_of(config):
    return config[:len(SETUP_FIELDS)]


def rows_by_setup(rows):
    setups = defaultdict(list)
    for row in rows:
        setups[setup_of(row["config"])].append(row)
    return setups


def varying_options(runs):
    """Per benchmark and strategy, the option names whose values differ between its results: only those are
    shown (an option that comes with a strategy, such as FSDP's unit count, says nothing the name does not). An
    option one result records and another does not (a newer script records more) varies only where that absence
    is all that tells two results apart."""
    names, values = defaultdict(set), defaultdict(lambda: defaultdict(set))
    for run in runs:
        names[run["config"].benchmark, run["config"].strategy].update(dict(run["config"].options))
    for run in runs:
        which, options = (run["config"].benchmark, run["config"].strategy), dict(run["config"].options)
        for name in names[which]:
            values[which][name].add(options.get(name))
    varying = {which: sorted(name for name, seen in by_name.items() if len(seen - {None}) > 1)
               for which, by_name in values.items()}
    for which, by_name in values.items():
        labels = defaultdict(set)
        for run in runs:
            if (run["config"].benchmark, run["config"].strategy) == which:
                options = dict(run["config"].options)
                labels[run["config"]._replace(options=None), tuple(options.get(name) for name in varying[which])].add(
                    run["config"].options)
        if any(len(options) > 1 for options in labels.values()):
            varying[which] = sorted(name for name, seen in by_name.items() if len(seen) > 1)
    return varying


def options_agree(a, b):
    """Options recorded on both sides are equal (a newer script may record more than an older one)."""
    mine, theirs = dict(a.options), dict(b.options)
    return all(mine[name] == theirs[name] for name in mine.keys() & theirs.keys())


def scaling_series(rows, batch_mode):
    """Ok rows that differ only in world size (and node count): weak scaling keeps the batch per device,
    strong scaling the global batch. Only series with two GPU counts or more."""
    free = {"world_size": None, "num_nodes": None,
            "global_batch_size" if batch_mode == "per_device" else "batch_size_per_device": None}
    series = defaultdict(list)
    for row in rows:
        if row["status"] == "ok" and row["config"].batch_mode == batch_mode:
            series[row["config"]._replace(**free)].append(row)
    return [sorted(members, key=lambda row: (row["config"].world_size, row["config"].num_nodes))
            for key, members in sorted(series.items(), key=lambda item: order(item[0]))
            if len({row["config"].world_size for row in members}) > 1]


def lightning_pairs(rows):
    """(native ddp row, lightning_ddp row) of the same configuration, the options both record equal."""
    def key(config):
        return config._replace(benchmark=None, strategy=None, options=None)
    native = defaultdict(list)
    for row in rows:
        if row["status"] == "ok" and (row["config"].benchmark, row["config"].strategy) == (NATIVE, "ddp"):
            native[key(row["config"])].append(row)
    lightning = [row for row in rows if row["status"] == "ok" and
                 (row["config"].benchmark, row["config"].strategy) == (LIGHTNING, "lightning_ddp")]
    return [(base, row) for row in lightning for base in native.get(key(row["config"]), [])
            if options_agree(base["config"], row["config"])]


def sharding_groups(rows):
    """oss_benchmark.py rows (failed ones included: an OOM is the point of a sharding table) grouped by
    configuration apart from the strategy; each row with its baseline, the ok ddp row whose options agree
    with its own (e.g. the same bucket size), or None."""
    groups = defaultdict(list)
    for row in rows:
        if row["config"].benchmark == OSS:
            groups[row["config"]._replace(strategy=None, options=None)].append(row)
    result = []
    for key, members in sorted(groups.items(), key=lambda item: order(item[0])):
        members.sort(key=lambda row: (strategy_rank(row["config"].strategy), order(row["config"]),
                                      row["status"] != "ok"))
        baselines = [row for row in members if row["status"] == "ok" and row["config"].strategy == "ddp"]
        result.append([(row, next((base for base in baselines if options_agree(base["config"], row["config"])),
                                  None)) for row in members])
    return result


def strategy_rank(strategy):
    return (SHARDING_ORDER.index(strategy), "") if strategy in SHARDING_ORDER else (len(SHARDING_ORDER), strategy)


# ---------------------------------------------------------------------------- Markdown

def format_rate(value, like=None):
    """Images per second: thousands separators; decimals only where the numbers are small (CPU runs)."""
    if value is None:
        return "–"
    scale = abs(like if like is not None else value)
    decimals = 0 if scale >= 100 else 1 if scale >= 10 else 2
    return f"{value:,.{decimals}f}"


def format_mib(value):
    return "n/a" if value is None else f"{value:,.0f}"


def windows_of(rows):
    return {window for row in rows for window in row["memory"]}


def memory_header(text, windows):
    """A memory column's title; it names the window where every figure in the column shares one."""
    return f"{text} (MiB, {next(iter(windows))})" if len(windows) == 1 else f"{text} (MiB)"


def memory_cell(row, named, window=None):
    """A row's peak memory (over window, or each window it has); named: each figure says its window, for a
    column that mixes them. n/a: the run measured no GPU memory (CPU); –: it did not get that far."""
    figures = [(window, row["memory"][window])] if window in row["memory"] else list(row["memory"].items())
    if not figures:
        return "–" if row["status"] != "ok" else "n/a"
    return "; ".join(format_mib(allocated) + (f" ({name})" if named else "") for name, (allocated, _) in figures)


def format_percent(fraction, signed=False):
    return "–" if fraction is None else f"{fraction * 100:{'+' if signed else ''}.1f} %"


def format_ratio(value):
    return "–" if value is None else f"{value:.2f}×"


def rank0_cell(row):
    """Rank 0's median throughput ± MAD, as fairscale's table shows it."""
    if row["rank0_median"] is None:
        return "–"
    return f"{format_rate(row['rank0_median'])} ± {format_rate(row['rank0_mad'], like=row['rank0_median'])}"


def format_status(row):
    if row["status"] != "ok":
        return f"**✗ {row['status']}**"
    if not row["noisy"]:
        return "ok"
    runs = len(row["runs"])
    return f"ok, {NOISY}" if runs == 1 else f"ok, {len(row['noisy'])} of {runs} runs {NOISY}"


def noisy_notes(rows):
    """One footnote per noisy result of the rows: why its stability says one run is not enough."""
    return [f"- {NOISY}: `{run['path'].name}`: {run['noisy_reason'] or 'unsteady'}"
            for row in rows if row["status"] == "ok" for run in row["noisy"]]


def unit_of(config):
    return "GPU" if config.device == "cuda" else "process"


def units_of(config):
    return "GPUs" if config.device == "cuda" else "processes"


def devices_text(config):
    nodes = f" ({config.num_nodes} nodes)" if config.num_nodes > 1 else ""
    return f"{config.world_size}{nodes}"


def strategy_text(config, varying):
    differing = varying.get((config.benchmark, config.strategy), [])
    shown = [(name, value) for name, value in config.options if name in differing]
    missing = [name for name in differing if name not in dict(config.options) and name not in ABSENT_BY_DEFAULT]
    details = [f"{name}={value.strip(chr(34))}" for name, value in shown] + [f"{name} unset" for name in missing]
    return config.strategy + (f" ({', '.join(details)})" if details else "")


def lightning_variant(config):
    return json.loads(dict(config.options).get("lightning_variant", "null")) or "–"


def setup_title(setup):
    config = Config(*setup, *[None] * len(RUN_FIELDS))
    compiled = "eager" if config.compile_mode is None else f"torch.compile {config.compile_mode}"
    return (f"{config.device_name} · torch {config.torch or 'unknown'} · {config.model} · {config.image_size} px · "
            f"{config.precision} · {config.memory_format} · {compiled} · {config.optimizer}")


def table(header, lines):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return "\n".join(out)


def sources_text(rows, base):
    counts = defaultdict(int)
    for row in rows:
        for run in row["runs"]:
            counts[display_path(run["path"].parent, base)] += 1
    return "Results from " + ", ".join(f"`{folder}` ({count} file{'s' * (count > 1)})"
                                       for folder, count in sorted(counts.items())) + "."


def display_path(path, base):
    """Relative to base where the path lies under it (the repository, a Markdown file's folder or the current one)."""
    path = pathlib.Path(path).resolve()
    return (path.relative_to(base).as_posix() or ".") if path.is_relative_to(base) else path.as_posix()


def all_runs_table(rows, varying):
    unit, units = unit_of(rows[0]["config"]), units_of(rows[0]["config"])
    lines, failures, windows = [], [], windows_of(rows)
    for row in rows:
        config = row["config"]
        rank0 = rank0_cell(row)
        lines.append([config.benchmark, strategy_text(config, varying), devices_text(config),
                      config.batch_mode.replace("_", " "), str(config.batch_size_per_device),
                      f"{config.global_batch_size:,}", rank0,
                      format_rate(row["images_per_second"]), memory_cell(row, len(windows) > 1),
                      str(len(row["runs"])), format_percent(row["spread"]), format_status(row)])
        if row["status"] != "ok":
            failures.append(f"- ✗ {row['status']} in `{row['runs'][0]['path'].name}`: "
                            f"{row['failure'] or 'no message'}")
    header = ["benchmark", "strategy", units, "batch mode", f"batch (img/{unit})", "global batch (img)",
              "Median throughput (img/s) (rank 0) ± MAD", "Throughput (img/s)", memory_header("Peak memory", windows),
              "runs", "spread between runs", "status"]
    notes = failures + noisy_notes(rows)
    return "\n\n".join(["**All configurations**", table(header, lines), *(["\n".join(notes)] if notes else [])])


def scaling_table(rows, varying, batch_mode):
    """Weak (per_device) or strong (global) scaling. Against the fewest GPUs of each series:
    speed-up = T(N) / T(base), ideal = N / base, efficiency = speed-up / ideal (weak: T(N) / (N x T(1)))."""
    unit, units, lines = unit_of(rows[0]["config"]), units_of(rows[0]["config"]), []
    weak = batch_mode == "per_device"
    for series in scaling_series(rows, batch_mode):
        base = series[0]
        for row in series:
            config = row["config"]
            speedup = row["images_per_second"] / base["images_per_second"]
            ideal = config.world_size / base["config"].world_size
            per_device, global_batch = str(config.batch_size_per_device), f"{config.global_batch_size:,}"
            lines.append([config.benchmark, strategy_text(config, varying),
                          per_device if weak else global_batch, devices_text(config),
                          global_batch if weak else per_device, format_rate(row["images_per_second"]),
                          format_rate(row["images_per_second"] / config.world_size), format_ratio(speedup),
                          format_ratio(ideal), format_percent(speedup / ideal)])
    if not lines:
        return None
    batches = [f"batch (img/{unit})", "global batch (img)"]
    header = ["benchmark", "strategy", batches[not weak], units, batches[weak], "Throughput (img/s)",
              f"Throughput per {unit} (img/s)", f"Speed-up vs fewest {units}", "Ideal speed-up",
              "Scaling efficiency"]
    title = (f"**Weak scaling** (fixed batch per {unit}; efficiency = throughput at N / (N × throughput at 1))"
             if weak else "**Strong scaling** (fixed global batch; speed-up = throughput at N / throughput at 1)")
    return "\n\n".join([f"{title[:-1]}; against the fewest {units} measured where 1 is missing)",
                        table(header, lines)])


def lightning_table(rows, varying):
    unit, units, lines = unit_of(rows[0]["config"]), units_of(rows[0]["config"]), []
    pairs = lightning_pairs(rows)
    # Memory side by side over the window both measured; a pair without one shows each figure with its window.
    shared = [common_window(native, lightning) for native, lightning in pairs]
    windows = windows_of([row for pair in pairs for row in pair])
    named = len(windows) > 1 or bool(windows) and None in shared
    for (native, lightning), window in zip(pairs, shared):
        config = lightning["config"]
        native_mib, lightning_mib = peak_mib(native, window), peak_mib(lightning, window)
        memory_ratio = lightning_mib / native_mib if window and lightning_mib is not None and native_mib else None
        ratio = format_ratio(lightning["images_per_second"] / native["images_per_second"])
        if native["noisy"] or lightning["noisy"]:
            ratio += f" ({NOISY})"
        lines.append([devices_text(config), config.batch_mode.replace("_", " "), str(config.batch_size_per_device),
                      strategy_text(native["config"], varying), format_rate(native["images_per_second"]),
                      strategy_text(config, varying), lightning_variant(config),
                      format_rate(lightning["images_per_second"]), ratio, memory_cell(native, named, window),
                      memory_cell(lightning, named, window), format_ratio(memory_ratio)])
    if not lines:
        return None
    header = [units, "batch mode", f"batch (img/{unit})", "native strategy", "native throughput (img/s)",
              "Lightning strategy", "Lightning variant", "Lightning throughput (img/s)",
              "Lightning / native throughput", memory_header("native peak memory", windows if not named else ()),
              memory_header("Lightning peak memory", windows if not named else ()), "Lightning / native memory"]
    return "\n\n".join(["**Lightning against native DDP** (same configuration; a ratio below 1.00× is "
                        "Lightning's cost)", table(header, lines)])


def sharding_table(rows, varying):
    unit, units, lines = unit_of(rows[0]["config"]), units_of(rows[0]["config"]), []
    groups = sharding_groups(rows)
    windows = windows_of([row for group in groups for row, _ in group])
    for group in groups:
        for row, baseline in group:
            config = row["config"]
            usable = baseline is not None and row["status"] == "ok" and row is not baseline
            speed = format_ratio(row["images_per_second"] / baseline["images_per_second"]) if usable else "–"
            saved = "baseline" if row is baseline else "n/a" if usable else "–"  # n/a: no memory counters
            window = usable and common_window(row, baseline)
            if row is baseline:
                speed = "baseline"
            elif window and peak_mib(baseline, window):
                difference = peak_mib(baseline, window) - peak_mib(row, window)
                difference = difference if round(difference) else 0.0  # under half a MiB is none, not "-0"
                saved = f"{difference:,.0f} MiB ({format_percent(difference / peak_mib(baseline, window))})"
            elif usable and row["memory"] and baseline["memory"]:
                saved = "– (other memory window)"
            rank0 = rank0_cell(row)
            lines.append([devices_text(config), str(config.batch_size_per_device), strategy_text(config, varying),
                          rank0, format_rate(row["images_per_second"]), speed, memory_cell(row, len(windows) > 1),
                          saved, format_status(row)])
    if not lines:
        return None
    header = [units, f"batch (img/{unit})", "strategy", "Median throughput (img/s) (rank 0) ± MAD",
              "Throughput (img/s)", "Throughput vs ddp", memory_header("Peak memory", windows), "Memory saved vs ddp",
              "status"]
    return "\n\n".join(["**Sharding strategies** (oss_benchmark.py; against its ddp strategy of the same "
                        "configuration)", table(header, lines)])


EXPLANATION = ("Each row is one configuration. Throughput = images of all ranks / wall time of the timed steps; "
               "rank 0's median throughput ± MAD comes from its per-step times; peak memory = the largest "
               "`max_memory_allocated` over the ranks (n/a on the CPU), over the steps its column or figure names "
               "(figures over different steps are never compared). Repeats of a configuration that ended ok "
               "are aggregated: the median over the runs, and the spread (max − min) / median of their "
               "throughput. Runs that did not end ok (✗) get a row each and stay out of every comparison. "
               f"\"{NOISY}\" marks results that found their own run unsteady (its two halves differ, or the host "
               "bounds the step): one such run is not enough.")


def render_markdown(runs, base, heading="###"):
    """The report as deterministic Markdown: everything sorted, no clock. Paths relative to base."""
    if not runs:
        return NO_RESULTS + "\n"
    rows, varying = aggregate(runs), varying_options(runs)
    setups = rows_by_setup(rows)
    parts = [EXPLANATION]
    for setup in sorted(setups, key=order):
        setup_rows = setups[setup]
        parts += [f"{heading} {setup_title(setup)}", sources_text(setup_rows, base)]
        tables = (all_runs_table(setup_rows, varying), scaling_table(setup_rows, varying, "per_device"),
                  scaling_table(setup_rows, varying, "global"), lightning_table(setup_rows, varying),
                  sharding_table(setup_rows, varying))
        parts += [text for text in tables if text]
    return "\n\n".join(parts) + "\n"


# ---------------------------------------------------------------------------- plots

def row_label(config, varying):
    devices = f"{devices_text(config)} {unit_of(config) if config.world_size == 1 else units_of(config)}"
    batch = (f"{config.batch_size_per_device} img/{unit_of(config)}" if config.batch_mode == "per_device"
             else f"global batch {config.global_batch_size:,}")
    return f"{config.benchmark} · {strategy_text(config, varying)} · {devices} · {batch}"


def slug(text):
    """A file name for a setup's title; a long title is cut and keeps a short hash of the whole, so that two
    setups that differ only at the end do not share a file."""
    name = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return name if len(name) <= 90 else f"{name[:81]}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def write_plots(runs, directory):
    """Throughput against GPU count, step-time distributions and peak memory, one PNG of each per setup."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plots needs matplotlib: pip install matplotlib (or pip install -e '.[report]')")
    matplotlib.use("Agg")  # headless: no display on a cluster or in CI
    import matplotlib.pyplot as plt

    directory = pathlib.Path(directory)
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"--plots {directory} is a file, not a folder")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--plots {directory}: cannot be written ({error.strerror})")
    rows, varying = aggregate(runs), varying_options(runs)
    setups = rows_by_setup(rows)
    written, notes = [], []
    for setup in sorted(setups, key=order):
        setup_rows, title, name = setups[setup], setup_title(setup), slug(setup_title(setup))
        for kind, plot in (("scaling", plot_scaling), ("step_times", plot_step_times), ("memory", plot_memory)):
            figure = plot(plt, setup_rows, varying, title)
            if figure is None:
                notes.append(f"no {kind.replace('_', ' ')} plot for {title}: nothing to show "
                             f"({'no GPU memory counters' if kind == 'memory' else 'no comparable runs'})")
                continue
            path = directory / f"{kind}-{name}.png"
            try:
                figure.savefig(path, dpi=120, bbox_inches="tight", metadata={"Software": None})
            except OSError as error:
                raise UsageError(f"--plots {directory}: cannot be written ({error.strerror})")
            finally:
                plt.close(figure)
            written.append(path)
    return written, notes


def tick_text(value, _position):
    return f"{value:,.0f}" if abs(value) >= 10 or value == 0 else f"{value:g}"


def plot_scaling(plt, rows, varying, title):
    panels = [(mode, series) for mode, series in (("per_device", scaling_series(rows, "per_device")),
                                                  ("global", scaling_series(rows, "global"))) if series]
    if not panels:
        return None
    unit, units = unit_of(rows[0]["config"]), units_of(rows[0]["config"])
    figure, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False,
                                layout="constrained")
    for axis, (mode, series_list) in zip(axes[0], panels):
        counts = set()
        for index, series in enumerate(series_list):
            color = plt.cm.tab10(index % 10)
            sizes = [row["config"].world_size for row in series]
            rates = [row["images_per_second"] for row in series]
            counts.update(sizes)
            base = series[0]
            config = base["config"]
            batch = (f"{config.batch_size_per_device} img/{unit}" if mode == "per_device"
                     else f"global batch {config.global_batch_size:,}")
            axis.plot(sizes, rates, "o-", color=color,
                      label=f"{config.benchmark} · {strategy_text(config, varying)} · {batch}")
            ideal = [base["images_per_second"] * size / config.world_size for size in sizes]
            # One legend entry says what every dashed line is.
            axis.plot(sizes, ideal, "--", color=color, alpha=0.6,
                      label=f"ideal: linear from the fewest {units} (dashed, same colour)" if index == 0 else None)
        axis.set_xticks(sorted(counts))
        axis.set_xlabel(f"{units[0].upper()}{units[1:]} (world size)")
        axis.set_ylabel("Throughput (images/s, all ranks)")
        axis.set_ylim(bottom=0)
        axis.yaxis.set_major_formatter(plt.FuncFormatter(tick_text))
        axis.grid(alpha=0.3)
        axis.set_title("Weak scaling (fixed batch per device)" if mode == "per_device"
                       else "Strong scaling (fixed global batch)", fontsize=10)
        axis.legend(fontsize=7, loc="upper left")
    figure.suptitle(f"Throughput against {unit} count\n{title}", fontsize=10)
    return figure


def plot_step_times(plt, rows, varying, title):
    shown = [row for row in rows if row["status"] == "ok" and row["step_times_ms"]]
    if not shown:
        return None
    figure, axis = plt.subplots(figsize=(9, 1.6 + 0.45 * len(shown)), layout="constrained")
    # Top to bottom in table order.
    import matplotlib
    # Matplotlib 3.10 replaced vert=False by orientation="horizontal" (and 3.11 warns about the old name).
    sideways = ({"orientation": "horizontal"} if tuple(map(int, matplotlib.__version__.split(".")[:2])) >= (3, 10)
                else {"vert": False})
    axis.boxplot([row["step_times_ms"] for row in reversed(shown)], **sideways, showmeans=True,
                 meanprops={"marker": "^", "markerfacecolor": "white", "markeredgecolor": "black"},
                 medianprops={"color": "tab:orange"}, flierprops={"marker": ".", "markersize": 3})
    axis.set_yticks(range(1, len(shown) + 1),
                    [f"{row_label(row['config'], varying)} (n={len(row['step_times_ms'])})" for row in reversed(shown)],
                    fontsize=8)
    axis.set_xlabel("Step time (ms), every timed step of every rank and repeat")
    medians = [statistics.median(row["step_times_ms"]) for row in shown]
    if max(medians) > 5 * min(medians):  # strong scaling spans N-fold step times: keep every box readable
        axis.set_xscale("log")
        everything = [t for row in shown for t in row["step_times_ms"] if t > 0]
        narrow = max(everything) < 10 * min(everything)  # within a decade: finer labelled ticks
        axis.xaxis.set_major_locator(plt.LogLocator(subs=(1, 1.5, 2, 3, 5, 7) if narrow else (1, 2, 5)))
        axis.xaxis.set_minor_formatter(plt.NullFormatter())
    else:
        axis.set_xlim(left=0)
    axis.grid(axis="x", alpha=0.3)
    axis.plot([], [], color="tab:orange", label="median")
    axis.plot([], [], "^", markerfacecolor="white", markeredgecolor="black", label="mean")
    axis.xaxis.set_major_formatter(plt.FuncFormatter(tick_text))
    figure.legend(fontsize=8, loc="outside lower center", ncols=2)
    axis.set_title(f"Per-step time distributions (box: quartiles, whiskers: 1.5 × IQR)\n{title}", fontsize=10)
    return figure


def plot_memory(plt, rows, varying, title):
    measured = [row for row in rows if row["status"] == "ok" and row["memory"]]
    if not measured:
        return None
    # Failed runs keep their place with their status instead of a bar: "ddp runs out of memory" is a result.
    shown = [row for row in rows if row in measured or row["status"] != "ok"][::-1]  # top to bottom
    figure, axis = plt.subplots(figsize=(9, 1.8 + 0.45 * len(shown)), layout="constrained")
    positions = list(range(len(shown)))
    reserved = [peak_mib(row, reserved=True) or 0 if row["status"] == "ok" else 0 for row in shown]
    allocated = [peak_mib(row) if row["status"] == "ok" else 0 for row in shown]
    axis.barh(positions, reserved, height=0.7, color="tab:blue", alpha=0.3, label="peak reserved (caching allocator)")
    bars = axis.barh(positions, allocated, height=0.45, color="tab:blue", label="peak allocated")
    axis.bar_label(bars, labels=[f"{value:,.0f}" if row["status"] == "ok" else f"✗ {row['status']}"
                                 for value, row in zip(allocated, shown)], padding=3, fontsize=7)
    # Each bar names its memory window where the bars mix them.
    windows = {common_window(row) for row in measured}
    axis.set_yticks(positions, [row_label(row["config"], varying) + (f" · {common_window(row)}" if len(windows) > 1
                                                                      and row in measured else "")
                                for row in shown], fontsize=8)
    axis.set_xlabel("Peak memory per rank (MiB, largest over the ranks" +
                    (f"; {next(iter(windows))})" if len(windows) == 1 else ")"))
    axis.set_xlim(0, max(reserved + allocated) * 1.15)
    axis.xaxis.set_major_formatter(plt.FuncFormatter(tick_text))
    axis.grid(axis="x", alpha=0.3)
    figure.legend(fontsize=8, loc="outside lower center", ncols=2)
    axis.set_title(f"Peak GPU memory per strategy\n{title}", fontsize=10)
    return figure


# ---------------------------------------------------------------------------- regression check

def parse_tolerance(text):
    text = text.strip()
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise UsageError(f"--tolerance {text!r}: write a percentage (5%) or a fraction (0.05)")
    if not 0 <= value < 1 or not math.isfinite(value):
        raise UsageError(f"--tolerance {text!r} must lie between 0 and 100 %: write 5% or 0.05")
    return value


def same_configuration(current, reference):
    """Equal configurations, software versions aside; options only one side records are not compared
    (a newer script may record more)."""
    return (current._replace(torch=None, options=None) == reference._replace(torch=None, options=None)
            and options_agree(current, reference))


def describe(config):
    return (f"{config.benchmark} {strategy_text(config, {})} on {devices_text(config)} × {config.device_name}, "
            f"{config.batch_size_per_device} img/{unit_of(config)} ({config.batch_mode.replace('_', ' ')}), "
            f"{config.image_size} px, {config.precision}")


def check_against(runs, reference_runs, tolerance, reference_path):
    """Returns (exit code, lines to print)."""
    references = [row for row in aggregate(reference_runs) if row["status"] == "ok"]
    if not references:
        raise UsageError(f"--check-against {reference_path}: no result with status ok to compare with")
    violations, checked, unmatched, lines = [], 0, [], []
    for run in sorted(runs, key=lambda run: str(run["path"])):
        name = display_path(run["path"], pathlib.Path.cwd())
        if run["status"] != "ok":
            violations.append(f"{name}: status {run['status']}: {run['failure'] or 'no message'}")
            continue
        # Of references that differ only in their torch version, the run's own version where there is one.
        reference = min((row for row in references if same_configuration(run["config"], row["config"])),
                        key=lambda row: row["config"].torch != run["config"].torch, default=None)
        if reference is None:
            unmatched.append(run)
            continue
        checked += 1
        # A drop in a run that found itself unsteady may be noise: the line says so.
        noisy = f" ({NOISY}: {run['noisy_reason'] or 'unsteady'})" if run["noisy"] else ""
        current_rate, reference_rate = run["images_per_second"], reference["images_per_second"]
        drop = 1 - current_rate / reference_rate
        if drop > tolerance:
            violations.append(f"{name}: throughput dropped {drop:.1%} ({format_rate(reference_rate)} -> "
                              f"{format_rate(current_rate)} img/s), more than {tolerance:.1%}: "
                              f"{describe(run['config'])}{noisy}")
        window = run["memory_window"]
        current_mib, reference_mib = run["peak_allocated_mib"], peak_mib(reference, window)
        if current_mib is not None and reference_mib:
            rise = current_mib / reference_mib - 1
            if rise > tolerance:
                violations.append(f"{name}: peak memory rose {rise:.1%} ({format_mib(reference_mib)} -> "
                                  f"{format_mib(current_mib)} MiB, {window}), more than {tolerance:.1%}: "
                                  f"{describe(run['config'])}{noisy}")
        elif current_mib is not None and reference["memory"]:
            lines.append(f"report.py: note: {name}: peak memory not compared: the memory windows differ (here: "
                         f"{window}; reference: {' and '.join(reference['memory'])})")
    # Nothing compared and nothing failed: the reference is for other configurations, a mistake in the call.
    if unmatched and not checked and not violations:
        raise UsageError(f"incomparable: no result in {reference_path} has the configuration of "
                         f"{describe(unmatched[0]['config'])} (the reference holds "
                         f"{'; '.join(sorted({describe(row['config']) for row in references}))})")
    for run in unmatched:
        lines.append(f"report.py: warning: {display_path(run['path'], pathlib.Path.cwd())}: no reference result "
                     f"with its configuration, not checked: {describe(run['config'])}")
    if violations:
        lines += [f"REGRESSION {line}" for line in violations]
        lines.append(f"check failed: {len(violations)} violation{'s' * (len(violations) > 1)} against "
                     f"{reference_path} (tolerance {tolerance:.1%})")
        return EXIT_FAILED, lines
    lines.append(f"check passed: {checked} result{'s' * (checked != 1)} within {tolerance:.1%} of "
                 f"{reference_path} (throughput, and peak memory over the same steps; {len(unmatched)} without a "
                 "reference)")
    return EXIT_OK, lines


# ---------------------------------------------------------------------------- Markdown file

def markdown_document(runs, out, inputs):
    """The report as a Markdown file at out: paths relative to the repository when out lies in it (else to out's
    folder), so that the file is the same wherever the command runs, and a first line that says how to remake it."""
    out = pathlib.Path(out).resolve()
    base = REPOSITORY if out.is_relative_to(REPOSITORY) else out.parent
    command = " ".join(["python report.py", *[display_path(pathlib.Path(p), base) for p in inputs],
                        "--markdown", display_path(out, base)])
    return (f"# Benchmark results\n\n<!-- generated by `{command}`: edit the results, not this file -->\n\n"
            f"{render_markdown(runs, base, heading='##')}"), command


# ---------------------------------------------------------------------------- command line

def parse_arguments(argv=None):
    parser = OneLineArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", metavar="PATH", help="result files or folders (searched recursively)")
    parser.add_argument("--markdown", metavar="OUT.md", help="write the Markdown report to this file, its paths "
                                                             "relative to the repository (to the file's folder outside "
                                                             "it); default: stdout")
    parser.add_argument("--plots", metavar="DIR", help="write PNG plots into this folder (needs matplotlib)")
    parser.add_argument("--check-against", metavar="REF", help="reference result file or folder: exit 1 on a "
                                                               "regression")
    parser.add_argument("--tolerance", help="allowed throughput drop and memory rise, 5%% or 0.05 (default 5%%)")
    parser.add_argument("--check-markdown", metavar="FILE.md", help="exit 1 when this file differs from what "
                                                                   "--markdown would write there")
    args = parser.parse_args(argv)
    if args.tolerance is not None and not args.check_against:
        raise UsageError("--tolerance needs --check-against")
    args.tolerance = parse_tolerance("5%" if args.tolerance is None else args.tolerance)
    return args


def main(argv=None):
    args = parse_arguments(argv)
    runs = load_runs(args.paths)
    file_mode = args.markdown or args.check_markdown
    # A Markdown file may say that there are no results yet; every other use needs some.
    if not runs and not file_mode:
        raise UsageError(f"no result files in {', '.join(args.paths)}")
    status = EXIT_OK
    checked = None
    if args.check_against:  # an unusable reference ends the run before anything is written
        reference_runs = load_runs([args.check_against], what="reference")
        if not reference_runs:
            raise UsageError(f"--check-against {args.check_against}: no result files")
        checked = check_against(runs, reference_runs, args.tolerance, args.check_against)
    if args.check_markdown:
        try:
            old = pathlib.Path(args.check_markdown).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise UsageError(f"--check-markdown {args.check_markdown}: cannot be read "
                             f"({getattr(error, 'strerror', None) or error})")
        new, command = markdown_document(runs, args.check_markdown, args.paths)
        if new != old:
            print(f"{args.check_markdown}: differs from the report of {' '.join(args.paths)}: run {command}",
                  file=sys.stderr)
            status = EXIT_FAILED
        else:
            print(f"{args.check_markdown}: agrees with the report of {' '.join(args.paths)}")
    if args.markdown:
        text, _ = markdown_document(runs, args.markdown, args.paths)
        try:
            pathlib.Path(args.markdown).write_text(text, encoding="utf-8")
        except OSError as error:
            raise UsageError(f"--markdown {args.markdown}: cannot be written ({error.strerror})")
        print(f"wrote {args.markdown}")
    if args.plots:
        written, notes = write_plots(runs, args.plots)
        for note in notes:
            print(f"report.py: note: {note}", file=sys.stderr)
        for path in written:
            print(f"wrote {path}")
    if checked is not None:
        code, lines = checked
        for line in lines:
            print(line, file=sys.stderr if line.startswith("report.py:") else sys.stdout)
        status = max(status, code)
    if not (file_mode or args.plots or args.check_against):
        print(render_markdown(runs, pathlib.Path.cwd(), heading="##"), end="")
    return status


def run_cli(main, program):
    """Run a command-line main(): its exit code, or bad input as one line and exit 2 (report.py and the tools
    that read results with it)."""
    try:
        sys.exit(main())
    except UsageError as error:
        print(f"{program}: error: {error}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


if __name__ == "__main__":
    run_cli(main, "report.py")
