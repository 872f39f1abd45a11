"""Pool interleave.py results: the Lightning/native block ratios of several runs, with two 95 % intervals for
their pooled median. The block bootstrap resamples blocks as if all were independent; the run bootstrap
resamples whole runs (then pools their blocks), since blocks of one run share a machine and a host moment, and
is the honest one when runs differ.

    python experiments/lightning-interleaved/pool.py \\
        experiments/lightning-interleaved/data/interleave-2gpu-bf16-32*.json
"""
import argparse
import json
import random
import statistics
import sys


def bootstrap_median_interval(groups, rounds=2000, seed=0):
    """95 % bootstrap interval of the median of the pooled values: each round draws len(groups) groups with
    replacement and pools their values. One value per group resamples values; whole runs resample runs."""
    rng = random.Random(seed)
    medians = sorted(statistics.median([v for group in rng.choices(groups, k=len(groups)) for v in group])
                     for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="interleave.py --output-json files")
    args = parser.parse_args(argv)
    runs = []
    for path in sorted(args.results):  # the same intervals whatever the order given
        try:
            with open(path) as handle:
                summary = json.load(handle)["summary"]
            ratios, median = summary["ratios"], float(summary["median_ratio"])
            if not ratios or not all(isinstance(r, (int, float)) for r in ratios):
                raise ValueError("no block ratios")
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"pool.py: error: {path} is not an interleave.py result ({error})", file=sys.stderr)
            return 2
        runs.append(ratios)
        print(f"{path}: {len(ratios)} blocks, median {median:.3f}")
    pooled = [ratio for run in runs for ratio in run]
    block = bootstrap_median_interval([[ratio] for ratio in pooled], rounds=4000)
    run = bootstrap_median_interval(runs, rounds=4000)
    print(f"pooled: {len(runs)} runs, {len(pooled)} blocks, median {statistics.median(pooled):.3f}; 95 % interval "
          f"{block[0]:.3f}-{block[1]:.3f} resampling blocks, {run[0]:.3f}-{run[1]:.3f} resampling runs; "
          f"median of the run medians {statistics.median(statistics.median(r) for r in runs):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
