"""What the GPUs' clocks and power did during each run's timed steps.

Reads an nvidia-smi log written with

    nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,\
clocks_event_reasons.active --format=csv -lms 100 > nvidia-smi.csv

(as `tools/gpu_evidence.sh` does; plain or gzipped; power.limit may be missing) and result files, and prints,
per run and GPU, the samples inside the result's `throughput.rank0_timed_window_utc`: their count, the mean SM
clock, the mean power draw against the limit, the share of samples under the software power cap
(clocks_event_reasons bit 0x4) and the mean temperature. The log's timestamps are taken as UTC (the device
machines keep UTC). One GPU per row, so a one-GPU run shows what its neighbour did too.

    python tools/telemetry.py results/DIR/nvidia-smi.csv.gz results/DIR/*.json [--json FILE]
"""
import argparse
import csv
import datetime
import gzip
import json
import os
import pathlib
import sys

SW_POWER_CAP = 0x4
COLUMNS = {"timestamp": "timestamp", "index": "index", "clocks.current.sm [MHz]": "sm_mhz",
           "power.draw [W]": "power_w", "power.limit [W]": "limit_w", "temperature.gpu": "temperature_c",
           "clocks_event_reasons.active": "reasons"}


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):  # one line naming the rule, exit 2 (argparse adds a usage line)
        self.exit(2, f"{self.prog}: error: {message}\n")


def number(text):
    """'1980 MHz' -> 1980.0; '[N/A]' and the like -> None."""
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def read_samples(path):
    """The log's samples: dicts with time (naive UTC datetime), index, sm_mhz, power_w, limit_w,
    temperature_c, capped. Lines that are not samples (a repeated header, an error) are skipped."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", newline="") as handle:
        rows = list(csv.reader(handle, skipinitialspace=True))
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
        samples.append({"time": moment, "index": int(fields["index"]), "sm_mhz": number(fields["sm_mhz"]),
                        "power_w": number(fields["power_w"]), "limit_w": number(fields.get("limit_w", "")),
                        "temperature_c": number(fields.get("temperature_c", "")),
                        "capped": bool(reasons & SW_POWER_CAP)})
    return samples


def parse_utc(text):
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ")


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def summarise_run(result, samples):
    """Per GPU: the samples inside the run's timed window. None when the result has no window."""
    window = (result.get("throughput") or {}).get("rank0_timed_window_utc")
    if not window:
        return None
    start, end = (parse_utc(t) for t in window)
    rows = []
    for index in sorted({s["index"] for s in samples}):
        inside = [s for s in samples if s["index"] == index and start <= s["time"] <= end]
        rows.append({"gpu": index, "samples": len(inside), "sm_mhz": mean(s["sm_mhz"] for s in inside),
                     "power_w": mean(s["power_w"] for s in inside), "limit_w": mean(s["limit_w"] for s in inside),
                     "power_capped_share": sum(s["capped"] for s in inside) / len(inside) if inside else None,
                     "temperature_c": mean(s["temperature_c"] for s in inside)})
    return {"window_utc": window, "timed_wall_s": result["throughput"]["timed_wall_s"],
            "images_per_second": result["throughput"]["images_per_second"], "gpus": rows}


def fmt(value, pattern):
    return "n/a" if value is None else pattern.format(value)


def main(argv=None):
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="nvidia-smi CSV log (.csv or .csv.gz)")
    parser.add_argument("results", nargs="+", help="result JSON files")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    try:
        samples = read_samples(args.log)
    except (OSError, ValueError, UnicodeDecodeError) as error:
        parser.error(str(error))
    report = {}
    lines = ["| run | img/s | GPU | samples | SM MHz | power W (limit) | power-capped | °C |", "|---|---|---|---|---|---|---|---|"]
    for path in args.results:
        try:
            result = json.loads(pathlib.Path(path).read_text())
        except (OSError, ValueError) as error:
            parser.error(f"{path}: {error}")
        summary = summarise_run(result, samples)
        name = pathlib.Path(path).stem
        if summary is None:
            lines.append(f"| {name} | – | – | no timed window in the result | | | | |")
            continue
        report[name] = summary
        for row in summary["gpus"]:
            lines.append(f"| {name} | {summary['images_per_second']:,.0f} | {row['gpu']} | {row['samples']} | "
                         f"{fmt(row['sm_mhz'], '{:,.0f}')} | {fmt(row['power_w'], '{:.0f}')} "
                         f"({fmt(row['limit_w'], '{:.0f}')}) | {fmt(row['power_capped_share'], '{:.0%}')} | "
                         f"{fmt(row['temperature_c'], '{:.0f}')} |")
    print("\n".join(lines))
    if args.json:
        temporary = f"{args.json}.tmp{os.getpid()}"
        with open(temporary, "w") as handle:
            json.dump(report, handle, indent=1)
        os.replace(temporary, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
