"""Pool interleave.py results: the Lightning/native block ratios of several runs, with two 95 % intervals for
their pooled median. The block bootstrap resamples blocks as if all were independent; the run bootstrap
resamples whole runs (then pools their blocks), since blocks of one run share a machine and a host moment, and
is the honest one when runs differ.

    python docs/diagnostics/lightning-interleaved/pool.py results/interleave-1gpu-bf16-32*.json
"""
import argparse
import json
import random
import statistics
import sys


def pooled_median_intervals(runs, rounds=4000, seed=0):
    """runs: lists of block ratios. Returns (pooled median, block-bootstrap interval, run-bootstrap interval)."""
    rng = random.Random(seed)
    pooled = [ratio for run in runs for ratio in run]
    by_block, by_run = [], []
    for _ in range(rounds):
        by_block.append(statistics.median(rng.choices(pooled, k=len(pooled))))
        by_run.append(statistics.median([ratio for run in rng.choices(runs, k=len(runs)) for ratio in run]))
    low, high = int(0.025 * rounds), int(0.975 * rounds) - 1
    by_block.sort()
    by_run.sort()
    return statistics.median(pooled), (by_block[low], by_block[high]), (by_run[low], by_run[high])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="interleave.py --output-json files")
    args = parser.parse_args(argv)
    runs = []
    for path in sorted(args.results):  # the same intervals whatever the order given
        try:
            with open(path) as handle:
                summary = json.load(handle)["summary"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"pool.py: error: {path} is not an interleave.py result ({error})", file=sys.stderr)
            return 2
        runs.append(summary["ratios"])
        print(f"{path}: {len(summary['ratios'])} blocks, median {summary['median_ratio']:.3f}")
    median, block, run = pooled_median_intervals(runs)
    print(f"pooled: {len(runs)} runs, {sum(map(len, runs))} blocks, median {median:.3f}; 95 % interval "
          f"{block[0]:.3f}-{block[1]:.3f} resampling blocks, {run[0]:.3f}-{run[1]:.3f} resampling runs; "
          f"median of the run medians {statistics.median(statistics.median(r) for r in runs):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
