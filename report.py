"""Tables, plots, a regression check and the documents' generated blocks from the benchmarks' result files.

    python report.py results/                                   # Markdown report on stdout
    python report.py results/ runs/ --markdown report.md --plots plots/
    python report.py runs/ci.json --check-against results/nvidia-h200-x2-2026-11-30b --tolerance 5%
    python report.py runs/s-*.json --sharding                   # only the sharding tables of oss_benchmark.py
    python report.py --docs                                     # regenerate the documents' generated blocks
    python report.py --check-docs                               # exit 1 when one of them is stale

Inputs are result files or folders, searched recursively for *.json (hidden files, such as a run's half-written
.tmp-*.json, are left out). Each file is validated with schema/result.schema.json; a file that cannot be read, is
not JSON or fails the schema is skipped with a one-line warning naming the first broken rule; when every file is
skipped, that is one error line. compare.py's comparison files feed the comparison table.

A configuration is everything that changes what is measured: the device (GPU name, or the CPU), the torch version,
model, image size, precision, memory format, compile mode, optimizer, then the benchmark, strategy, script-specific
options (shown next to the strategy where they tell rows apart), node count, world size, batch mode and batch
sizes. Step counts, seeds, learning rate, timeouts and output paths are not part of it, nor are DDP's options on
one rank (the native script and its twin build no DDP there), nor FSDP's options for the other strategies; NCCL's
tuning variables in the recorded environment are (nccl_environment). Results with the same configuration are
repeats: the ok ones become one row (the median of each figure, the range of throughput over every repeat, the
number of runs and machines); a result that did not end ok gets a row of its own, marked with its status, and
stays out of every comparison. Results that found their own run unsteady (halves of the timed steps that differ,
or a host-bound step) are marked "noisy: repeat or interleave"; those without a verdict "stability unknown".

Pairing rules: a ratio (scaling, Lightning / native, strategy / ddp, option / default) is computed only between
results of the same machine (the same GPU UUIDs; on the CPU the same hosts and CPU; for scaling, base runs on the
larger run's own GPUs, covering all of them), the same git commit and the same software versions (analysis.py's
SOFTWARE, where both record them). Each run of the numerator is divided by the median of its like-for-like
denominators, and the range over those runs is printed with their count. A pair without such a partner is printed
from the rows' medians and labelled "across machines" or "across commits/software"; it never makes a headline.
Peak memory is compared only between results that took it over the same steps (their memory window).

Tables (Markdown): every configuration; weak and strong scaling (efficiency = throughput(N) / (N / N_base x
throughput(N_base)), N_base the smallest count of the series); Lightning over native DDP; the sharding strategies
of oss_benchmark.py, one table per launch, each strategy against the ddp of its own launch; compare.py's comparisons.

Regression check: every current result is compared with the median of the reference results of its configuration
(software versions aside: catching what a new version costs is the point). A throughput drop or a peak memory rise
beyond the tolerance, or a status other than ok, is a violation: one line each, exit 1. A current result without a
reference is reported with the fields in which the nearest reference differs; when that leaves nothing checked and
nothing failed, the reference is incomparable (exit 2).

Generated blocks: README.md, docs/*.md and lightning/README.md hold blocks between <!-- generated:NAME --> and
<!-- /generated:NAME --> (the package's engine); --docs regenerates every one of them, report.py's from the
committed results (results/) and scaling_model.py's sections, and --check-docs exits 1 when one differs.

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

from resnet50_ddp_benchmarks.analysis import (EXIT_FAILED, EXIT_OK, REPOSITORY, OneLineArgumentParser, UsageError,
    check_documents, check_writable, is_number, run_cli, update_documents, write_atomically)
from resnet50_ddp_benchmarks.pairing import (ACROSS_BUILDS, ACROSS_MACHINES, LIGHTNING, NATIVE, NOT_OPTIONS, OSS,
    RUN_FIELDS, SHARDING_ORDER, Config, aggregate, applies, common_window, launches, lightning_pairs, load_documents,
    load_runs, option_labels, options_agree, order, paired_ratios, peak_mib, rate, row_of, rows_by_setup,
    scaling_figures, scaling_label, scaling_series, script_defaults, unlike)

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

def machines_text(runs):
    """How many runs and machines a figure rests on (the machines that the results name)."""
    count, machines = len(runs), len({run["machine"] for run in runs} - {None})
    text = f"{count} run{'s' * (count != 1)}"
    return text + f", {machines} machine{'s' * (machines != 1)}" if machines else text


def range_text(values, text):
    """min–max of values through text(value), or the value alone."""
    low, high = text(min(values)), text(max(values))
    return low if low == high else f"{low}–{high}"


def ratio_text(value):
    return f"{value:.3f}"


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


def format_percent(fraction, signed=False):
    return "–" if fraction is None else f"{fraction * 100:{'+' if signed else ''}.1f} %"


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
    """Throughput's range over every repeat, and its spread (max − min) / median."""
    if row["range"] is None or len(row["runs"]) < 2:
        return "–"
    low, high = row["range"]
    return f"{format_rate(low, like=high)}–{format_rate(high)} ({format_percent(row['spread'])})"


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


def caution(*rows):
    """What a figure from these rows must carry: noisy, or stability unknown; None for steady rows."""
    if any(row["noisy"] for row in rows):
        return NOISY
    if any(row["unknown_stability"] for row in rows):
        return UNKNOWN_STABILITY
    return None


def notes_text(*notes):
    """ (a; b) of the notes that are not None, or ''."""
    given = [note for note in notes if note]
    return f" ({'; '.join(given)})" if given else ""


def failure_text(run):
    """A failure's message, cut to a line's length (an OOM's names every allocator figure)."""
    message = run["failure"] or "no message"
    return message if len(message) <= 150 else message[:149] + "…"


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
    for run in runs_of(rows):
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
                      range_cell(row), format_mfu(row), memory_cell(row, len(windows) > 1), machines_text(row["runs"]),
                      format_status(row)])
        if row["status"] != "ok":
            failures.append(f"- ✗ {row['status']} in `{row['runs'][0]['path'].name}`: {failure_text(row['runs'][0])}")
    header = ["benchmark", "strategy", units, "batch mode", f"batch (img/{unit})", "global batch (img)",
              "Median throughput (img/s) (rank 0) ± MAD", "Throughput (img/s)", "range over runs (spread)", "MFU",
              memory_header("Peak memory", windows), "runs", "status"]
    notes = failures + noisy_notes(rows)
    return "\n\n".join(["**All configurations**", table(header, lines), *(["\n".join(notes)] if notes else [])])


def scaling_cells(row, base, weak):
    """(speed-up, efficiency) cells of a row against its series' base row: the range over its runs that have
    base runs on their own devices with their build, else from the rows' medians, labelled."""
    base_count = base["config"].world_size
    figures = [(run, scaling_figures(run, base["runs"], base_count)) for run in row["runs"]]
    paired = [(run, figure) for run, figure in figures if figure is not None]
    if row is base:
        return "1.00×", "100.0 %"
    if paired:
        runs = [run for run, _ in paired]
        speedups, efficiencies = [figure[0] for _, figure in paired], [figure[1] for _, figure in paired]
        return (f"{range_text(speedups, lambda value: f'{value:.2f}')}×",
                f"{range_text(efficiencies, percent_text)} %{notes_text(machines_text(runs), caution(row, base))}")
    speedup = row["images_per_second"] / base["images_per_second"]
    label = scaling_label(row["runs"], base["runs"])
    efficiency = speedup / (row["config"].world_size / base_count)
    return f"{speedup:.2f}× {label}", f"{percent_text(efficiency)} % {label}{notes_text(caution(row, base))}"


def scaling_table(rows, labels, batch_mode):
    """Weak (per_device) or strong (global) scaling. Against the fewest GPUs of each series (N_base):
    speed-up = T(N) / T(N_base), ideal = N / N_base, efficiency = T(N) / (N / N_base x T(N_base))."""
    unit, units, lines = unit_of(rows[0]["config"]), units_of(rows[0]["config"]), []
    weak = batch_mode == "per_device"
    for series in scaling_series(rows, batch_mode):
        base = series[0]
        for row in series:
            config = row["config"]
            speedup, efficiency = scaling_cells(row, base, weak)
            ideal = config.world_size / base["config"].world_size
            per_device, global_batch = str(config.batch_size_per_device), f"{config.global_batch_size:,}"
            lines.append([config.benchmark, strategy_text(config, labels),
                          per_device if weak else global_batch, devices_text(config),
                          global_batch if weak else per_device, format_rate(row["images_per_second"]),
                          format_rate(row["images_per_second"] / config.world_size), speedup,
                          format_ratio(ideal), efficiency])
    if not lines:
        return None
    batches = [f"batch (img/{unit})", "global batch (img)"]
    header = ["benchmark", "strategy", batches[not weak], units, batches[weak], "Throughput (img/s)",
              f"Throughput per {unit} (img/s)", f"Speed-up vs fewest {units}", "Ideal speed-up",
              "Scaling efficiency"]
    kind = f"**Weak scaling** (fixed batch per {unit}" if weak else "**Strong scaling** (fixed global batch"
    return "\n\n".join([wrap(f"{kind}; efficiency = throughput(N) / (N / N_base × throughput(N_base)), N_base the "
                             f"fewest {units} of the series; each run against base runs on its own {units})"),
                        table(header, lines)])


def paired_cell(numerator, denominator, value=rate):
    """A ratio of two rows under the pairing rules: the range over the numerator's like-for-like runs with their
    count, or the rows' medians labelled across machines (or commits/software); noisy or unknown stability said."""
    paired = paired_ratios(numerator["runs"], denominator["runs"], value)
    cautious = caution(numerator, denominator)
    if paired.values:
        return f"{range_text(paired.values, ratio_text)}{notes_text(machines_text(paired.runs), cautious)}"
    return f"{ratio_text(value(numerator) / value(denominator))} {paired.label}{notes_text(cautious)}"


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
                      paired_cell(lightning, native),
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


def sharding_table(members, base, labels=None):
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
    failures = [f"- ✗ {run['status']} in `{run['path'].name}`: {failure_text(run)}"
                for run in members if run["status"] != "ok"]
    notes = failures + noisy_notes([row_of([run], run["status"]) for run in members])
    title = wrap(f"**Sharding strategies, one launch** ({launch_title(members, base)})")
    return "\n\n".join([title, table(header, lines), *(["\n".join(notes)] if notes else [])])


def sharding_tables(runs, base):
    return [sharding_table(members, base) for members in launches(runs)]


SHARDING_EXPLANATION = wrap(
    "Sharding tables (oss_benchmark.py): one per launch, never mixing two; each strategy against the ddp run of its "
    "own launch. vs ddp = rank 0's median throughput over that of the launch's ddp run; the phases are rank 0's "
    "medians over the instrumented pass (CUDA events, no host "
    "synchronisation); host ms per step = the host's time to queue one step's phases; collectives and MiB per step "
    "come from the profiled pass (torch.profiler), next to the analytic volume; optimizer state = the largest rank's; "
    "peak saving = the ddp run's peak memory minus the strategy's, over the same window.")


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
    if {"--coordinate-descent-tuning", "--sums-batch-norm", "--cuda-graphs"} <= set(extra):
        precision = extra[extra.index("--precision") + 1] if "--precision" in extra else "bf16"
        extra = f"the fastest mode in {precision}"  # performance.md's section of that name gives its options
    else:
        extra = f"`{' '.join(extra)}`"
    return f"{extra} / {options_text(options_a)}"


def comparison_result(document):
    """B / A with its 95 % interval and pairs, or the single pair a run cut short left, saying so."""
    pairs = document.get("pairs") if isinstance(document.get("pairs"), list) else []
    interval = document.get("interval_95")
    label = "" if document.get("like_for_like", True) else f" {ACROSS_BUILDS}"
    if not pairs or not is_number(document.get("ratio")):
        return f"no complete pair ({document.get('status')})"
    noisy = document.get("noisy_rounds") or 0
    noise = f"; {noisy} of {len(document.get('rounds') or [])} rounds noisy" if noisy else ""
    if isinstance(interval, list) and len(interval) == 2:
        return (f"{document['ratio']:.3f}{label} (95 % interval {interval[0]:.3f}–{interval[1]:.3f}; "
                f"{len(pairs)} pairs{noise})")
    return (f"{document['ratio']:.3f}{label} from {len(pairs)} pair, no interval (stopped: {document.get('status')}"
            f"{noise})")


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


def detectable_percent(logs, pairs):
    """The smallest B/A difference (per cent) whose 95 % interval excludes 1 after this many pairs, at the spread of
    these log pair ratios: t(0.975, pairs - 1) x their standard deviation / sqrt(pairs)."""
    from scipy.stats import t
    return 100 * (math.exp(t.ppf(0.975, pairs - 1) * statistics.stdev(logs) / math.sqrt(pairs)) - 1)


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
                     *(f"±{detectable_percent(logs, pairs):.1f} %" for pairs in (4, 8, 16, 32)),
                     link(path, base)])
    header = ["command (A and B)", "GPU", "pair ratios", "spread (sd of log ratio)", "4 pairs", "8 pairs",
              "16 pairs", "32 pairs", "file"]
    return table(header, rows) if rows else "No A/A comparisons (compare.py with one command as A and B)."


# ---------------------------------------------------------------------------- the report

EXPLANATION = wrap(
    "Each row is one configuration. Throughput = images of all ranks / wall time of the timed steps; rank 0's median "
    "throughput ± MAD comes from its per-step times; MFU = achieved FLOP/s over the GPU's dense peak (— where there "
    "is no peak, as on the CPU); peak memory = the largest `max_memory_allocated` over the ranks (n/a on the CPU), "
    "over the steps its column or figure names (figures over different steps are never compared). Repeats of a "
    "configuration that ended ok are aggregated: the median over the runs, the range over every run and its spread "
    "(max − min) / median, and how many runs and machines they are. Runs that did not end ok (✗) get a row each and "
    "stay out of every comparison. A ratio is computed only between runs of the same machine (GPU UUIDs), commit and "
    f"software; any other pair is labelled \"{ACROSS_MACHINES}\" or \"{ACROSS_BUILDS}\". \"{NOISY}\" marks results "
    "that found their own run unsteady (its two halves differ, or the host bounds the step): one such run is not "
    f"enough; \"{UNKNOWN_STABILITY}\" marks results written before the scripts judged it.")


def runs_of(rows):
    return [run for row in rows for run in row["runs"]]


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
        parts += sharding_tables(runs_of(setup_rows), base)
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
        everything = [t for row in shown for t in row["step_times_ms"] if t > 0]
        narrow = max(everything) < 10 * min(everything)  # within a decade: finer labelled ticks
        axis.xaxis.set_major_locator(plt.LogLocator(subs=(1, 1.5, 2, 3, 5, 7) if narrow else (1, 2, 5)))
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


# ---------------------------------------------------------------------------- generated answers

ANY = object()  # a setting an answer does not restrict
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
COMPILED_TWO = {"world_size": 2, "compile_mode": "default", "compiled_ddp": "ddp_optimizer"}
COMPUTATION_SETTINGS = ("stem_conv", "max_pool_backward", "batch_norm")
# The interleaved measurement of the twin's loop lives in experiments/, not in results/: quoted as it stands.
INTERLEAVED = ("0.956 (29 runs on 5 machines, 95 % interval 0.953–0.960)",
               "experiments/lightning-interleaved/README.md")


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
        value is ANY or not applies(name, run["config"]) or matches(setting_of(run, name), value)
        for name, value in wanted.items())]


def matches(setting, wanted):
    return setting in wanted if isinstance(wanted, tuple) else setting == wanted


def counted(runs, what="run"):
    count, machines = len(runs), len({run["machine"] for run in runs} - {None})
    return f"{count} {what}{'s' * (count != 1)} on {machines} machine{'s' * (machines != 1)}"


def rates_text(runs, digits=0):
    """The range of throughput over every run, with how many runs and machines: '4,698–4,751 img/s (27 runs on
    14 machines)'."""
    if not runs:
        return "not measured"
    rates = [rate(run) for run in runs]
    return f"{range_text(rates, lambda value: f'{value:,.{digits}f}')} img/s ({counted(runs)})"


def median_text(runs):
    rates = [rate(run) for run in runs]
    return (f"{statistics.median(rates):,.0f} img/s (median of {counted(runs)}, "
            f"{range_text(rates, lambda value: f'{value:,.0f}')})")


def mfu_text(runs):
    values = [run["mfu"] for run in runs if run["mfu"] is not None]
    return f"{range_text(values, percent_text)} %" if values else NO_PEAK


def ratio_of(numerators, denominators, as_percent=False):
    """B / A under the pairing rules: the range over every like-for-like run of B with their count, else the medians'
    ratio labelled (never a headline)."""
    if not numerators or not denominators:
        return "not measured"
    text = (lambda value: f"{value * 100:.1f}") if as_percent else ratio_text
    unit = " %" if as_percent else ""
    paired = paired_ratios(numerators, denominators)
    if paired.values:
        unpaired = len(numerators) - len(paired.runs)
        alone = f"; {unpaired} more unpaired" if unpaired else ""
        return f"{range_text(paired.values, text)}{unit} ({counted(paired.runs)}{alone})"
    median = statistics.median(map(rate, numerators)) / statistics.median(map(rate, denominators))
    return f"{text(median)}{unit}, {paired.label}"


def scaling_values(runs, base_runs):
    """(efficiencies, their runs) of the runs that have base runs of their GPUs, commit and software."""
    if not runs or not base_runs:
        return [], []
    base_count = min(run["config"].world_size for run in base_runs)
    paired = [(run, scaling_figures(run, base_runs, base_count)) for run in runs]
    paired = [(run, figures[1]) for run, figures in paired if figures]
    return [value for _, value in paired], [run for run, _ in paired]


def scaling_of(runs, base_runs):
    """Scaling efficiency of each run against base runs on its own GPUs (same commit and software), as a range."""
    if not runs:
        return "not measured"
    values, paired = scaling_values(runs, base_runs)
    if not values:
        return f"{ACROSS_MACHINES}: no base runs of its GPUs, commit and software"
    unpaired = len(runs) - len(paired)
    alone = f"; {unpaired} more unpaired" if unpaired else ""
    return f"{range_text(values, percent_text)} % ({counted(paired)}{alone})"


def files_text(runs, base, limit=3):
    """Links to the result files, or to their campaign folders where there are more than limit."""
    paths = sorted({run["path"].resolve() for run in runs})
    if len(paths) <= limit:
        return ", ".join(link(path, base) for path in paths)
    folders = sorted({path.parent for path in paths})
    shown = ", ".join(link(folder, base, folder.name) for folder in folders[:limit])
    more = f" and {len(folders) - limit} more" if len(folders) > limit else ""
    return f"{len(paths)} files in {shown}{more}"


class Evidence:
    """The committed runs and launches an answer document draws on, with the document's folder for its links."""

    def __init__(self, runs, document):
        self.runs, self.base = runs, (REPOSITORY / document).parent
        self.launches = launches(runs)

    def pick(self, **settings):
        return pick(self.runs, **settings)

    def files(self, *groups, limit=3):
        return files_text([run for group in groups for run in group], self.base, limit)

    def sharding(self, strategy, **settings):
        """(ratios of rank 0's medians strategy / ddp, one per launch that ran both under settings, those runs)."""
        ratios, used = [], []
        for members in self.launches:
            chosen = pick(members, benchmark=OSS, strategy=strategy, **settings)
            baselines = pick(members, benchmark=OSS, strategy="ddp", **settings)
            if chosen and baselines and unlike(chosen[0], baselines[0]) is None:
                ratios.append(chosen[0]["rank0_median"] / baselines[0]["rank0_median"])
                used += [chosen[0], baselines[0]]
        return ratios, used


SHARDING_SGD = {"fsdp_units": "model", "fsdp_param_dtype": "fp32", "preset": None, "cudnn_deterministic": False,
                "world_size": 2, "optimizer_impl": ANY, "cudnn_benchmark_limit": ANY, "comm_hook": ANY,
                "coordinate_descent_tuning": ANY}


def launches_text(ratios, used):
    if not ratios:
        return "not measured"
    launched = len(ratios)
    return (f"{range_text(ratios, percent_text)} % ({launched} launch{'es' * (launched != 1)} on "
            f"{len({run['machine'] for run in used})} machine{'s' * (len({run['machine'] for run in used}) != 1)})")


def summary_answers(e):
    """README.md's results summary: one compact table, and where the raw files are listed."""
    default, two = e.pick(), e.pick(world_size=2)
    two_nobb, compiled_base = e.pick(world_size=2, broadcast_buffers=False), e.pick(compile_mode="default")
    compiled = e.pick(**COMPILED_TWO, bucket_cap_mb=50.0, broadcast_buffers=False)
    twin_two = {**TWIN, "world_size": 2, "lightning_ddp_side_stream": ANY}
    sigterm = e.pick(**twin_two, gradient_as_bucket_view=False, lightning_sigterm_sync=True)
    no_sigterm = e.pick(**twin_two, gradient_as_bucket_view=False, lightning_sigterm_sync=False)
    matched = e.pick(**TWIN, world_size=2, lightning_ddp_side_stream=False, lightning_sigterm_sync=False)
    side = e.pick(**TWIN, world_size=2, lightning_ddp_side_stream=(True, None), lightning_sigterm_sync=False)
    used = [run for name in SHARDING_ORDER[1:] for run in e.sharding(name, **SHARDING_SGD)[1]]
    saved = [run["analysis"]["memory"]["expected_optimizer_state_saving_bytes_vs_ddp"] / MIB for run in used
             if run["config"].strategy == "zero1"]
    peaks = [run["peak_allocated_mib"] for run in used if run["config"].strategy == "ddp"]
    rows = [["DDP speed", "1 GPU, eager (the default)", rates_text(default)],
            ["DDP speed", "1 GPU, the fastest mode (fp16, compiled, captured, tuned)", median_text(e.pick(**FASTEST))],
            ["DDP scaling", "2 GPUs, eager, the defaults", scaling_of(two, default)],
            ["DDP scaling", "2 GPUs, eager, `--no-broadcast-buffers`", scaling_of(two_nobb, default)],
            ["DDP scaling", "2 GPUs, compiled, 50 MB buckets, no buffer broadcast",
             scaling_of(compiled, compiled_base)],
            ["Lightning cost", "1 GPU / native", ratio_of(e.pick(**TWIN), default)],
            ["Lightning cost", "2 GPUs, the matched variant's pieces / native", ratio_of(matched, two)],
            ["Lightning cost", "2 GPUs, DDP on Lightning's side stream / native", ratio_of(side, two)],
            ["Lightning cost", "2 GPUs, the twin with its SIGTERM broadcast / without", ratio_of(sigterm, no_sigterm)],
            ["Lightning cost", "1 GPU, 32 images (host-bound), matched, interleaved", INTERLEAVED[0]],
            *[["sharding speed", f"2 GPUs, {label} / DDP", launches_text(*e.sharding(name, **SHARDING_SGD))]
              for name, label in (("oss_ddp", "OSS + DDP"), ("oss_sharded_ddp", "OSS + ShardedDDP"),
                                  ("fsdp_zero2", "FSDP2 ZeRO-2 (one unit)"))],
            ["sharding memory", "2 GPUs, optimizer state saved (SGD) / peak",
             f"{range_text(saved, lambda value: f'{value:.1f}')} MiB of {range_text(peaks, format_mib)} MiB"]]
    return "\n\n".join([table(["question", "configuration", "result"], rows), wrap(
        "Ratios pair runs of one machine, commit and software; ranges cover every committed repeat. Every result file "
        "behind these figures: [docs/results.md](docs/results.md); the speed questions in detail: "
        "[docs/performance.md](docs/performance.md); sharding: [docs/sharding.md](docs/sharding.md).")])


def performance_answers(e):
    """docs/performance.md's answers table."""
    default, fastest = e.pick(), e.pick(**FASTEST)
    two, two_nobb = e.pick(world_size=2), e.pick(world_size=2, broadcast_buffers=False)
    compiled_base = e.pick(compile_mode="default")
    compiled = e.pick(**COMPILED_TWO, bucket_cap_mb=50.0, broadcast_buffers=False)
    every_compiled = e.pick(**{**COMPILED_TWO, "compiled_ddp": ANY}, bucket_cap_mb=ANY, broadcast_buffers=ANY)
    small = {"batch_size_per_device": 32}
    twins = [("1 GPU, 256", e.pick(**TWIN), default),
             ("2 GPUs, 256, DDP on the current stream", e.pick(**TWIN, world_size=2, lightning_ddp_side_stream=False,
                                                               lightning_sigterm_sync=False), two),
             ("2 GPUs, 256, DDP on Lightning's side stream (stock's)",
              e.pick(**TWIN, world_size=2, lightning_ddp_side_stream=(True, None), lightning_sigterm_sync=False), two),
             ("1 GPU, 32, `--compile --cuda-graphs`", e.pick(**TWIN, **small, compile_mode="default", cuda_graphs=True),
              e.pick(**small, compile_mode="default", cuda_graphs=True)),
             ("1 GPU, the fastest mode", e.pick(**TWIN, **FASTEST), fastest)]
    rows = [
        ["default speed, one H200, 256 images", f"{rates_text(default)}, MFU {mfu_text(default)} (eager, bf16, "
         "channels_last)", "[What a result's numbers are worth](noise.md#what-a-results-numbers-are-worth)"],
        ["fastest measured, one H200", f"{median_text(fastest)}, MFU {mfu_text(fastest)}; against the default on "
         f"the same GPU: {ratio_of(fastest, default)}", "[The fastest mode](#the-fastest-mode)"],
        ["two GPUs, eager", f"{scaling_of(two_nobb, default)} scaling with `--no-broadcast-buffers`, "
         f"{scaling_of(two, default)} with the scripts' defaults", "[Two GPUs](#two-gpus-scaling)"],
        ["two GPUs, compiled", f"{scaling_of(compiled, compiled_base)} with 50 MB buckets and no buffer broadcast; "
         f"{scaling_of(every_compiled, compiled_base)} over every compiled 2-GPU run: the compiled step runs at the "
         "H200's 700 W power limit", "[Compiled](#compiled-steps-on-two-gpus)"],
        ["32 images per GPU", f"eager is host-bound: {rates_text(e.pick(**small))}; captured "
         f"{rates_text(e.pick(**small, cuda_graphs=True))}; compiled and captured "
         f"{rates_text(e.pick(**small, compile_mode='default', cuda_graphs=True))}",
         "[32 images](#one-gpu-32-images-host-bound)"],
        ["the twin against native", "; ".join(f"{label}: {ratio_of(twin, native)}" for label, twin, native in twins)
         + f"; host-bound, 1 GPU, 32 eager, interleaved in one process: {INTERLEAVED[0]}",
         "[The twin](#the-lightning-twin-in-these-modes)"]]
    return table(["question", "answer", "evidence"], rows)


ONE_GPU_MODES = [  # docs/performance.md's one-GPU table: (mode, settings, bold)
    ("eager fp32 with TF32 (`--precision fp32`)", {"precision": "fp32"}, False),
    ("eager bf16, channels_last (the default)", {}, True),
    ("eager bf16, `--cuda-graphs`", {"cuda_graphs": True}, False),
    ("eager fp16 with PyTorch's GradScaler (`--precision fp16`)", {"precision": "fp16", "loss_scale": "dynamic"},
     False),
    ("eager fp16, `--loss-scale 1024`", {"precision": "fp16", "loss_scale": 1024.0}, False),
    ("`--compile`, bf16", {"compile_mode": "default"}, False),
    ("`--compile`, fp16 with the GradScaler", {"compile_mode": "default", "precision": "fp16", "loss_scale": "dynamic"},
     False),
    ("`--compile --cuda-graphs`, bf16", {"compile_mode": "default", "cuda_graphs": True}, False),
    ("`--compile --cuda-graphs`, bf16, 512 images", {"compile_mode": "default", "cuda_graphs": True,
                                                     "batch_size_per_device": 512}, False),
    ("`--compile --cuda-graphs --coordinate-descent-tuning`, bf16", {"compile_mode": "default", "cuda_graphs": True,
                                                                      "coordinate_descent_tuning": True}, False),
    ("`--compile-mode max-autotune-no-cudagraphs --cuda-graphs`, bf16, convolutions left to cuDNN "
     "(`TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS=ATEN`)",
     {"compile_mode": "max-autotune-no-cudagraphs", "cuda_graphs": True, "coordinate_descent_tuning": True,
      "inductor_environment": {"TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS": "ATEN"}}, False),
    ("`--compile --cuda-graphs --coordinate-descent-tuning`, fp16 `--loss-scale 1024`",
     {key: value for key, value in FASTEST.items() if key not in COMPUTATION_SETTINGS}, False),
    ("+ `--space-to-depth-stem --dense-max-pool-backward`", {**FASTEST, "batch_norm": "torchvision"}, False),
    ("+ `--sums-batch-norm`: the fastest mode", FASTEST, True)]


def one_gpu_answers(e):
    """docs/performance.md's one-GPU table: every repeat of each mode, against the default on the same GPU."""
    default, rows = e.pick(), []
    for mode, settings, bold in ONE_GPU_MODES:
        runs = e.pick(**settings)
        rates = [rate(run) for run in runs]
        figure = "not measured" if not runs else f"{rates[0]:,.0f} ({counted(runs)})" if len(runs) == 1 else \
            f"{statistics.median(rates):,.0f} ({range_text(rates, lambda value: f'{value:,.0f}')}; {counted(runs)})"
        against = "1.00" if not settings else ratio_of(runs, default)
        strong = (lambda text: f"**{text}**") if bold else (lambda text: text)
        of_tf32 = " of TF32" if settings.get("precision") == "fp32" and runs else ""  # TF32's peak is the divisor
        rows.append([strong(mode), strong(figure), against, mfu_text(runs) + of_tf32, e.files(runs, limit=2)])
    return table(["mode (options)", "img/s: median (range; runs)", "× default (same GPU, commit and software)", "MFU",
                  "files"], rows)


def sharding_answers(e):
    """docs/sharding.md's table of one launch at 224 px (SGD), each strategy also over every launch like it."""
    members = next(members for members in e.launches
                   if members[0]["path"].name.startswith("x5-sharding-2gpu-bf16-256-sgd-"))
    baseline = next(run for run in members if run["config"].strategy == "ddp")
    rows = []
    for run in members:
        analysis = run["analysis"] or {}
        phases = phase_ms(analysis)
        syncs = [phases[name] for name in ("parameter_sync", "parameter_sync_before_forward") if phases[name]]
        host = analysis.get("host_phase_sum_ms_median_per_rank") or []
        ratios, used = e.sharding(run["config"].strategy, **SHARDING_SGD) if run is not baseline else ([1.0], [run])
        saved = baseline["peak_allocated_mib"] - run["peak_allocated_mib"]
        rows.append([run["config"].strategy, rank0_cell(row_of([run], "ok")), versus_ddp(run, baseline),
                     launches_text(ratios, used) if run is not baseline else "100.0 %",
                     " / ".join(format_number(phases[name], 2) for name in ("forward", "backward", "optimizer_step"))
                     + f" / {format_number(sum(syncs) if syncs else None, 2)}",
                     " / ".join(format_number(value, 1) for value in host) or "–",
                     format_number(analysis.get("phase_sum_ms_median"), 1), collectives_cells(analysis)[0],
                     f"{format_mib(run['peak_allocated_mib'])}" + (f" ({saved:,.0f})" if run is not baseline else "")])
    return table(["strategy", "img/s (rank 0) ± MAD", "vs ddp", "vs ddp, every launch like it",
                  "forward / backward / step / sync ms", "host ms per step", "GPU ms per step", "collectives per step",
                  "peak MiB (saved)"], rows)


def lightning_answers(e):
    """lightning/README.md's cost table: each twin run against the native runs of its machine, commit and software."""
    two, no_views = e.pick(world_size=2), e.pick(world_size=2, gradient_as_bucket_view=False)
    twin_two = {**TWIN, "world_size": 2}
    cases = [("stock pieces both (side stream, SIGTERM broadcast; bucket views off)",
              e.pick(**twin_two, gradient_as_bucket_view=False, lightning_sigterm_sync=True,
                     lightning_ddp_side_stream=ANY), no_views),
             ("side stream only (no broadcast; bucket views off)",
              e.pick(**twin_two, gradient_as_bucket_view=False, lightning_sigterm_sync=False,
                     lightning_ddp_side_stream=ANY), no_views),
             ("side stream only (bucket views on)",
              e.pick(**twin_two, lightning_ddp_side_stream=(True, None), lightning_sigterm_sync=False), two),
             ("DDP on the current stream, no broadcast (the matched variant's pieces)",
              e.pick(**twin_two, lightning_ddp_side_stream=False, lightning_sigterm_sync=False), two),
             ("one GPU (no DDP, no broadcast: stock and matched run alike)", e.pick(**TWIN), e.pick())]
    rows = []
    for label, twins, natives in cases:
        partners = [base for base in natives if any(unlike(run, base) is None for run in twins)] or natives
        rows.append([label, rates_text(twins), rates_text(partners), ratio_of(twins, natives),
                     e.files(twins, partners, limit=4)])
    return table(["run (256 per GPU)", "Lightning img/s", "native img/s (its partners, else every one)",
                  "Lightning / native", "files"], rows)


def sections(runs, comparisons):
    """{name: function of a document (its path in the repository) giving its generated block}: report.py's, from
    the runs and comparisons, and scaling_model.py's."""
    def answer(build):
        return lambda document: build(Evidence(runs, document))
    return {"summary": answer(summary_answers), "performance": answer(performance_answers),
            "one-gpu": answer(one_gpu_answers), "sharding": answer(sharding_answers),
            "lightning-cost": answer(lightning_answers),
            "results": lambda document: render_markdown(runs, (REPOSITORY / document).parent, "##", comparisons),
            "comparisons": lambda document: comparisons_table(comparisons, (REPOSITORY / document).parent),
            "noise": lambda document: noise_table(comparisons, (REPOSITORY / document).parent),
            **tool_module("scaling_model").SECTIONS}


def tool_module(name):
    """Another analysis tool of the repository (scaling_model.py), imported from its file."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, REPOSITORY / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def differences(current, reference):
    """The fields in which reference's configuration differs from current's, as 'name here/there'."""
    found = [f"{field} {getattr(current, field)}/{getattr(reference, field)}" for field in Config._fields
             if field not in ("torch", "options") and getattr(current, field) != getattr(reference, field)]
    mine, theirs = dict(current.options), dict(reference.options)
    found += [f"{name} {mine[name].strip(chr(34))}/{theirs[name].strip(chr(34))}"
              for name in sorted(mine.keys() & theirs.keys()) if mine[name] != theirs[name]]
    return found


def fitted(starts, items, limit=MAX_LINE):
    """The first of starts (longer to shorter) that can be followed by at least one of items, with as many items
    (comma-separated) as fit within limit characters, then how many were left out."""
    for start in starts:
        for count in range(len(items), 0, -1):
            left = len(items) - count
            text = start + ", ".join(items[:count]) + (f" and {left} more" if left else "")
            if len(text) <= limit:
                return text
    return (starts[-1] + f"{len(items)} fields")[:limit]


INCOMPARABLE = "incomparable: no result in {where} has the configuration of {name}; the nearest differs in "
UNCHECKED = ("report.py: warning: {name}: not checked, no reference in {where} with its configuration; the nearest "
             "differs in ")


def mismatch_line(template, name, run, references, reference_path, limit=MAX_LINE):
    """template with the paths as given, else with their file names only, then the fields in which the nearest
    reference differs, as many as fit within limit characters."""
    where = display_path(reference_path, pathlib.Path.cwd())
    starts = [template.format(name=name, where=where),
              template.format(name=pathlib.Path(name).name, where=pathlib.Path(where).name)]
    return fitted(starts, nearest_difference(run["config"], references), limit)


def nearest_difference(config, references):
    """The differing fields of the reference configuration nearest to config (the fewest differences)."""
    return min((differences(config, row["config"]) for row in references), key=lambda found: (len(found), found))


def describe(config):
    return (f"{config.benchmark} {config.strategy} on {devices_text(config)} × {config.device_name}, "
            f"{config.batch_size_per_device} img/{unit_of(config)}, {config.image_size} px, {config.precision}")


def check_run(run, reference, tolerance, name):
    """(violations, notes) of one current run against its reference row."""
    violations, notes = [], []
    noisy = f" ({NOISY}: {run['noisy_reason'] or 'unsteady'})" if run["noisy"] else ""
    current_rate, reference_rate = rate(run), reference["images_per_second"]
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
    add("paths", nargs="*", metavar="PATH", help="result files or folders (searched recursively)")
    add("--markdown", metavar="OUT.md", help="write the Markdown report to this file (default: stdout)")
    add("--sharding", action="store_true", help="print only the sharding tables of oss_benchmark.py, one per launch")
    add("--plots", metavar="DIR", help="write PNG plots into this folder (needs matplotlib)")
    add("--check-against", metavar="REF", help="reference result file or folder: exit 1 on a regression")
    add("--tolerance", help="allowed throughput drop and memory rise, 5%% or 0.05 (default 5%%)")
    add("--docs", action="store_true", help="regenerate every generated block of the documents from results/")
    add("--check-docs", action="store_true", help="exit 1 when a generated block differs from what --docs writes")
    args = parser.parse_args(argv)
    if (args.docs or args.check_docs) and (args.paths or args.markdown or args.sharding or args.plots
                                           or args.check_against):
        raise UsageError("--docs and --check-docs read results/ and take no other option")
    if not args.paths and not (args.docs or args.check_docs):
        raise UsageError("the following arguments are required: PATH")
    if args.tolerance is not None and not args.check_against:
        raise UsageError("--tolerance needs --check-against")
    if args.sharding and args.markdown:
        raise UsageError("--sharding prints to stdout: drop --markdown")
    args.tolerance = parse_tolerance("5%" if args.tolerance is None else args.tolerance)
    return args


def main_docs(check):
    """Regenerate (or check) every generated block of the documents, from the repository's folder."""
    runs, comparisons = load_documents([REPOSITORY / "results"])
    here = os.getcwd()
    os.chdir(REPOSITORY)  # scaling_model.py's sections name their files relative to it
    try:
        blocks = sections(runs, comparisons)
        return check_documents(blocks) if check else update_documents(blocks)
    finally:
        os.chdir(here)


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
    checked = None
    if args.check_against:  # an unusable reference ends the run before anything is written
        reference_runs = load_runs([args.check_against], what="reference")
        if not reference_runs:
            raise UsageError(f"--check-against {args.check_against}: no result files")
        checked = check_against(runs, reference_runs, args.tolerance, args.check_against)
    if args.plots:
        prepare_plots(args.plots)
    if args.markdown:
        write_markdown(runs, comparisons, args.markdown)
    elif args.sharding:
        print(render_sharding(runs, pathlib.Path.cwd()), end="")
    else:
        print(render_markdown(runs, pathlib.Path.cwd(), heading="##", comparisons=comparisons), end="")
    if args.plots:
        print_plots(runs, args.plots)
    if checked is None:
        return EXIT_OK
    for line in checked[1]:
        print(line, file=sys.stderr if line.startswith("report.py:") else sys.stdout)
    return checked[0]


if __name__ == "__main__":
    run_cli(main, "report.py")
