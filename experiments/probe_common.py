"""What the experiments' probes share: one-line errors (exit 2), the benchmark's summary statistics, argument
types, an atomic JSON write, an unwritable --json refused before any measuring, sizes that do not fit, and a timer
of single iterations (CUDA events on a GPU, the host clock on the CPU)."""
import argparse
import contextlib
import json
import os
import pathlib
import pstats
import sys
import sysconfig
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the benchmark script, imported as a module
from resnet50_ddp_benchmarks import benchmark_extras as extras  # noqa: F401  (the computation options the probes time)
import ddp_resnet50 as bench  # noqa: E402  (UsageError, OneLineArgumentParser, run_guarded, summarize)

UsageError, OneLineArgumentParser, summarize = bench.UsageError, bench.OneLineArgumentParser, bench.summarize


def run_guarded(main):
    """Bad input: one line naming the probe and the broken rule (rank 0 only), exit 2."""
    try:
        sys.exit(main())
    except UsageError as error:
        if os.environ.get("RANK", "0") == "0":
            print(f"{os.path.basename(sys.argv[0])}: error: {error}", file=sys.stderr, flush=True)
        sys.exit(2)


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def check_json_path(path, option="--json"):
    """An output file whose folder cannot be written is bad input, said before the measuring."""
    if not path:
        return
    folder = pathlib.Path(path).resolve().parent
    if not (folder.is_dir() and os.access(folder, os.W_OK)):
        raise UsageError(f"{option} directory {folder} cannot be written ({folder} is not a writable directory)")


def write_json(path, payload):
    """The whole file or none: a temporary file in the same folder, then a rename."""
    folder = os.path.dirname(os.path.abspath(path))
    with tempfile.NamedTemporaryFile("w", dir=folder, prefix=".probe-", suffix=".json", delete=False) as handle:
        json.dump(payload, handle, indent=1)
    os.replace(handle.name, path)


def ran_cpu_check(args, check, what):
    """--check runs `check` on the CPU (True: the probe is done); otherwise the probe needs a CUDA GPU."""
    check_json_path(args.json)
    if args.check:
        check()
        return True
    if not torch.cuda.is_available():
        raise UsageError(f"times {what} on a CUDA GPU and none is visible (--check runs on the CPU)")
    return False


def time_iterations(iteration, iterations, device):
    """Each of `iterations` calls of `iteration` timed on its own (CUDA events on a GPU, recorded between the
    calls without a host synchronisation; the host clock on the CPU): the benchmark's summary of the times, ms."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(iterations + 1)]
        marks[0].record()
        for index in range(iterations):
            iteration()
            marks[index + 1].record()
        torch.cuda.synchronize(device)
        return summarize([a.elapsed_time(b) for a, b in zip(marks, marks[1:])])
    times, last = [], time.perf_counter()
    for _ in range(iterations):
        iteration()
        now = time.perf_counter()
        times.append((now - last) * 1e3)
        last = now
    return summarize(times)


@contextlib.contextmanager
def fits_in_memory(what):
    """A size the device cannot hold (`what` names the option) is bad input: one line, not a traceback."""
    try:
        yield
    except RuntimeError as error:
        if not (isinstance(error, torch.OutOfMemoryError) or "can't allocate memory" in str(error)):
            raise
        raise UsageError(f"{what} does not fit in this device's memory") from None


def short_path(path):
    """A profiled function's file as the package or the working folder names it, not as this machine places it."""
    stdlib = sysconfig.get_paths()["stdlib"]
    path = path.split("site-packages" + os.sep)[-1].replace(stdlib, os.path.basename(stdlib))
    return path.removeprefix(os.getcwd() + os.sep)


def print_profile(profile, sort, lines, stream=None):
    """A cProfile profile's top `lines` by `sort`, its paths shortened (short_path)."""
    stats = pstats.Stats(profile, stream=stream)
    stats.stats = {(short_path(key[0]), *key[1:]): value for key, value in stats.stats.items()}
    stats.sort_stats(sort).print_stats(lines)
