"""The benchmarks' answers from their result files on one screen; every table, plots, a regression check, documents.

    python report.py                                            # the answers on one screen, from results/
    python report.py runs/sweep/                                # ... from a folder of your own runs
    python report.py results/ --all                             # every table, as Markdown (--markdown report.md)
    python report.py runs/ci.json --check-against results/nvidia-h200-x2-2026-11-30b --tolerance 5%
    python report.py runs/s-*.json --sharding                   # only the sharding tables of oss_benchmark.py
    python report.py --docs                                     # regenerate the documents' generated blocks
    python report.py --check-docs                               # exit 1 when one of them is stale

Inputs are result files or folders, searched recursively for *.json; a file that fails schema/result.schema.json
is skipped with a one-line warning; compare.py's comparison files feed the comparison tables.

A configuration is everything that changes what is measured (device, torch version, model, image size, precision,
memory format, compile mode, optimizer, benchmark, strategy, the script's options, nodes, world size, batch); step
counts, seeds and paths are not. Repeats of a configuration that ended ok are one row: medians, the range over
every repeat, runs and machines (a machine: the devices that ran together). A result that did not end ok gets a
row of its own and stays out of every comparison. "noisy" marks a result that found its own run unsteady, "dirty"
one whose commit had uncommitted changes: a range end from such a run says so.

Pairing rules: a ratio (scaling, Lightning / native, strategy / ddp, option / default) divides only results of the
same devices (for scaling, the base runs cover the larger run's own devices), git commit and software versions.
Each numerator run is divided by the median of its like-for-like denominators, and the range over those runs is
given with their counts. A pair without such a partner is given from the medians, labelled "across machines" or
"across commits/software", and never headlines. Peak memory is compared only over the same steps.

Regression check: each current result against the median of the reference results of its configuration (software
versions aside): a throughput drop or memory rise beyond the tolerance, or a status other than ok, fails (exit 1).

Exit codes: 0 fine, 1 regression or stale block, 2 unusable invocation (one line on stderr).
"""

import hashlib
import json
import math
import os
import pathlib
import re
import statistics
import sys
import textwrap
from collections import defaultdict

from resnet50_ddp_benchmarks.analysis import (EXIT_FAILED, EXIT_OK, MIN_PAIRS, REPOSITORY, OneLineArgumentParser,
    UsageError, check_documents, check_writable, half_width_percent, is_number, run_cli, update_documents,
    write_atomically)
from resnet50_ddp_benchmarks.pairing import (ACROSS_BUILDS, LIGHTNING, NATIVE, NOT_OPTIONS, OSS, RUN_FIELDS, Config,
    aggregate, applies, common_window, launches, lightning_pairs, load_documents, option_labels,
    options_agree, order, paired_ratios, peak_mib, rate, row_of, rows_by_setup, scaling_base, scaling_label,
    scaling_series, script_defaults, setup_of, strategy_rank, unlike)
from resnet50_ddp_benchmarks import scaling

COLLECTIVE_KINDS = ("all-reduce", "reduce", "broadcast", "all-gather", "reduce-scatter", "other")
NO_RESULTS = ("No results committed yet: run the benchmarks on a GPU machine, put the result files under "
              "`results/<machine kind>-<date>/` (see `results/README.md`) and run "
              "`python report.py --docs`.")
NOISY = "noisy: repeat or interleave"
UNKNOWN_STABILITY = "stability unknown"
UNKNOWN_VARIANT = "variant unknown"
NO_PEAK = "—"  # MFU where there is no peak to divide by (the CPU, a GPU without a datasheet figure)
MAX_LINE = 200  # a check line's length at most


# ---------------------------------------------------------------------------- Markdown

def percent_text(value):
    return f"{value * 100:.1f}"


def format_rate(value, like=None):
    """Images per second: thousands separators; decimals only where the numbers are small (CPU runs)."""
    if value is None:
        return "–"
    scale = abs(like if like is not None else value)
    decimals = 0 if scale >= 100 else 1 if scale >= 10 else 2
    return f"{value:,.{decimals}f}"


def format_mib(value):
    return "n/a" if value is None else f"{value:,.0f}"


def format_number(value, digits=0):
    return "–" if value is None else f"{round(value, digits) + 0.0:,.{digits}f}"  # + 0.0: never "-0"


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


def format_percent(fraction):
    return "–" if fraction is None else f"{fraction * 100:.1f} %"


def format_ratio(value):
    return "–" if value is None else f"{value:.2f}×"


def format_mfu(row):
    return NO_PEAK if row["mfu"] is None else format_percent(row["mfu"])


def rank0_cell(row):
    """Rank 0's median throughput ± MAD, as fairscale's table shows it."""
    if row["rank0_median"] is None:
        return "–"
    return f"{format_rate(row['rank0_median'])} ± {format_rate(row['rank0_mad'], like=row['rank0_median'])}"


def range_cell(row):
    """Throughput's range over every repeat, the flags of its ends, and its spread (max − min) / median."""
    if len(row["runs"]) < 2:  # several runs: an ok row, each with its throughput
        return "–"
    values = [rate(run) for run in row["runs"]]
    ends = span(values, row["runs"], lambda value: format_rate(value, like=max(values)))
    return f"{ends} ({format_percent(row['spread'])})"


def format_status(row):
    if row["status"] != "ok":
        return f"**✗ {row['status']}**"
    runs = len(row["runs"])
    if row["noisy"]:
        return f"ok, {NOISY}" if runs == 1 else f"ok, {len(row['noisy'])} of {runs} runs {NOISY}"
    if row["unknown_stability"]:
        unknown = len(row["unknown_stability"])
        return f"ok, {UNKNOWN_STABILITY}" if unknown == runs else f"ok, {UNKNOWN_STABILITY} for {unknown} of {runs}"
    return "ok"


def failure_note(run):
    """A failed run's footnote: status, file and message, cut to a line (an OOM's names every allocator figure)."""
    message = run["failure"] or "no message"
    return f"- ✗ {run['status']} in `{run['path'].name}`: {message if len(message) <= 150 else message[:149] + '…'}"


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


def option_text(name, value):
    if value is None:
        return f"{name} unset"
    if name == "lightning_variant" and value == "null":
        return UNKNOWN_VARIANT
    return f"{name}={value.strip(chr(34))}"


def strategy_text(config, labels):
    details = [option_text(name, value) for name, value in labels.get(config, [])]
    return config.strategy + (f" ({', '.join(details)})" if details else "")


def lightning_variant(config):
    if not applies("lightning_variant", config):
        return "n/a (1 rank)"  # the variants differ only in DDP's stream and a broadcast between ranks
    return json.loads(dict(config.options).get("lightning_variant", "null")) or UNKNOWN_VARIANT


def setup_title(setup):
    config = Config(*setup, *[None] * len(RUN_FIELDS))
    compiled = "eager" if config.compile_mode is None else f"torch.compile {config.compile_mode}"
    return (f"{config.device_name} · torch {config.torch or 'unknown'} · {config.model} · {config.image_size} px · "
            f"{config.precision} · {config.memory_format} · {compiled} · {config.optimizer}")


def table(header, lines):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return "\n".join(out)


def wrap(text):
    """A paragraph cut into lines of at most 120 characters (Markdown joins them again)."""
    return textwrap.fill(text, 120, break_long_words=False, break_on_hyphens=False)


def sources_text(rows, base):
    counts = defaultdict(int)
    for run in [run for row in rows for run in row["runs"]]:
        counts[run["path"].parent.resolve()] += 1
    return wrap("Results from " + ", ".join(f"{link(folder, base, display_path(folder))} ({count} file"
                                            f"{'s' * (count > 1)})" for folder, count in sorted(counts.items())) + ".")


def display_path(path, base=REPOSITORY):
    """Relative to the repository where the path lies in it, else to base where it lies under it."""
    path = pathlib.Path(path).resolve()
    root = next((root for root in (REPOSITORY, pathlib.Path(base).resolve()) if path.is_relative_to(root)), None)
    return (path.relative_to(root).as_posix() or ".") if root else path.as_posix()


def link(path, base, text=None):
    """A Markdown link to path from a document in the folder base, named text (the file's stem by default)."""
    path = pathlib.Path(path).resolve()
    return f"[{text or path.stem}]({os.path.relpath(path, base)}{'/' if path.is_dir() else ''})"


def all_runs_table(rows, labels):
    unit, units = unit_of(rows[0]["config"]), units_of(rows[0]["config"])
    lines, failures, windows = [], [], windows_of(rows)
    for row in rows:
        config = row["config"]
        lines.append([config.benchmark, strategy_text(config, labels), devices_text(config),
                      config.batch_mode.replace("_", " "), str(config.batch_size_per_device),
                      f"{config.global_batch_size:,}", rank0_cell(row), format_rate(row["images_per_second"]),
                      range_cell(row), format_mfu(row), memory_cell(row, len(windows) > 1), counts(row["runs"]),
                      format_status(row)])
        if row["status"] != "ok":
            failures.append(failure_note(row["runs"][0]))
    header = ["benchmark", "strategy", units, "batch mode", f"batch (img/{unit})", "global batch (img)",
              "Median throughput (img/s) (rank 0) ± MAD", "Throughput (img/s)", "range over runs (spread)", "MFU",
              memory_header("Peak memory", windows), "runs", "status"]
    notes = failures + noisy_notes(rows)
    return "\n\n".join(["**All configurations**", table(header, lines), *(["\n".join(notes)] if notes else [])])


def flag(run):
    """A run's caution at a range's end: noisy (unsteady), dirty (its commit does not name the code that ran)."""
    marks = [word for word, on in (("noisy", run["noisy"]), ("dirty", run["dirty"])) if on]
    return f" ({', '.join(marks)})" if marks else ""


def span(values, runs, text):
    """low–high of values through text, each end with its run's flag: '7,926 (noisy)–8,115'."""
    low, high = min(range(len(values)), key=values.__getitem__), max(range(len(values)), key=values.__getitem__)
    ends = text(values[low]) + flag(runs[low]), text(values[high]) + flag(runs[high])
    return ends[0] if ends[0] == ends[1] else f"{ends[0]}–{ends[1]}"


def counts(runs, unpaired=0, what="run"):
    machines = len({run["machine"] for run in runs} - {None})
    alone = f", {unpaired} unpaired" if unpaired else ""
    return f"{len(runs)} {what}{'s' * (len(runs) != 1)}, {machines} machine{'s' * (machines != 1)}{alone}"


def rates_text(runs):
    """'4,692–4,751 (dirty) img/s (56 runs, 19 machines)': every run's img/s, the flags of the range's ends."""
    if not runs:
        return "not measured"
    values = [rate(run) for run in runs]
    return f"{span(values, runs, lambda value: format_rate(value, like=max(values)))} img/s ({counts(runs)})"


def both(a, b):
    """The flags of a ratio: noisy or dirty where either side is."""
    return {"noisy": a["noisy"] or b["noisy"], "dirty": a["dirty"] or b["dirty"]}


def ratio_of(numerators, denominators):
    """B / A under the pairing rules: the range over B's like-for-like runs with their counts, else the medians'
    ratio labelled (never a headline)."""
    if not numerators or not denominators:
        return "not measured"
    paired = paired_ratios(numerators, denominators)
    if not paired.values:
        median = statistics.median(map(rate, numerators)) / statistics.median(map(rate, denominators))
        return f"{median:.3f}, {paired.label}"
    ends = [both(run, next(base for base in denominators if unlike(run, base) is None)) for run in paired.runs]
    return f"{span(paired.values, ends, '{:.3f}'.format)} ({counts(paired.runs, len(numerators) - len(paired.runs))})"


def scaling_of(runs, base_runs):
    """Scaling efficiency of each run against base runs on its own GPUs, commit and software, as a range."""
    if not runs or not base_runs:
        return "not measured"
    base_count = min(run["config"].world_size for run in base_runs)
    paired = [(run, rate(run) / base / (run["config"].world_size / base_count)) for run in runs
              for base in [scaling_base(run, base_runs)] if base is not None]
    if not paired:  # from the medians, labelled: never a headline
        efficiency = statistics.median(map(rate, runs)) / statistics.median(map(rate, base_runs)) / (
            runs[0]["config"].world_size / base_count)
        return f"{percent_text(efficiency)} % {scaling_label(runs, base_runs)}"
    chosen = [run for run, _ in paired]
    return f"{span([value for _, value in paired], chosen, percent_text)} % ({counts(chosen, len(runs) - len(chosen))})"


def scaling_table(rows, labels, batch_mode):
    """Weak (per_device) or strong (global) scaling. Against the fewest GPUs of each series (N_base):
    ideal speed-up = N / N_base, efficiency = T(N) / (N / N_base x T(N_base))."""
    unit, units, lines = unit_of(rows[0]["config"]), units_of(rows[0]["config"]), []
    weak = batch_mode == "per_device"
    for series in scaling_series(rows, batch_mode):
        base = series[0]
        for row in series:
            config = row["config"]
            efficiency = "100.0 %" if row is base else scaling_of(row["runs"], base["runs"])
            ideal = config.world_size / base["config"].world_size
            per_device, global_batch = str(config.batch_size_per_device), f"{config.global_batch_size:,}"
            lines.append([config.benchmark, strategy_text(config, labels),
                          per_device if weak else global_batch, devices_text(config),
                          global_batch if weak else per_device, format_rate(row["images_per_second"]),
                          format_rate(row["images_per_second"] / config.world_size), format_ratio(ideal),
                          efficiency])
    if not lines:
        return None
    batches = [f"batch (img/{unit})", "global batch (img)"]
    header = ["benchmark", "strategy", batches[not weak], units, batches[weak], "Throughput (img/s)",
              f"Throughput per {unit} (img/s)", "Ideal speed-up", "Scaling efficiency"]
    kind = f"**Weak scaling** (fixed batch per {unit}" if weak else "**Strong scaling** (fixed global batch"
    return "\n\n".join([wrap(f"{kind}; efficiency = throughput(N) / (N / N_base × throughput(N_base)), N_base the "
                             f"fewest {units} of the series; each run against base runs on its own {units})"),
                        table(header, lines)])


def lightning_table(rows, labels):
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
        lines.append([devices_text(config), config.batch_mode.replace("_", " "), str(config.batch_size_per_device),
                      strategy_text(native["config"], labels), format_rate(native["images_per_second"]),
                      strategy_text(config, labels), lightning_variant(config),
                      format_rate(lightning["images_per_second"]),
                      ratio_of(lightning["runs"], native["runs"]),
                      memory_cell(native, named, window), memory_cell(lightning, named, window),
                      format_ratio(memory_ratio)])
    if not lines:
        return None
    header = [units, "batch mode", f"batch (img/{unit})", "native strategy", "native throughput (img/s)",
              "Lightning strategy", "Lightning variant", "Lightning throughput (img/s)",
              "Lightning / native throughput", memory_header("native peak memory", windows if not named else ()),
              memory_header("Lightning peak memory", windows if not named else ()), "Lightning / native memory"]
    return "\n\n".join([wrap("**Lightning against native DDP** (same configuration; each Lightning run against the "
                             "native runs of its machine, commit and software; a ratio below 1.000 is Lightning's "
                             "cost)"), table(header, lines)])


# ---------------------------------------------------------------------------- sharding tables

PHASES = ("parameter_sync_before_forward", "forward", "backward", "optimizer_step", "parameter_sync")
MIB = 2 ** 20


def phase_ms(analysis):
    """{phase: rank 0's median ms} of the instrumented pass (None where a phase was not timed)."""
    phases = (analysis or {}).get("phases_ms") or {}
    return {name: (phases.get(name) or {}).get("median") for name in PHASES}


def collectives_cells(analysis):
    """(collectives per step by kind, MiB per step measured (analytic)) of the profiled pass."""
    collectives = (analysis or {}).get("collectives") or {}
    measured, analytic = collectives.get("measured_per_step") or {}, collectives.get("analytic_bytes_per_step")
    kinds = ", ".join(f"{measured[kind]['count']:g} {kind}" for kind in COLLECTIVE_KINDS if kind in measured)
    mib = sum(value["bytes"] for value in measured.values()) / MIB if collectives else None
    expected = sum(analytic.values()) / MIB if analytic else None
    return kinds or "–", "–" if mib is None else f"{format_number(mib, 1)} ({format_number(expected, 1)})"


def state_cells(analysis):
    """(optimizer state MiB per rank, the largest rank's; expected state saving MiB against ddp)."""
    memory = (analysis or {}).get("memory") or {}
    held = memory.get("optimizer_state_bytes_per_rank")
    saving = memory.get("expected_optimizer_state_saving_bytes_vs_ddp")
    return (format_number(max(held) / MIB if held else None, 1),
            format_number(saving / MIB if saving is not None else None, 1))


def epochs_cell(run):
    """fairscale's statistic: images per second per epoch of rank 0, median ± MAD (epochs × steps)."""
    epochs = run["epochs"] or {}
    if not epochs.get("count") or epochs.get("median") is None:
        return "–"
    return (f"{format_rate(epochs['median'])} ± {format_rate(epochs['mad'], like=epochs['median'])} "
            f"({epochs['count']} × {epochs['steps_per_epoch']})")


def versus_ddp(run, baseline):
    """Rank 0's median against the ddp run of the same launch (like for like), as oss_benchmark.py printed it."""
    if baseline is None or run["status"] != "ok" or not run["rank0_median"]:
        return "–"
    relative = format_percent(run["rank0_median"] / baseline["rank0_median"])
    label = unlike(run, baseline)
    return relative if label is None else f"{relative} {label}"


def peak_saving(run, baseline):
    """Peak memory saved against the launch's ddp run, over the window both measured."""
    if baseline is None or run["status"] != "ok" or run["peak_allocated_mib"] is None:
        return "–"
    if baseline["peak_allocated_mib"] is None:
        return "n/a"
    if run["memory_window"] != baseline["memory_window"]:
        return "– (other memory window)"
    difference = baseline["peak_allocated_mib"] - run["peak_allocated_mib"]
    difference = difference if round(difference) else 0.0  # under half a MiB is none, not "-0"
    return f"{difference:,.0f} ({format_percent(difference / baseline['peak_allocated_mib'])})"


def strategy_cell(run):
    config = run["config"]
    unsharded = " unsharded (1 rank)" if config.world_size == 1 and config.strategy != "ddp" else ""
    return config.strategy + unsharded


def sharding_line(run, baseline, with_epochs, named_window):
    phases = phase_ms(run["analysis"])
    syncs = [phases[name] for name in ("parameter_sync", "parameter_sync_before_forward") if phases[name] is not None]
    kinds, volume = collectives_cells(run["analysis"])
    state, expected = state_cells(run["analysis"])
    row = row_of([run], run["status"])
    memory = memory_cell(row, named_window)
    return ([strategy_cell(run), rank0_cell(row)] + ([epochs_cell(run)] if with_epochs else [])
            + [format_rate(rate(run)), versus_ddp(run, baseline),
               format_number(phases["forward"], 2), format_number(phases["backward"], 2),
               format_number(phases["optimizer_step"], 2), format_number(sum(syncs) if syncs else None, 2),
               format_number((run["analysis"] or {}).get("host_phase_sum_ms_median"), 2), kinds, volume, state,
               expected, memory, peak_saving(run, baseline), format_status(row)])


def launch_title(members, base):
    """The launch's files as one pattern, and what it ran: e.g. `results/x/s-*` · 2 GPUs, 256 img/GPU."""
    paths = sorted(display_path(run["path"], base) for run in members)
    prefix = os.path.commonprefix(paths)
    pattern = paths[0] if len(paths) == 1 else (prefix.rstrip("-_") + "-*" if prefix.endswith(("-", "_")) else
                                                 prefix + "*")
    config = members[0]["config"]
    devices = f"{devices_text(config)} {unit_of(config) if config.world_size == 1 else units_of(config)}"
    return f"`{pattern}` · {devices}, {config.batch_size_per_device} img/{unit_of(config)}"


def sharding_table(members, base):
    """One oss_benchmark.py launch: every strategy against the ddp run of that launch."""
    baseline = next((run for run in members if run["config"].strategy == "ddp" and run["status"] == "ok"), None)
    with_epochs = any((run["epochs"] or {}).get("count") for run in members)
    windows = {run["memory_window"] for run in members if run["peak_allocated_mib"] is not None}
    lines = [sharding_line(run, baseline, with_epochs, len(windows) > 1) for run in members]
    header = (["strategy", "Median throughput (img/s) (rank 0) ± MAD"]
              + (["per epoch: median ± MAD (epochs × steps)"] if with_epochs else [])
              + ["Throughput (img/s)", "vs ddp", "forward ms", "backward ms", "optimizer step ms", "parameter sync ms",
                 "host ms per step", "collectives per step", "MiB per step measured (analytic)",
                 "optimizer state MiB/rank", "expected state saving MiB", memory_header("Peak memory", windows),
                 "peak saving vs ddp (MiB)", "status"])
    failures = [failure_note(run) for run in members if run["status"] != "ok"]
    notes = failures + noisy_notes([row_of([run], run["status"]) for run in members])
    title = wrap(f"**Sharding strategies, one launch** ({launch_title(members, base)})")
    return "\n\n".join([title, table(header, lines), *(["\n".join(notes)] if notes else [])])


def sharding_tables(runs, base):
    return [sharding_table(members, base) for members in launches(runs)]


SHARDING_EXPLANATION = wrap(
    "Sharding tables (oss_benchmark.py): one per launch; vs ddp = rank 0's median throughput over that of the "
    "launch's ddp run; phases = rank 0's medians over the instrumented pass (CUDA events, no host synchronisation); "
    "host ms per step = the host's time to queue one step's phases; collectives and MiB per step from the profiled "
    "pass (torch.profiler), next to the analytic volume; optimizer state = the largest rank's; peak saving = the ddp "
    "run's peak memory minus the strategy's, over the same window.")


# ---------------------------------------------------------------------------- comparisons (compare.py)

def script_and_options(command):
    words = (command or "").split()
    start = next((i for i, word in enumerate(words) if word.endswith(".py")), 0)
    return words[start], words[start + 1:]


def options_text(options):
    return f"`{' '.join(options)}`" if options else "the default"


def comparison_label(a, b):
    """What B changes against A: another script (with the options both share), or B's further options."""
    (script_a, options_a), (script_b, options_b) = script_and_options(a), script_and_options(b)
    if script_a != script_b:
        names = {"lightning/ddp_resnet50.py": "the twin (stock)", "ddp_resnet50.py": "native"}
        shared = " ".join(options_a) if options_a == options_b else f"{' '.join(options_a)} / {' '.join(options_b)}"
        return (f"{names.get(script_b, f'`{script_b}`')} / {names.get(script_a, f'`{script_a}`')}"
                + (f", both `{shared}`" if shared.strip() else ""))
    extra = [option for option in options_b if option not in options_a]
    return f"`{' '.join(extra)}` / {options_text(options_a)}"


def comparison_result(document):
    """B / A with its 95 % interval and pairs, or the single pair a run cut short left, saying so."""
    pairs = document.get("pairs") if isinstance(document.get("pairs"), list) else []
    interval = document.get("interval_95")
    label = "" if document.get("like_for_like", True) else f" {ACROSS_BUILDS}"
    if not pairs or not is_number(document.get("ratio")):
        return f"no complete pair ({document.get('status')})"
    noisy = document.get("noisy_rounds") or 0
    noise = f"; {noisy} of {len(document.get('rounds') or [])} rounds noisy" if noisy else ""
    if isinstance(interval, list) and len(interval) == 2 and len(pairs) >= MIN_PAIRS:
        return (f"{document['ratio']:.3f}{label} (95 % interval {interval[0]:.3f}–{interval[1]:.3f}; "
                f"{len(pairs)} pairs{noise})")
    why = "too few for an interval" if len(pairs) < MIN_PAIRS else f"no interval (stopped: {document.get('status')})"
    return f"{document['ratio']:.3f}{label} from {len(pairs)} pairs, {why}{noise}"


def machine_text(document):
    """The GPU models of a comparison with the first 8 characters of each GPU's UUID, or the CPU."""
    sides = [side for side in (document.get("machine") or {}).values() if isinstance(side, dict)]
    names = sorted({name for side in sides for name in side.get("gpu_names") or []})
    uuids = sorted({uuid[:8] for side in sides for uuid in side.get("gpu_uuids") or []})
    if not uuids:
        return ", ".join(sorted({str(side.get("cpu")) for side in sides})) or "—"
    return f"{', '.join(names) or 'GPU'} {', '.join(uuids)}"


def comparisons_table(comparisons, base):
    """compare.py's comparisons: B against A, alternated in ABBA order on one machine, with the 95 % interval."""
    rows = []
    for path, document in sorted(comparisons, key=lambda item: str(item[0])):
        commands = document.get("commands") or {}
        if commands.get("a") == commands.get("b"):
            continue  # an A/A comparison measures noise: noise_table()
        rows.append([comparison_label(commands.get("a"), commands.get("b")), comparison_result(document),
                     machine_text(document), link(path, base)])
    return table(["B / A", "B / A throughput", "GPU", "file"], rows) if rows else "No comparisons (compare.py)."


def noise_table(comparisons, base):
    """A/A comparisons (the same command as A and B): the spread of their pair ratios, and the difference that each
    number of pairs can tell apart from that noise."""
    rows = []
    for path, document in sorted(comparisons, key=lambda item: str(item[0])):
        commands = document.get("commands") or {}
        ratios = [pair["ratio"] for pair in document.get("pairs") or []]
        if commands.get("a") != commands.get("b") or len(ratios) < 2:
            continue
        logs = [math.log(ratio) for ratio in ratios]
        script, options = script_and_options(commands["a"])
        rows.append([f"`{' '.join([script, *options])}`", machine_text(document),
                     f"{min(ratios):.3f}–{max(ratios):.3f} ({len(ratios)} pairs, "
                     f"{document.get('noisy_rounds') or 0} of {len(document.get('rounds') or [])} rounds noisy)",
                     f"{100 * statistics.stdev(logs):.2f} %",
                     *(f"±{half_width_percent(ratios, pairs):.1f} %" for pairs in (4, 8, 16, 32)),
                     link(path, base)])
    header = ["command (A and B)", "GPU", "pair ratios", "spread (sd of log ratio)", "4 pairs", "8 pairs",
              "16 pairs", "32 pairs", "file"]
    return table(header, rows) if rows else "No A/A comparisons (compare.py with one command as A and B)."


# ---------------------------------------------------------------------------- the report

EXPLANATION = wrap(
    "Each row is one configuration, its ok repeats aggregated: medians, the range over every run with its spread "
    "(max − min) / median, runs and machines; a run that did not end ok (✗) gets its own row. Throughput = images of "
    "all ranks / wall time of the timed steps; MFU = achieved FLOP/s over the GPU's dense peak (— without one); peak "
    "memory = the largest `max_memory_allocated` over the ranks, over the steps its column names. A ratio divides "
    "only runs of the same devices, commit and software, else it is labelled \"across ...\"; \"noisy\" marks a run "
    f"that found itself unsteady, \"dirty\" one of uncommitted code, \"{UNKNOWN_STABILITY}\" an older run.")


def render_markdown(runs, base, heading="###", comparisons=()):
    """The report as deterministic Markdown: everything sorted, no clock. Paths relative to base."""
    if not runs:
        return NO_RESULTS + "\n"
    setups = rows_by_setup(aggregate(runs))
    parts = [EXPLANATION]
    for setup in sorted(setups, key=order):
        setup_rows = setups[setup]
        labels = option_labels({row["config"] for row in setup_rows})
        parts += [f"{heading} {setup_title(setup)}", sources_text(setup_rows, base)]
        tables = (all_runs_table(setup_rows, labels), scaling_table(setup_rows, labels, "per_device"),
                  scaling_table(setup_rows, labels, "global"), lightning_table(setup_rows, labels))
        parts += [text for text in tables if text]
        parts += sharding_tables([run for row in setup_rows for run in row["runs"]], base)
    if any(run["config"].benchmark == OSS for run in runs):
        parts.append(SHARDING_EXPLANATION)
    if comparisons:
        parts += [f"{heading} Comparisons", comparisons_table(comparisons, base)]
    return "\n\n".join(parts) + "\n"


def render_sharding(runs, base):
    """Only the sharding tables, one per oss_benchmark.py launch (what oss_benchmark.py --table printed)."""
    tables = sharding_tables(runs, base)
    if not tables:
        raise UsageError("no oss_benchmark.py result among the inputs: --sharding shows its tables only")
    return "\n\n".join(tables + [SHARDING_EXPLANATION]) + "\n"


# ---------------------------------------------------------------------------- plots

def row_label(config, labels, with_devices=True):
    devices = f" · {devices_text(config)} {unit_of(config) if config.world_size == 1 else units_of(config)}"
    batch = (f"{config.batch_size_per_device} img/{unit_of(config)}" if config.batch_mode == "per_device"
             else f"global batch {config.global_batch_size:,}")
    return f"{config.benchmark} · {strategy_text(config, labels)}{devices * with_devices} · {batch}"


def slug(text):
    """A file name for a setup's title; a long title is cut and keeps a short hash of the whole, so that two
    setups that differ only at the end do not share a file."""
    name = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return name if len(name) <= 90 else f"{name[:81]}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def prepare_plots(directory):
    """matplotlib and the plots' folder, checked before anything is printed or written."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plots needs matplotlib: pip install matplotlib (or pip install -e '.[report]')")
    directory = pathlib.Path(directory)
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"--plots {directory} is a file, not a folder")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--plots {directory}: cannot be written ({error.strerror})")


def print_plots(runs, directory):
    """Throughput against GPU count, step-time distributions and peak memory, one PNG of each per setup; a note on
    stderr for each plot with nothing to show."""
    import matplotlib
    matplotlib.use("Agg")  # headless: no display on a cluster or in CI
    import matplotlib.pyplot as plt
    setups = rows_by_setup(aggregate(runs))
    for setup in sorted(setups, key=order):
        setup_rows, title = setups[setup], setup_title(setup)
        labels = option_labels({row["config"] for row in setup_rows})
        for kind, plot in (("scaling", plot_scaling), ("step_times", plot_step_times), ("memory", plot_memory)):
            figure = plot(plt, setup_rows, labels, title)
            if figure is None:
                print(f"report.py: note: no {kind.replace('_', ' ')} plot for {title}: nothing to show "
                      f"({'no GPU memory counters' if kind == 'memory' else 'no comparable runs'})", file=sys.stderr)
                continue
            path = pathlib.Path(directory) / f"{kind}-{slug(title)}.png"
            check_writable(path, "--plots")  # not over an input
            try:
                figure.savefig(path, dpi=120, bbox_inches="tight", metadata={"Software": None})
            except OSError as error:
                raise UsageError(f"--plots {directory}: cannot be written ({error.strerror})") from None
            finally:
                plt.close(figure)
            print(f"wrote {path}")


def tick_text(value, _position):
    return f"{value:,.0f}" if abs(value) >= 10 or value == 0 else f"{value:g}"


def plot_scaling(plt, rows, labels, title):
    panels = [(mode, series) for mode, series in (("per_device", scaling_series(rows, "per_device")),
                                                  ("global", scaling_series(rows, "global"))) if series]
    if not panels:
        return None
    figure, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False,
                                layout="constrained")
    for axis, (mode, series_list) in zip(axes[0], panels):
        plot_series(plt, axis, mode, series_list, labels)
    figure.suptitle(f"Throughput against {unit_of(rows[0]['config'])} count\n{title}", fontsize=10)
    return figure


def plot_series(plt, axis, mode, series_list, labels):
    """One panel: each series' throughput against its GPU count, and its ideal (linear from its base) dashed."""
    units = units_of(series_list[0][0]["config"])
    for index, series in enumerate(series_list):
        color, sizes = plt.cm.tab10(index % 10), [row["config"].world_size for row in series]
        base = series[0]
        axis.plot(sizes, [row["images_per_second"] for row in series], "o-", color=color,
                  label=row_label(base["config"], labels, with_devices=False))
        ideal = [base["images_per_second"] * size / base["config"].world_size for size in sizes]
        # One legend entry says what every dashed line is.
        axis.plot(sizes, ideal, "--", color=color, alpha=0.6,
                  label=f"ideal: linear from the fewest {units} (dashed, same colour)" if index == 0 else None)
    axis.set_xticks(sorted({row["config"].world_size for series in series_list for row in series}))
    axis.set(xlabel=f"{units[0].upper()}{units[1:]} (world size)", ylabel="Throughput (images/s, all ranks)")
    axis.set_ylim(bottom=0)
    axis.yaxis.set_major_formatter(plt.FuncFormatter(tick_text))
    axis.grid(alpha=0.3)
    axis.set_title("Weak scaling (fixed batch per device)" if mode == "per_device"
                   else "Strong scaling (fixed global batch)", fontsize=10)
    axis.legend(fontsize=7, loc="upper left")


def plot_step_times(plt, rows, labels, title):
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
                    [f"{row_label(row['config'], labels)} (n={len(row['step_times_ms'])})" for row in reversed(shown)],
                    fontsize=8)
    axis.set_xlabel("Step time (ms), every timed step of every rank and repeat")
    medians = [statistics.median(row["step_times_ms"]) for row in shown]
    if max(medians) > 5 * min(medians):  # strong scaling spans N-fold step times: keep every box readable
        axis.set_xscale("log")
        axis.xaxis.set_major_locator(plt.LogLocator(subs=(1, 1.5, 2, 3, 5, 7)))  # labelled within one decade too
        axis.xaxis.set_minor_formatter(plt.NullFormatter())
    else:
        axis.set_xlim(left=0)
    axis.plot([], [], color="tab:orange", label="median")
    axis.plot([], [], "^", markerfacecolor="white", markeredgecolor="black", label="mean")
    return finished(plt, figure, axis, f"Per-step time distributions (box: quartiles, whiskers: 1.5 × IQR)\n{title}")


def plot_memory(plt, rows, labels, title):
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
    axis.set_yticks(positions, [row_label(row["config"], labels) + (f" · {common_window(row)}" if len(windows) > 1
                                                                      and row in measured else "")
                                for row in shown], fontsize=8)
    axis.set_xlabel("Peak memory per rank (MiB, largest over the ranks" +
                    (f"; {next(iter(windows))})" if len(windows) == 1 else ")"))
    axis.set_xlim(0, max(reserved + allocated) * 1.15)
    return finished(plt, figure, axis, f"Peak GPU memory per strategy\n{title}")


def finished(plt, figure, axis, title):
    """A horizontal plot's value axis labelled and gridded, its legend under it and its title."""
    axis.xaxis.set_major_formatter(plt.FuncFormatter(tick_text))
    axis.grid(axis="x", alpha=0.3)
    figure.legend(fontsize=8, loc="outside lower center", ncols=2)
    axis.set_title(title, fontsize=10)
    return figure


# ---------------------------------------------------------------------------- the one-screen answer

WIDTH, SCREEN = 120, 50  # the default view's line length and line count at most
COMMANDS = {  # what measures a question that the results cannot answer
    "speed": "python ddp_resnet50.py --output r.json",
    "weak": "slurm/scaling_sweep.sh weak (or torchrun --nproc-per-node N)",
    "strong": "slurm/scaling_sweep.sh strong (or --global-batch-size B)",
    "lightning": "python lightning/ddp_resnet50.py --output l.json beside native's runs",
    "host-bound": "python experiments/lightning-interleaved/interleave.py --batch-size-per-device 32",
    "sharding": "torchrun --standalone --nproc-per-node 2 oss_benchmark.py"}


def fit(text, width=WIDTH):
    return text if len(text) <= width else text[:width - 1] + "…"


def deviations(config, labels, precision):
    """How a configuration differs from the usual one of its group: its compile mode, its precision where it is not
    the group's usual one, and the options that option_labels shows for it."""
    words = [] if config.compile_mode is None else [f"compile {config.compile_mode}"]
    return words + [config.precision] * (config.precision != precision) + [
        option_text(name, value).replace("=true", "") for name, value in labels.get(config, [])
        if value not in (None, "null")]  # an option that older results do not record is no difference


def usual(rows):
    """(the option labels of the rows' configurations, their most common precision)."""
    configs = [row["config"] for row in rows]
    return option_labels(set(configs)), statistics.mode(config.precision for config in configs)


def workload(config):
    return (f"{config.device_name}, {config.model} {config.image_size} px, {config.batch_size_per_device} "
            f"img/{unit_of(config)}")


def speed_answer(rows):
    """Per device and workload: the default mode's throughput, and the fastest other mode's, over every run."""
    native = [row for row in rows if row["status"] == "ok" and row["config"].benchmark == NATIVE
              and row["config"].world_size == 1]
    if not native:
        return [f"DDP speed: no one-device run of ddp_resnet50.py; measure: {COMMANDS['speed']}"]
    found = usual(native)
    lines = ["DDP speed (ddp_resnet50.py, one device; img/s over every run of a mode):"]
    for device in sorted({row["config"].device_name for row in native}):
        mine = [row for row in native if row["config"].device_name == device]
        default = max(mine, key=lambda row: (not deviations(row["config"], *found), len(row["runs"])))
        same = [row for row in mine if workload(row["config"]) == workload(default["config"])]
        fastest = max(same, key=lambda row: row["images_per_second"])
        modes = " ".join(deviations(default["config"], *found)) or "the defaults"
        lines.append(fit(f"  {workload(default['config'])}, {modes}: {rates_text(default['runs'])}"))
        if fastest is not default:
            lines.append(fit(f"    fastest of {len(same)} modes: {rates_text(fastest['runs'])}, with"))
            lines += textwrap.wrap(", ".join(deviations(fastest["config"], *found)), WIDTH, initial_indent=" " * 6,
                                   subsequent_indent=" " * 6)
    return lines


def scaling_answer(rows):
    """Scaling efficiency of ddp_resnet50.py by device count, weak and strong: per count, the range over the runs
    that have base runs on their own devices, commit and software, with flags at its ends."""
    lines = []
    for mode, name in (("per_device", "weak"), ("global", "strong")):
        series = [members for members in scaling_series(rows, mode)
                  if (members[0]["config"].benchmark, members[0]["config"].strategy) == (NATIVE, "ddp")]
        if not series:
            lines.append(f"Scaling, {name}: no series of device counts; measure: {COMMANDS[name]}")
            continue
        chosen = max(series, key=lambda members: (len({row["config"].world_size for row in members}),
                                                  sum(len(row["runs"]) for row in members)))
        base, config = chosen[0], chosen[0]["config"]
        kept = (f"{config.batch_size_per_device} img/{unit_of(config)}" if mode == "per_device"
                else f"global batch {config.global_batch_size:,}")
        others = f"; {len(series) - 1} other series: --all" if len(series) > 1 else ""
        lines.append(fit(f"Scaling efficiency, {name} ({config.device_name}, {config.model}, {kept}; against "
                         f"{config.world_size} {unit_of(config)}{others}):"))
        found = usual(chosen)
        for count in sorted({row["config"].world_size for row in chosen} - {config.world_size}):
            members = sorted((row for row in chosen if row["config"].world_size == count),
                             key=lambda row: (len(deviations(row["config"], *found)), -len(row["runs"])))
            shown = 3 if len(members) > 1 and len({row["config"].world_size for row in chosen}) <= 2 else 1
            for row in members[:shown]:
                label = ", ".join(deviations(row["config"], *found)) or "the defaults"
                lines.append(fit(f"  {count} {units_of(config)}, {label}: {scaling_of(row['runs'], base['runs'])}"))
            lines += [f"  {count} {units_of(config)}: {len(members) - shown} more DDP settings: --all"] * (
                len(members) > shown)
    return lines


def host_bound(*rows):
    return any("host-bound" in (run["noisy_reason"] or "") for row in rows for run in row["runs"])


def lightning_answer(rows):
    """The twin against native per regime: GPU-bound from whole runs (like-for-like pairs), host-bound only
    from loops interleaved in one process (whole runs there differ by more than the cost)."""
    pairs = lightning_pairs(rows)
    if not pairs:
        return [f"Lightning / native: no pair; measure: {COMMANDS['lightning']}"]
    labels, precision = usual([row for pair in pairs for row in pair])
    batch = statistics.mode(native["config"].batch_size_per_device for native, _ in pairs)  # the usual workload
    groups = defaultdict(lambda: ([], []))
    for native, twin in pairs:
        config = native["config"]  # the scripts' defaults, DDP's included: every pooled pair like for like
        if (not host_bound(native, twin) and not deviations(config, labels, precision)
                and config.batch_size_per_device == batch):
            variant = ", ".join(option_text(name, value).replace("lightning_", "") for name, value
                                in labels.get(twin["config"], []) if name.startswith("lightning_")
                                and value not in (None, "null"))
            key = (twin["config"].world_size, twin["config"].batch_size_per_device, variant or "stock")
            groups[key][0].extend(run for run in twin["runs"] if run not in groups[key][0])
            groups[key][1].extend(run for run in native["runs"] if run not in groups[key][1])
    lines = ["Lightning / native img/s (whole runs on the same devices, commit and software):"]
    for (count, batch, variant), (twins, natives) in sorted(groups.items()):
        devices = f"{count} {(units_of, unit_of)[count == 1](twins[0]['config'])}"
        label = paired_ratios(twins, natives).label  # a pair of two machines or builds: no figure on this screen
        figure = f"{label}: no like-for-like pair" if label else ratio_of(twins, natives)
        lines.append(fit(f"  GPU-bound, {devices} × {batch}, {variant}: {figure}"))
    lines += [f"  GPU-bound: no pair at {batch} img per device (--all shows every pair)"] * (len(lines) == 1)
    noisy = sum(host_bound(native, twin) for native, twin in pairs)
    lines += [f"  host-bound: whole runs differ by more than the cost ({noisy} pairs here); loops interleaved in one "
              f"process:", f"    {COMMANDS['host-bound']}"]
    return lines


def sharding_figures(runs):
    """(the ddp configuration of the most launched setup or None, how many other setups, one row per strategy of
    its most launched configuration: speed of rank 0's medians and peak memory as % of the ddp run of the same
    launch, the flags of both runs at the ends, launches and machines)."""
    groups = defaultdict(list)
    for members in launches(runs):
        baseline = next((run for run in members if run["config"].strategy == "ddp" and run["status"] == "ok"), None)
        if baseline:
            groups[setup_of(baseline["config"]), baseline["config"].world_size,
                   baseline["config"].batch_size_per_device].append((baseline, members))
    if not groups:
        return None, 0, []
    key = max(groups, key=lambda key: len(groups[key]))
    found, best, rows = defaultdict(list), {}, []
    for baseline, members in groups[key]:
        for run in members:
            if run is not baseline and run["status"] == "ok" and unlike(run, baseline) is None:
                found[run["config"]].append((run, baseline))
    for config, pairs in found.items():
        if len(pairs) > len(best.get(config.strategy, [])):
            best[config.strategy] = pairs
    for strategy in sorted(best, key=strategy_rank):
        pairs = best[strategy]
        speed = [run["rank0_median"] / base["rank0_median"] for run, base in pairs]
        memory = [(run["peak_allocated_mib"] / base["peak_allocated_mib"], both(run, base)) for run, base in pairs
                  if run["peak_allocated_mib"] and base["peak_allocated_mib"]
                  and run["memory_window"] == base["memory_window"]]
        rows.append([strategy, span(speed, [both(*pair) for pair in pairs], percent_text) + " %",
                     span(*zip(*memory), percent_text) + " %" if memory else "–",
                     counts([run for run, _ in pairs], what="launch").replace("launchs", "launches")])
    return groups[key][0][0]["config"], len(groups) - 1, rows


def sharding_answer(runs):
    """Each strategy against the ddp run of its own launch, speed and peak memory, over the most launched setup."""
    config, others, rows = sharding_figures(runs)
    if config is None:
        return [f"Sharding / DDP: no launch with a ddp run; measure: {COMMANDS['sharding']}"]
    more = f"; {others} other setups: --all" if others else ""
    return [fit(f"Sharding, % of the ddp run of its launch ({workload(config)}, {config.world_size} "
                f"{units_of(config)}{more}):")] + [
        fit(f"  {strategy}: speed {speed}, peak memory {memory} ({launched})") for strategy, speed, memory, launched
        in rows]


def answer(runs, paths):
    """The one-screen answer: per question one line (or one per device count or strategy) with its like-for-like
    range, its counts and the flags of its ends; where the results cannot answer, the command that would."""
    rows = aggregate(runs)
    ok = sum(run["status"] == "ok" for run in runs)
    machines = len({run["machine"] for run in runs} - {None})
    lines = [fit(f"{len(runs)} results ({ok} ok) in {', '.join(map(str, paths))}, {machines} machine"
                 f"{'s' * (machines != 1)}")]
    lines += speed_answer(rows) + scaling_answer(rows) + lightning_answer(rows) + sharding_answer(runs)
    if len(lines) > SCREEN - 1:  # many GPU models or counts: the rest behind --all
        lines = lines[:SCREEN - 2] + [f"... {len(lines) - SCREEN + 2} more lines: --all"]
    lines.append("Every table: report.py --all [PATH]; a launch's strategies: --sharding; noisy: an unsteady run; "
                 "dirty: uncommitted code")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- the documents' generated blocks

ANY = object()  # a setting a block does not restrict
# What the native script runs without options on one H200 (the results record every one of these).
DEFAULT_RUN = {"benchmark": NATIVE, "strategy": "ddp", "device": "cuda", "model": "resnet50", "image_size": 224,
               "precision": "bf16", "memory_format": "channels_last", "optimizer": "sgd", "compile_mode": None,
               "batch_mode": "per_device", "batch_size_per_device": 256, "world_size": 1, "num_nodes": 1,
               **{name: value for name, value in script_defaults().items() if name not in NOT_OPTIONS},
               "loss_scale": None, "cudnn_benchmark": True, "cudnn_benchmark_limit": 10, "compiled_ddp": None,
               "inductor_environment": None, "nccl_environment": None}
TWIN = {"benchmark": LIGHTNING, "strategy": "lightning_ddp"}
FASTEST = {"precision": "fp16", "loss_scale": 1024.0, "compile_mode": "default", "coordinate_descent_tuning": True,
           "cuda_graphs": True, "stem_conv": "space_to_depth", "max_pool_backward": "dense", "batch_norm": "sums"}
COMPUTATION_SETTINGS = ("stem_conv", "max_pool_backward", "batch_norm")
INTERLEAVED = REPOSITORY / "experiments" / "lightning-interleaved" / "data"


def setting_of(run, name):
    config = run["config"]
    if name in Config._fields:
        return getattr(config, name)
    options = dict(config.options)
    return json.loads(options[name]) if name in options else None


def pick(runs, **settings):
    """The ok runs of DEFAULT_RUN changed by settings (ANY: whatever they ran; a tuple: any of its values); options
    that do not apply to a run (DDP's on one rank) are not asked of it."""
    wanted = {**DEFAULT_RUN, **settings}
    return [run for run in runs if run["status"] == "ok" and all(
        value is ANY or not applies(name, run["config"])
        or (setting_of(run, name) in value if isinstance(value, tuple) else setting_of(run, name) == value)
        for name, value in wanted.items())]


def interleaved(devices):
    """The twin's loop against native's, interleaved in one process (experiments/lightning-interleaved/): the
    pooled median of every block ratio, with the 95 % interval of pool.py's run bootstrap (its seed and rounds)."""
    import random
    runs = [json.loads(path.read_text())["summary"]["ratios"]
            for path in sorted(INTERLEAVED.glob(f"interleave-*{devices}gpu-bf16-32*.json"))]
    rng = random.Random(0)
    medians = sorted(statistics.median([value for run in rng.choices(runs, k=len(runs)) for value in run])
                     for _ in range(4000))
    pooled = [value for run in runs for value in run]
    return (f"{statistics.median(pooled):.3f} (95 % interval {medians[100]:.3f}–{medians[3899]:.3f}, {len(runs)} "
            f"runs of {len(pooled):,} blocks)")


ONE_GPU_MODES = [  # docs/performance.md's table: (mode, settings)
    ("one H200, eager bf16, channels_last (the default)", {}),
    ("eager bf16, `--cuda-graphs`", {"cuda_graphs": True}),
    ("eager fp16, `--loss-scale 1024`", {"precision": "fp16", "loss_scale": 1024.0}),
    ("`--compile`, bf16", {"compile_mode": "default"}),
    ("`--compile`, fp16 with PyTorch's GradScaler", {"compile_mode": "default", "precision": "fp16",
                                                     "loss_scale": "dynamic"}),
    ("`--compile --cuda-graphs`, bf16", {"compile_mode": "default", "cuda_graphs": True}),
    ("`--compile --cuda-graphs --coordinate-descent-tuning`, bf16", {"compile_mode": "default", "cuda_graphs": True,
                                                                      "coordinate_descent_tuning": True}),
    ("the same, fp16 `--loss-scale 1024`", {key: value for key, value in FASTEST.items()
                                           if key not in COMPUTATION_SETTINGS}),
    ("+ `--space-to-depth-stem --dense-max-pool-backward`", {**FASTEST, "batch_norm": "torchvision"}),
    ("+ `--sums-batch-norm`: the fastest mode", FASTEST)]


def performance_block(runs):
    """docs/performance.md's answer: each mode on one GPU against the default on the same GPU, 32 images, and the
    scaling efficiency of two GPUs."""
    default, small = pick(runs), {"batch_size_per_device": 32}
    compiled = pick(runs, world_size=2, compile_mode="default", compiled_ddp=ANY, bucket_cap_mb=ANY,
                    broadcast_buffers=ANY)
    rows = [[mode, rates_text(chosen), ratio_of(chosen, default) if settings else "1"]
            for mode, settings in ONE_GPU_MODES for chosen in [pick(runs, **settings)]]
    rows += [["32 images, eager (host-bound)", rates_text(pick(runs, **small)), "–"],
             ["32 images, compiled and captured",
              rates_text(pick(runs, **small, compile_mode="default", cuda_graphs=True)), "–"],
             ["two H200s, eager: scaling efficiency", scaling_of(pick(runs, world_size=2), default), "–"],
             ["two H200s, eager, `--no-broadcast-buffers`",
              scaling_of(pick(runs, world_size=2, broadcast_buffers=False), default), "–"],
             ["two H200s, compiled: scaling efficiency", scaling_of(compiled, pick(runs, compile_mode="default")),
              "–"]]
    return table(["mode", "img/s (runs, machines)", "× the default, same GPU"], rows)


def sharding_block(runs):
    """docs/sharding.md's answer: the one-screen answer's sharding lines as a table."""
    return table(["strategy", "speed, % of ddp's", "peak memory, % of ddp's", "launches, machines"],
                 sharding_figures(runs)[2])


def launch_block(runs, base):
    """docs/sharding.md's evidence: the launch at 224 px (SGD) that its prose walks through, as --sharding shows it."""
    return sharding_table(next(members for members in launches(runs)
                               if members[0]["path"].name.startswith("x5-sharding-2gpu-bf16-256-sgd-")), base)


def lightning_block(runs):
    """lightning/README.md's cost: the twin against native where the GPU sets the pace (whole runs, 256 images)."""
    two = {**TWIN, "world_size": 2}
    cases = [("1 GPU (no DDP: stock and matched alike)", pick(runs, **TWIN), pick(runs)),
             ("2 GPUs, matched (DDP on the current stream, no broadcast)",
              pick(runs, **two, lightning_ddp_side_stream=False, lightning_sigterm_sync=False),
              pick(runs, world_size=2)),
             ("2 GPUs, DDP on Lightning's side stream, no broadcast",
              pick(runs, **two, lightning_ddp_side_stream=(True, None), lightning_sigterm_sync=False),
              pick(runs, world_size=2)),
             ("2 GPUs, the SIGTERM broadcast against none (bucket views off)",
              pick(runs, **two, gradient_as_bucket_view=False, lightning_sigterm_sync=True,
                   lightning_ddp_side_stream=ANY),
              pick(runs, **two, gradient_as_bucket_view=False, lightning_sigterm_sync=False,
                   lightning_ddp_side_stream=ANY))]
    return table(["twin (256 images per GPU)", "Lightning / native img/s (runs, machines)"],
                 [[label, ratio_of(twins, natives)] for label, twins, natives in cases])


def sections(runs, comparisons):
    """{name: function of a document (its path in the repository) giving its generated block}: report.py's and
    the scaling model's (docs/scaling.md)."""
    def folder(document):
        return (REPOSITORY / document).parent
    return {"summary": lambda document: f"```text\n{answer(runs, ['results'])}```",
            "interleaved-1": lambda document: interleaved(1), "interleaved-2": lambda document: interleaved(2),
            "performance": lambda document: performance_block(runs),
            "sharding-answer": lambda document: sharding_block(runs),
            "sharding": lambda document: launch_block(runs, folder(document)),
            "lightning-cost": lambda document: lightning_block(runs),
            "results": lambda document: render_markdown(runs, folder(document), "##", comparisons),
            "noise": lambda document: noise_table(comparisons, folder(document)), **scaling.SECTIONS}


# ---------------------------------------------------------------------------- regression check

def parse_tolerance(text):
    text = text.strip()
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise UsageError(f"--tolerance {text!r}: write a percentage (5%) or a fraction (0.05)")
    if not 0 <= value < 1:  # NaN and infinities too
        raise UsageError(f"--tolerance {text!r} must lie between 0 and 100 %: write 5% or 0.05")
    return value


def same_configuration(current, reference):
    """Equal configurations, software versions aside; options only one side records are not compared
    (a newer script may record more)."""
    return (current._replace(torch=None, options=None) == reference._replace(torch=None, options=None)
            and options_agree(current, reference))


def differences(current, reference):
    """The fields in which reference's configuration differs from current's, as 'name here/there'."""
    found = [f"{field} {getattr(current, field)}/{getattr(reference, field)}" for field in Config._fields
             if field not in ("torch", "options") and getattr(current, field) != getattr(reference, field)]
    mine, theirs = dict(current.options), dict(reference.options)
    found += [f"{name} {mine[name].strip(chr(34))}/{theirs[name].strip(chr(34))}"
              for name in sorted(mine.keys() & theirs.keys()) if mine[name] != theirs[name]]
    return found


INCOMPARABLE = "incomparable: no result in {where} has the configuration of {name}; the nearest differs in "
UNCHECKED = ("report.py: warning: {name}: not checked, no reference in {where} with its configuration; the nearest "
             "differs in ")


def mismatch_line(template, name, run, references, reference_path, limit=MAX_LINE):
    """template with the file names, then the fields in which the nearest reference (the fewest) differs."""
    nearest = min((differences(run["config"], row["config"]) for row in references), key=lambda found: (len(found), found))
    start = template.format(name=pathlib.Path(name).name, where=pathlib.Path(reference_path).name)
    return fit(start + ", ".join(nearest), limit)


def check_run(run, reference, tolerance, name):
    """(violations, notes) of one current run against its reference row."""
    violations, notes = [], []
    noisy = f" ({NOISY}: {run['noisy_reason'] or 'unsteady'})" if run["noisy"] else ""
    current_rate, reference_rate = rate(run), reference["images_per_second"]
    drop = 1 - current_rate / reference_rate
    if drop > tolerance:
        violations.append(f"{name}: throughput dropped {drop:.1%} ({format_rate(reference_rate)} -> "
                          f"{format_rate(current_rate)} img/s), more than {tolerance:.1%}: "
                          f"{row_label(run['config'], {})}{noisy}")
    window = run["memory_window"]
    current_mib, reference_mib = run["peak_allocated_mib"], peak_mib(reference, window)
    if current_mib is not None and reference_mib:
        rise = current_mib / reference_mib - 1
        if rise > tolerance:
            violations.append(f"{name}: peak memory rose {rise:.1%} ({format_mib(reference_mib)} -> "
                              f"{format_mib(current_mib)} MiB, {window}), more than {tolerance:.1%}: "
                              f"{row_label(run['config'], {})}{noisy}")
    elif current_mib is not None and reference["memory"]:
        notes.append(f"report.py: note: {name}: peak memory not compared: the memory windows differ (here: "
                     f"{window}; reference: {' and '.join(reference['memory'])})")
    return violations, notes


def reference_of(run, references):
    """The reference row of run's configuration; of those that differ only in their torch version, the run's own
    version where there is one."""
    return min((row for row in references if same_configuration(run["config"], row["config"])),
               key=lambda row: row["config"].torch != run["config"].torch, default=None)


def check_against(runs, reference_runs, tolerance, reference_path):
    """Returns (exit code, lines to print)."""
    references = [row for row in aggregate(reference_runs) if row["status"] == "ok"]
    if not references:
        raise UsageError(f"--check-against {reference_path}: no result with status ok to compare with")
    violations, notes, unmatched, checked = [], [], [], 0
    for run in sorted(runs, key=lambda run: str(run["path"])):
        name = display_path(run["path"], pathlib.Path.cwd())
        reference = reference_of(run, references)
        if run["status"] != "ok":
            violations.append(f"{name}: status {run['status']}: {run['failure'] or 'no message'}")
        elif reference is None:
            unmatched.append((name, run))
        else:
            checked += 1
            found, noted = check_run(run, reference, tolerance, name)
            violations, notes = violations + found, notes + noted
    # Nothing compared and nothing failed: the reference is for other configurations, a mistake in the call.
    if unmatched and not checked and not violations:
        raise UsageError(mismatch_line(INCOMPARABLE, *unmatched[0], references, reference_path,
                                       limit=MAX_LINE - len("report.py: error: ")))
    notes += [mismatch_line(UNCHECKED, name, run, references, reference_path) for name, run in unmatched]
    return check_verdict(violations, notes, checked, len(unmatched), tolerance, reference_path)


def check_verdict(violations, notes, checked, unmatched, tolerance, reference_path):
    if violations:
        return EXIT_FAILED, notes + [f"REGRESSION {line}" for line in violations] + [
            f"check failed: {len(violations)} violation{'s' * (len(violations) > 1)} against {reference_path} "
            f"(tolerance {tolerance:.1%})"]
    return EXIT_OK, notes + [f"check passed: {checked} result{'s' * (checked != 1)} within {tolerance:.1%} of "
                             f"{reference_path} (throughput, and peak memory over the same steps; {unmatched} "
                             "without a reference)"]


# ---------------------------------------------------------------------------- command line

def parse_arguments(argv=None):
    parser = OneLineArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("paths", nargs="*", metavar="PATH", help="result files or folders, searched recursively (default: results/)")
    add("--all", action="store_true", help="every table, as Markdown on stdout, instead of the one-screen answer")
    add("--markdown", metavar="OUT.md", help="write the Markdown report to this file (default: stdout)")
    add("--sharding", action="store_true", help="print only the sharding tables of oss_benchmark.py, one per launch")
    add("--plots", metavar="DIR", help="write PNG plots into this folder (needs matplotlib)")
    add("--check-against", metavar="REF", help="reference result file or folder: exit 1 on a regression")
    add("--tolerance", help="allowed throughput drop and memory rise, 5%% or 0.05 (default 5%%)")
    add("--docs", action="store_true", help="regenerate every generated block of the documents from results/")
    add("--check-docs", action="store_true", help="exit 1 when a generated block differs from what --docs writes")
    args = parser.parse_args(argv)
    if (args.docs or args.check_docs) and (args.paths or args.markdown or args.sharding or args.plots
                                           or args.check_against or args.all):
        raise UsageError("--docs and --check-docs read results/ and take no other option")
    args.paths = args.paths or [os.path.relpath(REPOSITORY / "results")]
    if args.tolerance is not None and not args.check_against:
        raise UsageError("--tolerance needs --check-against")
    if sum(map(bool, (args.sharding, args.markdown, args.all))) > 1:
        raise UsageError("--all, --sharding and --markdown each choose the output: give one")
    args.tolerance = parse_tolerance("5%" if args.tolerance is None else args.tolerance)
    return args


def main_docs(check):
    """Regenerate (or check) every generated block of the documents, from the repository's folder."""
    runs, comparisons = load_documents([REPOSITORY / "results"])
    blocks = sections(runs, comparisons)
    return check_documents(blocks) if check else update_documents(blocks)  # the package's DOCUMENTS


def write_markdown(runs, comparisons, out):
    text = f"# Benchmark results\n\n{render_markdown(runs, pathlib.Path(out).resolve().parent, '##', comparisons)}"
    try:
        write_atomically(out, text)
    except OSError as error:
        raise UsageError(f"--markdown {out}: cannot be written ({error.strerror or error})") from None
    print(f"wrote {out}")


def main(argv=None):
    args = parse_arguments(argv)
    if args.docs or args.check_docs:
        return main_docs(args.check_docs)
    runs, comparisons = load_documents(args.paths)
    if not runs and not args.markdown:  # a Markdown file may say that there are no results yet
        raise UsageError(f"no result files in {', '.join(args.paths)}")
    checked = EXIT_OK, []
    if args.check_against:  # an unusable reference ends the run before anything is written
        reference_runs = load_documents([args.check_against], what="reference")[0]
        checked = check_against(runs, reference_runs, args.tolerance, args.check_against)
    if args.plots:
        prepare_plots(args.plots)
    if args.markdown:
        write_markdown(runs, comparisons, args.markdown)
    elif args.sharding:
        print(render_sharding(runs, pathlib.Path.cwd()), end="")
    elif args.all:
        print(render_markdown(runs, pathlib.Path.cwd(), heading="##", comparisons=comparisons), end="")
    else:
        print(answer(runs, args.paths), end="")
        print(scaling.ceilings_text(args.paths), end="")  # each GPU count's ceiling where a run probed its link
    if args.plots:
        print_plots(runs, args.plots)
    for line in checked[1]:
        print(line, file=sys.stderr if line.startswith("report.py:") else sys.stdout)
    return checked[0]


if __name__ == "__main__":
    run_cli(main, "report.py")
