"""What the GPUs' clocks and power did during each run's timed steps.

Reads an nvidia-smi log written with

    nvidia-smi --query-gpu=timestamp,index,uuid,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,\
clocks_event_reasons.active --format=csv -lms 100 > nvidia-smi.csv

(as `tools/gpu_evidence.sh --telemetry` does; plain or gzipped; uuid and power.limit may be missing) and result
files, and prints, per run and GPU, the samples inside the run's window: their count, the mean SM clock, the mean
power draw against the limit, the share of samples under the software power cap (clocks_event_reasons bit 0x4) and
the mean temperature. The window is the timed steps where the result records them
(`throughput.rank0_timed_window_utc`), else the whole run (`started_at` for `wall_time_s` seconds, warm-up and
compilation included). The log's timestamps are taken as UTC. One GPU per row, so a one-GPU run shows what its
neighbour did too.

--sensitivity MS also asks how much rank 0's step time moved with its GPU's SM clock within each run's timed steps:
its steps are placed on the GPU's timeline from the timed window's start (the step times are CUDA-event times),
grouped into bins of MS milliseconds, and each bin's mean step time is fitted against the mean SM clock of the
samples in it (least squares). The slope, in ms per 100 MHz, is printed beside the slope that a step slowing in
proportion to the clock would have (median step / mean clock). Rank 0's GPU is found by the result's gpu_uuid when
the log has a uuid column, else it is --rank0-gpu INDEX.

    python tools/telemetry.py results/DIR/nvidia-smi.csv.gz results/DIR/*.json [--json FILE]
    python tools/telemetry.py LOG RUN.json... --sensitivity 500 [--rank0-gpu 0]
"""
import argparse
import csv
import datetime
import gzip
import io
import pathlib
import sys

from resnet50_ddp_benchmarks.analysis import (OneLineArgumentParser, UsageError, open_regular, read_result_file,
    run_cli, write_json_atomically)

SW_POWER_CAP = 0x4
COLUMNS = {"timestamp": "timestamp", "index": "index", "uuid": "uuid", "clocks.current.sm [MHz]": "sm_mhz",
           "power.draw [W]": "power_w", "power.limit [W]": "limit_w", "temperature.gpu": "temperature_c",
           "clocks_event_reasons.active": "reasons"}


def positive_ms(text):
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("must be a positive number of milliseconds")
    return value


def number(text):
    """'1980 MHz' -> 1980.0; '[N/A]' and the like -> None."""
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def read_samples(path):
    """The log's samples: dicts with time (naive UTC datetime), index, sm_mhz, power_w, limit_w,
    temperature_c, capped. Lines that are not samples (a repeated header, an error) are skipped."""
    with open_regular(path) as stream:  # a regular file: a link to /dev/zero is endless
        text = io.TextIOWrapper(gzip.GzipFile(fileobj=stream) if str(path).endswith(".gz") else stream, newline="")
        rows = list(csv.reader(text, skipinitialspace=True))
    if not rows or rows[0][0] != "timestamp":
        raise ValueError(f"{path}: not an nvidia-smi --format=csv log (no header line)")
    names = [COLUMNS.get(name.strip()) for name in rows[0]]
    for needed in ("timestamp", "index", "sm_mhz", "power_w", "reasons"):
        if needed not in names:
            raise ValueError(f"{path}: the log has no {needed} column")
    samples = []
    for row in rows[1:]:
        if len(row) != len(names) or row[0] == "timestamp":
            continue
        fields = {name: value.strip() for name, value in zip(names, row) if name}
        try:
            moment = datetime.datetime.strptime(fields["timestamp"], "%Y/%m/%d %H:%M:%S.%f")
            reasons = int(fields["reasons"], 16)
        except ValueError:
            continue
        samples.append({"time": moment, "index": int(fields["index"]), "uuid": fields.get("uuid"),
                        "sm_mhz": number(fields["sm_mhz"]),
                        "power_w": number(fields["power_w"]), "limit_w": number(fields.get("limit_w", "")),
                        "temperature_c": number(fields.get("temperature_c", "")),
                        "capped": bool(reasons & SW_POWER_CAP)})
    return samples


def parse_utc(text):
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ" if "." in text else "%Y-%m-%dT%H:%M:%SZ")


def timed_window(result):
    """The timed steps' (start, end) in UTC, or None when the result does not record them."""
    window = (result.get("throughput") or {}).get("rank0_timed_window_utc")
    return window and tuple(parse_utc(t) for t in window)


def run_window(result):
    """The timed steps' window, else the whole run's (start, end), else None."""
    if timed_window(result):
        return timed_window(result)
    if result.get("started_at") and result.get("wall_time_s") is not None:
        start = parse_utc(result["started_at"])
        return start, start + datetime.timedelta(seconds=result["wall_time_s"])
    return None


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def summarise_run(result, samples):
    """Per GPU: the samples inside the run's window (run_window). None when the result has none."""
    window = run_window(result)
    if not window:
        return None
    start, end = window
    rows = []
    for index in sorted({s["index"] for s in samples}):
        inside = [s for s in samples if s["index"] == index and start <= s["time"] <= end]
        rows.append({"gpu": index, "samples": len(inside), "sm_mhz": mean(s["sm_mhz"] for s in inside),
                     "power_w": mean(s["power_w"] for s in inside), "limit_w": mean(s["limit_w"] for s in inside),
                     "power_capped_share": sum(s["capped"] for s in inside) / len(inside) if inside else None,
                     "temperature_c": mean(s["temperature_c"] for s in inside)})
    throughput = result.get("throughput") or {}
    return {"window_utc": [t.isoformat(timespec="milliseconds") + "Z" for t in window],
            "window": "timed steps" if timed_window(result) else "whole run",
            "images_per_second": throughput.get("images_per_second"), "gpus": rows}


def rank0_gpu(result, samples, given):
    """The log's index of the GPU rank 0 ran on: by the result's gpu_uuid when the log has uuids, else given."""
    uuid = ((result.get("hardware") or {}).get("ranks") or [{}])[0].get("gpu_uuid")
    for sample in samples:
        if uuid and sample["uuid"] and sample["uuid"].removeprefix("GPU-") == uuid:
            return sample["index"]
    return given


def clock_sensitivity(result, samples, gpu, bin_ms):
    """Rank 0's step time against its GPU's SM clock within the run: a least-squares slope over bins of bin_ms
    milliseconds of the GPU timeline. None when the result records no timed window, when fewer than three bins hold
    both steps and samples, or when the clock did not move."""
    if not timed_window(result):
        return None
    start = timed_window(result)[0]
    times = result["step_times_ms_per_rank"][0]
    clocks = {}
    for sample in samples:
        offset_ms = (sample["time"] - start).total_seconds() * 1e3
        if sample["index"] == gpu and sample["sm_mhz"] is not None and 0 <= offset_ms <= sum(times):
            clocks.setdefault(int(offset_ms // bin_ms), []).append(sample["sm_mhz"])
    steps, elapsed = {}, 0.0
    for step_ms in times:  # a step belongs to the bin that holds its middle
        steps.setdefault(int((elapsed + step_ms / 2) // bin_ms), []).append(step_ms)
        elapsed += step_ms
    points = [(mean(clocks[b]), mean(steps[b])) for b in sorted(clocks) if b in steps]
    if len(points) < 3:
        return None
    mx, my = mean(p[0] for p in points), mean(p[1] for p in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    syy = sum((y - my) ** 2 for _, y in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    if sxx == 0:
        return None
    median_step = sorted(times)[len(times) // 2]
    return {"gpu": gpu, "bin_ms": bin_ms, "bins": len(points), "mean_sm_mhz": mx,
            "sm_mhz_range": [min(p[0] for p in points), max(p[0] for p in points)],
            "slope_ms_per_100_mhz": 100 * sxy / sxx, "correlation": sxy / (sxx * syy) ** 0.5 if syy else None,
            "proportional_ms_per_100_mhz": -100 * median_step / mx}


def fmt(value, pattern):
    return "n/a" if value is None else pattern.format(value)


def load_result(path):
    """A valid result file, with times that parse; UsageError (one line) otherwise."""
    result, problem = read_result_file(pathlib.Path(path))
    if problem:
        raise UsageError(f"{path}: {problem}")
    try:
        run_window(result)
    except (TypeError, ValueError):
        raise UsageError(f"{path}: its window (throughput.rank0_timed_window_utc, or started_at and wall_time_s) "
                         "is not UTC times (YYYY-MM-DDTHH:MM:SS[.mmm]Z)") from None
    return result


def main(argv=None):
    parser = OneLineArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="nvidia-smi CSV log (.csv or .csv.gz)")
    parser.add_argument("results", nargs="+", help="result JSON files")
    parser.add_argument("--json", help="also write the figures to this file, keyed by the result paths as given")
    parser.add_argument("--sensitivity", type=positive_ms, metavar="MS",
                        help="also fit rank 0's step time against its GPU's SM clock in bins of MS ms")
    parser.add_argument("--rank0-gpu", type=int, metavar="INDEX",
                        help="rank 0's GPU in the log, for logs without a uuid column")
    args = parser.parse_args(argv)
    try:
        samples = read_samples(args.log)
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise UsageError(str(error)) from None
    results = {path: load_result(path) for path in args.results}
    figures = {}
    lines = ["| run | img/s | GPU | samples | SM MHz | power W (limit) | power-capped | °C |",
             "|---|---|---|---|---|---|---|---|"]
    for path, result in results.items():
        summary = summarise_run(result, samples)
        name = pathlib.Path(path).stem
        if summary is None:
            lines.append(f"| {name} | – | – | no window in the result | | | | |")
            continue
        figures[path] = summary
        rate = "–" if summary["images_per_second"] is None else f"{summary['images_per_second']:,.0f}"
        for row in summary["gpus"]:
            lines.append(f"| {name}{'' if summary['window'] == 'timed steps' else ' (whole run)'} | {rate} | "
                         f"{row['gpu']} | {row['samples']} | "
                         f"{fmt(row['sm_mhz'], '{:,.0f}')} | {fmt(row['power_w'], '{:.0f}')} "
                         f"({fmt(row['limit_w'], '{:.0f}')}) | {fmt(row['power_capped_share'], '{:.0%}')} | "
                         f"{fmt(row['temperature_c'], '{:.0f}')} |")
    if args.sensitivity:
        lines += ["", f"Rank 0's step time against its GPU's SM clock, bins of {args.sensitivity:g} ms:", "",
                  "| run | GPU | bins | SM MHz (range of the bins) | ms per 100 MHz | r | if proportional |",
                  "|---|---|---|---|---|---|---|"]
        for path in figures:
            name, result = pathlib.Path(path).stem, results[path]
            gpu = rank0_gpu(result, samples, args.rank0_gpu)
            if gpu is None:
                raise UsageError(f"{path}: the log has no uuid column: name rank 0's GPU with --rank0-gpu INDEX")
            fit = clock_sensitivity(result, samples, gpu, args.sensitivity)
            figures[path]["clock_sensitivity"] = fit
            if fit is None:
                lines.append(f"| {name} | {gpu} | no fit: no timed window, fewer than 3 bins, or a clock that did not "
                             "move | | | | |")
                continue
            low, high = fit["sm_mhz_range"]
            lines.append(f"| {name} | {gpu} | {fit['bins']} | {fit['mean_sm_mhz']:,.0f} ({low:,.0f}–{high:,.0f}) | "
                         f"{fit['slope_ms_per_100_mhz']:+.2f} | {fmt(fit['correlation'], '{:+.2f}')} | "
                         f"{fit['proportional_ms_per_100_mhz']:+.2f} |")
    if args.json:
        try:
            write_json_atomically(args.json, figures)
        except OSError as error:
            raise UsageError(f"--json {args.json}: cannot be written ({error.strerror})") from None
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    run_cli(main, "telemetry.py")
