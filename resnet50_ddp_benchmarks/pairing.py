"""Result files as runs: their configuration, the pairing rules that say which runs may be divided by which,
and the grouping of repeats into rows. report.py's tables, plots, regression check and generated answers read the
results through this module (report.py's docstring states the rules in words)."""
import ast
import functools
import json
import statistics
from collections import defaultdict, namedtuple

from resnet50_ddp_benchmarks.analysis import REPOSITORY, build_of, devices_of, machine_of, read_inputs, same_build

NATIVE, LIGHTNING, OSS = "ddp_resnet50.py", "lightning/ddp_resnet50.py", "oss_benchmark.py"
# oss_benchmark.py's strategies from the plainest to the most sharded; others follow alphabetically.
SHARDING_ORDER = ("ddp", "oss_ddp", "oss_sharded_ddp", "zero1", "zero1_overlap", "fsdp_zero2", "fsdp_zero3")
# The memory window of the scripts that took peak memory over the timed steps only (the migrated version-1 results).
TIMED_STEPS = "timed steps"
ACROSS_MACHINES = "across machines"
ACROSS_BUILDS = "across commits/software"
# Options of DDP and of Lightning's DDP strategy: the native script and its twin build no DDP on one rank (and the
# twin's variants differ only in DDP's stream and a broadcast between ranks), so on one rank they change nothing.
DDP_OPTIONS = ("bucket_cap_mb", "gradient_as_bucket_view", "broadcast_buffers", "static_graph", "comm_hook",
               "compiled_ddp", "lightning_variant", "lightning_ddp_side_stream", "lightning_sigterm_sync")
# oss_benchmark.py options that only some strategies use: for the others they change nothing that is measured.
STRATEGY_OPTIONS = {"fsdp_units": ("fsdp_zero2", "fsdp_zero3"), "fsdp_param_dtype": ("fsdp_zero2", "fsdp_zero3"),
                    "sharded_reduce_buffer": ("oss_sharded_ddp",)}
TORCH_CUDNN_BENCHMARK_LIMIT = 10  # torch.backends.cudnn.benchmark_limit's default (seen in torch 2.11 and 2.14)
SETUP_FIELDS = ("device", "device_name", "torch", "model", "image_size", "precision", "memory_format",
                "compile_mode", "optimizer")
RUN_FIELDS = ("benchmark", "strategy", "options", "num_nodes", "world_size", "batch_mode",
              "batch_size_per_device", "global_batch_size")
Config = namedtuple("Config", SETUP_FIELDS + RUN_FIELDS)
# Options that a result carries only when they were given: their absence is the default, not worth a word.
ABSENT_BY_DEFAULT = {"inductor_environment", "nccl_environment"}
# NCCL variables that do not tune a run: the machine's settings (NVLink multicast off where the machines are lent,
# the container's NCCL version), logging, and the error handling the scripts set for CUDA graphs themselves.
MACHINE_NCCL_VARIABLES = {"NCCL_NVLS_ENABLE", "NCCL_VERSION", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS",
                          "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
# Config entries that are keyed above, follow from a keyed one, or do not change what is measured;
# every other entry of a result's config is a script-specific option and part of the configuration.
NOT_OPTIONS = {"benchmark", "strategy", "device", "backend", "model", "image_size", "batch_mode",
               "batch_size_per_device", "global_batch_size", "warmup_steps", "steps", "precision_requested",
               "precision", "grad_scaler", "tf32", "memory_format_requested", "memory_format", "compile",
               "compile_mode", "optimizer", "lr", "seed", "timeout_s", "timeout", "output", "overwrite",
               "inject_fault", "inject_fault_rank", "inject_fault_step",
               # how the timed steps are summarised, or what runs after them (the collective probe), not how they run
               "steps_per_epoch", "collective_probe",
               # CPU runs: the cores shared out over the ranks, so it follows the world size.
               "cpu_threads_per_rank",
               # Lightning: its devices per node and nodes (the world), its precision name, its version.
               "devices", "num_nodes", "trainer_precision", "lightning",
               # oss_benchmark.py: the passes after the timed steps, the launch's other strategies, the
               # optimizer's arguments (lr and momentum, recorded on their own) and its state size (follows
               # from the optimizer and momentum).
               "optimizer_state_tensors_per_parameter",
               "phase_steps", "profile_steps", "trace_dir", "strategies_in_launch", "optimizer_kwargs"}


# ---------------------------------------------------------------------------- runs

def config_of(result):
    """The result's config as the tables compare it: a null cuDNN autotuning limit is PyTorch's default where cuDNN
    autotuned; the TORCHINDUCTOR_ variables the run was given (its cache folder aside) are inductor_environment,
    since they change what Inductor generates; NCCL's tuning variables (the machine's own settings and logging
    aside) are nccl_environment, since they change how the gradients travel."""
    config, environment = dict(result["config"]), (result.get("software") or {}).get("environment") or {}
    if config.get("cudnn_benchmark_limit") is None:
        config["cudnn_benchmark_limit"] = TORCH_CUDNN_BENCHMARK_LIMIT if config.get("cudnn_benchmark") else None
    inductor = {name: value for name, value in environment.items() if name.startswith("TORCHINDUCTOR_")
                and name not in ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING")}
    nccl = {name: value for name, value in environment.items()
            if name.startswith(("NCCL_", "TORCH_NCCL_")) and name not in MACHINE_NCCL_VARIABLES}
    if inductor:
        config["inductor_environment"] = inductor
    if nccl:
        config["nccl_environment"] = nccl
    return config


def device_name_of(result):
    machine = machine_of(result)
    if result["config"]["device"] == "cpu":
        return f"CPU ({machine['cpu']})" if machine["cpu"] else None
    return " + ".join(machine["gpu_names"]) or None  # None: the run failed before it looked at its hardware


def options_of(config, key):
    """Script-specific settings that change what the run of key (its Config, these aside) measures (applies), as a
    hashable, sorted tuple of (name, JSON text)."""
    return tuple(sorted((name, json.dumps(value, sort_keys=True)) for name, value in config.items()
                        if name not in NOT_OPTIONS and applies(name, key)))


def stability_of(result):
    stability = result["stability"]
    if not stability:
        return "unknown"
    return "noisy" if stability.get("noisy") else "steady"


def make_run(path, result):
    """The figures of one result that the tables use."""
    world, config = result["world"], config_of(result)
    throughput = result.get("throughput") or {}
    memory = result.get("memory") or {}
    efficiency = result.get("efficiency") or {}
    software = result.get("software") or {}
    key = Config(device=config["device"], device_name=device_name_of(result), torch=software.get("torch"),
                 model=config.get("model") or "resnet50", image_size=config["image_size"],
                 precision=config["precision"], memory_format=config["memory_format"],
                 compile_mode=config.get("compile_mode"), optimizer=config["optimizer"], benchmark=result["benchmark"],
                 strategy=result["strategy"], options=(),
                 num_nodes=world["num_nodes"], world_size=world["world_size"], batch_mode=config["batch_mode"],
                 batch_size_per_device=config["batch_size_per_device"], global_batch_size=config["global_batch_size"])
    key = key._replace(options=options_of(config, key))
    stability = stability_of(result)
    return {"path": path, "config": key, "status": result["status"],
            "failure": (result.get("failure") or {}).get("message"),
            "images_per_second": throughput.get("images_per_second"),
            "rank0_median": throughput.get("rank0_median_images_per_second"),
            "rank0_mad": throughput.get("rank0_mad_images_per_second"),
            "epochs": throughput.get("rank0_epochs"),
            "peak_allocated_mib": memory.get("peak_allocated_mib"),
            "peak_reserved_mib": memory.get("peak_reserved_mib"),
            "memory_window": window_label(memory.get("window")),
            "stability": stability, "noisy": stability == "noisy",
            "noisy_reason": (result["stability"] or {}).get("reason"),
            # MFU needs a peak to divide by: none on the CPU or on a GPU the scripts have no datasheet figure for
            "mfu": efficiency.get("mfu") if efficiency.get("peak_tflops_per_device") else None,
            "step_times_ms": [t for times in result.get("step_times_ms_per_rank") or [] for t in times],
            "launch_id": result["launch_id"], "devices": devices_of(result),
            "dirty": bool((result.get("git") or {}).get("dirty")),
            **build_of(result),
            "analysis": result.get("analysis"), "machine": None}


def window_label(window):
    """A memory window in a few words: the recorded text up to its parenthesis."""
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


def assign_machines(runs):
    """Each run's machine: devices that ran together in one result belong to one machine, so that a one-GPU run
    on either GPU of a two-GPU machine counts as that machine. Named by its smallest device id."""
    parent = {}

    def root(device):
        while parent.setdefault(device, device) != device:
            device = parent[device]
        return device

    for run in runs:
        roots = sorted({root(device) for device in run["devices"]})
        for other in roots[1:]:
            parent[other] = roots[0]
    for run in runs:
        run["machine"] = root(min(run["devices"])) if run["devices"] else None
    return runs


def load_documents(paths, what="input"):
    """(runs, comparisons): every readable result under paths as a run, and every compare.py comparison."""
    results, comparisons = read_inputs(paths, "report.py", what)
    runs = [make_run(path, result) for path, result in results]
    return assign_machines(name_unknown_gpus(runs)), comparisons


# ---------------------------------------------------------------------------- pairing rules

def unlike(run, base, scaling=False):
    """None where run may be divided by base (like for like), else why not, in words. Same machine: the same
    devices; for scaling, base's devices among run's."""
    if scaling:
        same_machine = bool(base["devices"]) and base["devices"] <= run["devices"]
    else:
        same_machine = bool(run["devices"]) and run["devices"] == base["devices"]
    if not same_machine:
        return ACROSS_MACHINES
    return None if same_build(run, base) else ACROSS_BUILDS


def rate(run):
    return run["images_per_second"]


Paired = namedtuple("Paired", "values runs label")  # ratios of like-for-like pairs and their numerator runs


def paired_ratios(numerators, denominators, value=rate):
    """Each numerator run over the median of its like-for-like denominator runs. Without any such pair, the label
    says why (across commits/software where some pair shared the machine)."""
    values, runs, reasons = [], [], set()
    for run in numerators:
        partners = [base for base in denominators if unlike(run, base) is None]
        if partners:
            values.append(value(run) / statistics.median(value(base) for base in partners))
            runs.append(run)
        reasons.update(unlike(run, base) for base in denominators)
    label = None if values else ACROSS_BUILDS if ACROSS_BUILDS in reasons else ACROSS_MACHINES
    return Paired(values, runs, label)


def scaling_base(run, base_runs):
    """Throughput of the series' base on run's own devices, with its build: the mean over the base's device sets
    of the median over the repeats on each set; None where the base runs do not cover run's devices."""
    partners = [base for base in base_runs if unlike(run, base, scaling=True) is None]
    by_devices = defaultdict(list)
    for base in partners:
        by_devices[base["devices"]].append(rate(base))
    if not partners or frozenset().union(*by_devices) != run["devices"]:
        return None
    return statistics.fmean(statistics.median(rates) for rates in by_devices.values())


def scaling_label(runs, base_runs):
    reasons = {unlike(run, base, scaling=True) for run in runs for base in base_runs}
    return ACROSS_BUILDS if ACROSS_BUILDS in reasons else ACROSS_MACHINES


# ---------------------------------------------------------------------------- grouping

def order(config):
    """A sort key for configurations whose fields may be None."""
    return tuple((True, "") if value is None else (False, value) for value in config)


def aggregate(runs):
    """One row per configuration of ok repeats (medians, the range over the repeats), one row per run that did
    not end ok. Sorted by configuration."""
    repeats, rows = defaultdict(list), []
    for run in runs:
        if run["status"] == "ok":
            repeats[run["config"]].append(run)
        else:
            rows.append(row_of([run], run["status"]))
    for config, members in repeats.items():
        rows.append(row_of(members, "ok"))
    return sorted(rows, key=row_order)


def beyond_ddp(options):
    """The options apart from DDP's: what a scaling series keeps from one GPU count to the next."""
    return tuple(option for option in options if option[0] not in DDP_OPTIONS)


def row_order(row):
    """Setup, then benchmark and strategy, then the scaling series (batch mode, the batch it keeps), then
    the GPU count: a series reads top to bottom. Failed runs after the ok row of their configuration."""
    config = row["config"]
    kept = config.batch_size_per_device if config.batch_mode == "per_device" else config.global_batch_size
    return (order(setup_of(config)), config.benchmark, strategy_rank(config.strategy), beyond_ddp(config.options),
            config.batch_mode, kept, config.world_size, config.num_nodes, order(config), row["status"] != "ok",
            row["status"], [str(run["path"]) for run in row["runs"]])


def median_or_none(values):
    return None if not values or None in values else statistics.median(values)


def row_of(runs, status):
    throughputs = [rate(run) for run in runs]
    known = [value for value in throughputs if value is not None]
    spread = (max(known) - min(known)) / statistics.median(known) if len(known) > 1 else None
    return {"config": runs[0]["config"], "status": status, "runs": sorted(runs, key=lambda run: str(run["path"])),
            "images_per_second": median_or_none(throughputs), "spread": spread,
            "rank0_median": median_or_none([run["rank0_median"] for run in runs]),
            "rank0_mad": median_or_none([run["rank0_mad"] for run in runs]),
            "mfu": median_or_none([run["mfu"] for run in runs]),
            "memory": memory_by_window(runs), "noisy": [run for run in runs if run["noisy"]],
            "unknown_stability": [run for run in runs if run["stability"] == "unknown"],
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


def options_agree(a, b):
    """Options recorded on both sides are equal (a newer script may record more than an older one)."""
    mine, theirs = dict(a.options), dict(b.options)
    return all(mine[name] == theirs[name] for name in mine.keys() & theirs.keys())


def option_labels(configs):
    """{config: the options that tell it apart from the other configurations of its benchmark and strategy}. An
    option whose value differs between them is shown where it is not the usual value: the script's default where
    benchmark_extras.py has one, else the most common value (an option a result does not record reads "unset")."""
    groups = defaultdict(set)
    for config in configs:
        groups[config.benchmark, config.strategy].add(config)
    labels = {}
    for members in groups.values():
        values = defaultdict(list)
        names = {name for other in members for name, _ in other.options}
        for config in sorted(members, key=order):
            options = dict(config.options)
            for name in names:
                if applies(name, config):
                    values[name].append(options.get(name))
        usual = {name: usual_value(name, seen) for name, seen in values.items() if len(set(seen)) > 1}
        for config in members:
            options = dict(config.options)
            labels[config] = [(name, options.get(name)) for name in sorted(usual)
                              if applies(name, config) and options.get(name) != usual[name]]
    return labels


def applies(name, config):
    """Whether an option can change what a configuration measures (DDP's options need two ranks; FSDP's and
    ShardedDDP's options their strategies)."""
    if name in STRATEGY_OPTIONS and config.strategy not in STRATEGY_OPTIONS[name]:
        return False
    return not (name in DDP_OPTIONS and config.world_size == 1 and config.benchmark in (NATIVE, LIGHTNING))


def usual_value(name, seen):
    """The scripts' default where a run used it, else the most common known value (null is unknown)."""
    defaults = {**script_defaults(), "lightning_variant": "stock"}  # the twin's variant without --matched
    if name in defaults and json.dumps(defaults[name]) in seen:
        return json.dumps(defaults[name])
    if name in ABSENT_BY_DEFAULT:
        return None
    known = [value for value in seen if value != "null"] or seen
    return max(sorted(set(known), key=lambda value: (value is not None, value or "")), key=known.count)


@functools.cache
def script_defaults():
    """What benchmark_extras.py's options record when not given: the scripts' EXTRA_DEFAULTS (read from
    ddp_resnet50.py, which imports torch, without importing it)."""
    tree = ast.parse((REPOSITORY / NATIVE).read_text(encoding="utf-8"))
    [value] = [node.value for node in tree.body if isinstance(node, ast.Assign)
               and [getattr(target, "id", None) for target in node.targets] == ["EXTRA_DEFAULTS"]]
    return ast.literal_eval(value)


def scaling_series(rows, batch_mode):
    """Ok rows that differ only in world size (and node count) and DDP's options (which one rank does without):
    weak scaling keeps the batch per device, strong scaling the global batch. Only series with two GPU counts or
    more; the base, the fewest GPUs, first."""
    free = {"world_size": None, "num_nodes": None,
            "global_batch_size" if batch_mode == "per_device" else "batch_size_per_device": None}
    series = defaultdict(list)
    for row in rows:
        if row["status"] == "ok" and row["config"].batch_mode == batch_mode:
            series[row["config"]._replace(options=beyond_ddp(row["config"].options), **free)].append(row)
    return [sorted(members, key=lambda row: (row["config"].world_size, row["config"].num_nodes, order(row["config"])))
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


def launches(runs):
    """oss_benchmark.py runs grouped by launch (failed ones included: an OOM is the point of a sharding table),
    each launch's runs in the order of how much their strategy shards; launches in the order of their setup and
    first file."""
    groups = defaultdict(list)
    for run in runs:
        if run["config"].benchmark == OSS:
            groups[run["launch_id"]].append(run)
    for members in groups.values():
        members.sort(key=lambda run: (strategy_rank(run["config"].strategy), run["status"] != "ok", str(run["path"])))
    return sorted(groups.values(), key=lambda members: (order(setup_of(members[0]["config"])),
                                                        min(str(run["path"]) for run in members)))


def strategy_rank(strategy):
    return (SHARDING_ORDER.index(strategy), "") if strategy in SHARDING_ORDER else (len(SHARDING_ORDER), strategy)
