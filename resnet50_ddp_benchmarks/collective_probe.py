"""Time the collectives of the launch at hand and fit each one's latency and bus bandwidth.

All-reduce, broadcast, all-gather and reduce-scatter are timed over a sweep of message sizes on the process group
(NCCL on GPUs, timed with CUDA events; gloo on the CPU, timed with the host clock): warm-up calls first, a barrier
before every timed call, each call's time the slowest rank's, the median over the repeats. Each collective's
medians are then fitted by least squares to

    time = alpha + size * factor / B

with alpha the latency (us) and B the bus bandwidth (GB/s) in nccl-tests' convention (doc/PERFORMANCE.md of
NVIDIA/nccl-tests): size is the whole buffer (all-gather: its output, reduce-scatter: its input) and factor is
2(n-1)/n for all-reduce, (n-1)/n for all-gather and reduce-scatter, 1 for broadcast. The fit weighs each size by
1/time^2, so that a 1 KiB message counts as much as a 64 MiB one. A device-local copy is timed the same way (its
"bandwidth" is bytes copied per second, its latency the cost of one more small kernel or copy): the per-call cost
of the extra copies that data parallelism adds to a step.

    torchrun --standalone --nproc-per-node 2 -m resnet50_ddp_benchmarks.collective_probe --output probe.json
    python -m resnet50_ddp_benchmarks.collective_probe --device cpu --output probe.json   # one process
    srun --ntasks-per-node 4 --gpus-per-node 4 python -m resnet50_ddp_benchmarks.collective_probe --output probe.json

Inside a run that already has a process group, on every rank (it is collective), e.g. after the timed steps:

    from resnet50_ddp_benchmarks.collective_probe import probe_collectives
    probe = probe_collectives(group=None, device=device)   # the same dict on every rank

Exit codes: 0 ok, 1 error (ranks that cannot meet within --timeout, an output that cannot be written: one line on
stderr), 2 bad input (one line on stderr, no file written).
"""

import argparse
import contextlib
import datetime
import json
import os
import pathlib
import re
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

PROG = "collective_probe.py"
SCHEMA = "collective_probe/1"
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
# nccl-tests' bus-bandwidth factors: bus bandwidth = size / time * factor(n)
# (one rank moves no bytes over a link: factor 0, no bus bandwidth; a local copy's factor is 1 on any group)
BUS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0 if n > 1 else 0.0,
               "local_copy": lambda n: 1.0}
# 1 KiB to 64 MiB (GPU) or 16 MiB (CPU, where gloo needs milliseconds per MiB), a factor of 4 apart
DEFAULT_SIZES = {"cuda": [4**k * 1024 for k in range(9)], "cpu": [4**k * 1024 for k in range(8)]}
DEFAULT_REPEATS, DEFAULT_WARMUP = 5, 2
ELEMENT_BYTES = 4  # float32, as DDP's gradients
EXIT_ERROR, EXIT_USAGE = 1, 2
SLEEP_CYCLES = 2_000_000  # about 1 ms of a GPU clock: the host queues the copies while the GPU waits


class UsageError(Exception):
    """Bad input: one line, exit code 2."""


class ProbeError(Exception):
    """The ranks could not meet, or the output could not be written: one line from the rank that saw it, exit 1."""


class OneLineArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def probe_collectives(group=None, device=None, sizes=None, repeats=DEFAULT_REPEATS, warmup=DEFAULT_WARMUP):
    """Time the four collectives and a local copy over `sizes` (bytes) on `group` (default: the default process
    group, which must be initialised), with tensors on `device` (default: the current CUDA device for NCCL, the CPU
    otherwise). Collective: every rank of the group calls it with the same arguments, and every rank gets the same
    dict back (JSON-able): sizes, medians, each collective's fit (latency_us, bus_bandwidth_gbps), its residuals,
    the backend and the world size."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("probe_collectives needs an initialised process group")
    group = group or dist.group.WORLD
    backend, world = str(dist.get_backend(group)), dist.get_world_size(group)
    device = torch.device(device) if device is not None else default_device(backend)
    sizes = check_sizes(sizes or DEFAULT_SIZES[device.type], world)
    if int(repeats) < 1 or int(warmup) < 0:
        raise ValueError("repeats must be at least 1 and warmup at least 0")
    timer = Timer(device, group)
    began = time.perf_counter()
    medians = {name: [timer.median_us(name, size, int(repeats), int(warmup)) for size in sizes]
               for name in (*COLLECTIVES, "local_copy")}
    return {
        "schema": SCHEMA, "backend": backend, "world_size": world, "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "timer": "cuda events" if device.type == "cuda" else "host clock",
        "sizes_bytes": sizes, "repeats": int(repeats), "warmup": int(warmup),
        "convention": "nccl-tests: size is the whole buffer; bus bandwidth = size / time * factor; "
                      "factor 2(n-1)/n all-reduce, (n-1)/n all-gather and reduce-scatter, 1 broadcast",
        "collectives": {name: summarise(name, sizes, medians[name], world) for name in medians},
        "torch": torch.__version__, "nccl": nccl_version() if backend == "nccl" else None,
        "wall_s": round(time.perf_counter() - began, 3),
    }


def default_device(backend):
    if backend == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_sizes(sizes, world):
    """Sizes in bytes, rounded down to whole float32 elements that split evenly over the ranks."""
    quantum = ELEMENT_BYTES * world
    rounded = sorted({max(quantum, int(size) // quantum * quantum) for size in sizes})
    if len(rounded) < 2:
        raise ValueError("the sweep needs at least two different message sizes to fit latency and bandwidth")
    return rounded


def nccl_version():
    version = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    return ".".join(map(str, version)) if isinstance(version, tuple) else version


class Timer:
    """Times one call of a collective (or local copy) on every rank and keeps the slowest rank's time."""

    def __init__(self, device, group):
        self.device, self.group = device, group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.root = dist.get_global_rank(group, 0) if group is not dist.group.WORLD else 0
        self.cuda = device.type == "cuda"

    def median_us(self, name, size, repeats, warmup):
        call = self.call(name, size)
        for _ in range(warmup):
            call()
        times = [self.timed(call, name) for _ in range(repeats)]
        slowest = torch.tensor(times, dtype=torch.float64, device=self.device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=self.group)
        return statistics.median(slowest.tolist())

    def call(self, name, size):
        """A closure that runs one call of `name` on buffers of `size` bytes (nccl-tests' size convention)."""
        count = size // ELEMENT_BYTES
        shard = count // self.world
        full = torch.ones(count, dtype=torch.float32, device=self.device)
        part = torch.ones(shard, dtype=torch.float32, device=self.device)
        if name == "all_reduce":
            return lambda: dist.all_reduce(full, group=self.group)
        if name == "broadcast":
            return lambda: dist.broadcast(full, src=self.root, group=self.group)
        if name == "all_gather":  # (the *_single names from torch 2.14; the older ones before)
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            return lambda: gather(full, part, group=self.group)
        if name == "reduce_scatter":
            scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            return lambda: scatter(part, full, group=self.group)
        copy = torch.empty_like(full)
        return lambda: copy.copy_(full)

    def timed(self, call, name):
        """One call's microseconds on this rank, the ranks lined up by a barrier first. A local copy is timed as
        the average of a burst queued behind a GPU sleep, so that its cost is the GPU's, not the host's launch."""
        self.barrier()
        burst = 20 if name == "local_copy" else 1
        if not self.cuda:
            began = time.perf_counter()
            for _ in range(burst):
                call()
            return (time.perf_counter() - began) * 1e6 / burst
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if burst > 1:
            torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        for _ in range(burst):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / burst

    def barrier(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)
            dist.barrier(group=self.group, device_ids=[self.device.index])
            torch.cuda.synchronize(self.device)
        else:
            dist.barrier(group=self.group)


def fit_latency_bandwidth(sizes, times_us, factor):
    """Weighted least squares of time = alpha + size * factor / B (weights 1/time^2). Returns (alpha_us, B_gbps);
    B is None when the factor is 0 (one rank: no bytes cross a link) or the times do not grow with size. A
    negative intercept is clamped to 0 and the slope refitted through the origin."""
    if factor <= 0:
        return statistics.median(times_us), None
    xs = [size * factor for size in sizes]
    weights = [1.0 / max(t, 1e-9) ** 2 for t in times_us]
    sw = sum(weights)
    mean_x = sum(w * x for w, x in zip(weights, xs)) / sw
    mean_t = sum(w * t for w, t in zip(weights, times_us)) / sw
    sxx = sum(w * (x - mean_x) ** 2 for w, x in zip(weights, xs))
    slope = sum(w * (x - mean_x) * (t - mean_t) for w, x, t in zip(weights, xs, times_us)) / sxx
    alpha = mean_t - slope * mean_x
    if alpha < 0:
        alpha = 0.0
        slope = sum(w * x * t for w, x, t in zip(weights, xs, times_us)) / sum(w * x * x for w, x in zip(weights, xs))
    if slope <= 0:
        return statistics.median(times_us), None
    return alpha, 1e-3 / slope  # bytes per us -> GB/s


def summarise(name, sizes, medians, world):
    factor = BUS_FACTORS[name](world)
    alpha, bandwidth = fit_latency_bandwidth(sizes, medians, factor)
    predicted = [alpha + (size * factor / (bandwidth * 1e3) if bandwidth else 0.0) for size in sizes]
    residuals = [round(m - p, 3) for m, p in zip(medians, predicted)]
    return {"median_us": [round(m, 3) for m in medians], "bus_factor": factor,
            "bus_bandwidth_gbps_per_size": [round(size * factor / (m * 1e3), 3) if m > 0 else None
                                            for size, m in zip(sizes, medians)],
            "fit": {"latency_us": round(alpha, 3), "bus_bandwidth_gbps": None if bandwidth is None else
                    round(bandwidth, 3), "residuals_us": residuals,
                    "max_relative_residual": round(max(abs(r) / m for r, m in zip(residuals, medians) if m > 0), 4)}}


# ---------------------------------------------------------------------------------------------------- command line

def parse_arguments(argv):
    parser = OneLineArgumentParser(prog=PROG, description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cuda (NCCL) or cpu (gloo)")
    parser.add_argument("--sizes", help="message sizes: a list (1K,64K,4M) or a sweep FIRST:LAST (1K:64M, x4 steps); "
                                        "default 1K:64M on GPUs, 1K:16M on the CPU")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="timed calls per size (their median)")
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed calls per size first")
    parser.add_argument("--output", help="write the JSON here (rank 0)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    parser.add_argument("--timeout", type=int, default=120, help="seconds a rank waits for the others")
    return parser.parse_args(argv)


def parse_size(text):
    match = re.fullmatch(r"\s*(\d{1,12})\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise UsageError(f"--sizes: {text!r} is not a size (bytes, or with K, M or G)")
    return int(match[1]) * 1024 ** " KMG".index(match[2].upper() or " ")


def parse_sizes(text, device):
    if text is None:
        return DEFAULT_SIZES[device]
    if ":" in text:
        first, last = (parse_size(part) for part in text.split(":", 1))
        if not 0 < first < last:
            raise UsageError("--sizes FIRST:LAST needs 0 < FIRST < LAST")
        sizes = [first]
        while sizes[-1] * 4 <= last:
            sizes.append(sizes[-1] * 4)
        return sizes if sizes[-1] == last else [*sizes, last]
    sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    if len(set(sizes)) < 2 or min(sizes) < 1:
        raise UsageError("--sizes needs at least two different positive sizes")
    return sizes


def detect_launch(env):
    """Rank, world size and local rank from torchrun's variables, else srun's, else one process."""
    def integer(name, default=None):
        text = env.get(name, None if default is None else str(default))
        if text is None or not re.fullmatch(r"\s*\d{1,9}\s*", text):
            raise UsageError(f"{name} is not set, but the other launcher variables are" if text is None else
                             f"{name}={text!r} is not a non-negative integer")
        return int(text)

    if "RANK" in env:
        rank, world = integer("RANK"), integer("WORLD_SIZE")
        local = integer("LOCAL_RANK", rank)
        addr, port = env.get("MASTER_ADDR") or "127.0.0.1", integer("MASTER_PORT", 29500)
    elif "SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env:
        rank, world, local = integer("SLURM_PROCID"), integer("SLURM_STEP_NUM_TASKS"), integer("SLURM_LOCALID")
        hosts = re.match(r"([^,\[]*)(?:\[([^\]]+)\])?", env.get("SLURM_STEP_NODELIST") or
                         env.get("SLURM_JOB_NODELIST") or "127.0.0.1")  # 'gpu[007-009],cpu1': gpu007
        addr = env.get("MASTER_ADDR") or hosts[1] + (re.split("[,-]", hosts[2])[0] if hosts[2] else "")
        port = integer("MASTER_PORT", 15000 + integer("SLURM_JOB_ID", 0) % 20000)
    else:
        return {"rank": 0, "world_size": 1, "local_rank": 0, "master_addr": "127.0.0.1", "master_port": None}
    if not (rank < world and port <= 65535):
        raise UsageError(f"inconsistent launcher variables: rank {rank} of {world}, port {port}")
    return {"rank": rank, "world_size": world, "local_rank": local, "master_addr": addr, "master_port": port}


def check_output(path, overwrite):
    """The output's rules, proved before any work (rank 0): an existing folder this process can write in (and make
    hard links in, without --overwrite: write_json_atomically() links), no file unless --overwrite."""
    target = pathlib.Path(path)
    if target.is_dir():
        raise UsageError(f"--output {path} is a folder: give a file path")
    if not target.parent.is_dir():
        raise UsageError(f"--output {path}: the folder {target.parent} does not exist")
    if (target.exists() or target.is_symlink()) and not overwrite:
        raise UsageError(f"--output {path} exists (use --overwrite to replace it)")
    try:
        with tempfile.TemporaryDirectory(prefix=f".{target.name}.", dir=target.parent) as trial:
            pathlib.Path(trial, "file").touch()
            if not overwrite:
                os.link(pathlib.Path(trial, "file"), pathlib.Path(trial, "link"))
    except OSError as error:
        what = "cannot hold hard links (use --overwrite)" if error.filename2 else "cannot be written"
        raise UsageError(f"--output {path}: the folder {target.parent} {what}: {error.strerror}") from None


def write_json_atomically(path, record, overwrite):
    """Whole or absent for readers, with the mode the umask gives a new file: a temporary file beside the target,
    then a rename (--overwrite) or a hard link, which replaces nothing that appeared meanwhile."""
    target = pathlib.Path(path)
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        umask = os.umask(0o077)
        os.umask(umask)
        os.fchmod(descriptor, 0o666 & ~umask)  # mkstemp's own is 0600
        with os.fdopen(descriptor, "w") as stream:
            json.dump(record, stream, indent=1)
            stream.write("\n")
            stream.flush()
            os.fsync(stream.fileno())
        if overwrite:
            os.replace(temporary, target)
        else:
            try:
                os.link(temporary, target)
            except FileExistsError:
                raise ProbeError(f"--output {path} appeared while the probe ran: left as it is, the probe not "
                                 f"written (use --overwrite to replace it)") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def table(record):
    lines = [f"{record['backend']}, {record['world_size']} ranks, {record['device_name']}: "
             f"{len(record['sizes_bytes'])} sizes, median of {record['repeats']}, {record['wall_s']} s",
             "| collective | latency us | bus bandwidth GB/s | largest relative residual |", "|---|---|---|---|"]
    for name, summary in record["collectives"].items():
        fit = summary["fit"]
        bandwidth = "-" if fit["bus_bandwidth_gbps"] is None else f"{fit['bus_bandwidth_gbps']:.2f}"
        lines.append(f"| {name} | {fit['latency_us']:.2f} | {bandwidth} | {fit['max_relative_residual']:.1%} |")
    return "\n".join(lines)


def initialise(launch, device, timeout):
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(launch["local_rank"] % torch.cuda.device_count())
    if launch["master_port"] is None:  # one process: a group of one, no launcher
        store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
        return
    # The ranks meet at rank 0's store, each rank waiting --timeout seconds per try (torch's client tries twice).
    # Each way of not meeting is one line naming it (ProbeError) instead of torch's traceback, and the C++ log
    # lines of its tries (each with a stack) are dropped; a rendezvous that succeeds shows them.
    addr, port, rank, world = launch["master_addr"], launch["master_port"], launch["rank"], launch["world_size"]
    where, wait, began = f"{addr}:{port}", datetime.timedelta(seconds=timeout), time.monotonic()
    try:
        socket.getaddrinfo(addr, port)
    except OSError:
        raise ProbeError(f"the master host {addr!r} (MASTER_ADDR) cannot be resolved") from None
    # torchrun's agent already serves a store at its MASTER_ADDR:MASTER_PORT: there every rank is its client.
    agent_serves = (os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and os.environ.get("MASTER_ADDR") == addr
                    and os.environ.get("MASTER_PORT") == str(port))
    with native_stderr_held():
        try:
            store = dist.TCPStore(addr, port, world, rank == 0 and not agent_serves, wait, wait_for_workers=False)
        except (RuntimeError, OSError) as error:  # torch's DistError is a RuntimeError
            if rank == 0 and not agent_serves:
                raise ProbeError(f"cannot serve the rendezvous at {where}: {first_line(error)}") from None
            raise ProbeError(f"no answer from the master (rank 0) at {where} in {time.monotonic() - began:.0f} s "
                             f"(--timeout {timeout}): is it running there? ({first_line(error)})") from None
        try:
            dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=wait)
        except (RuntimeError, OSError) as error:
            raise ProbeError(f"the {world} ranks did not all meet at {where} in {time.monotonic() - began:.0f} s "
                             f"(--timeout {timeout}): {first_line(error)}") from None


def first_line(error):
    """An exception's first line: torch's distributed errors go on with a C++ stack."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@contextlib.contextmanager
def native_stderr_held():
    """What is written to file descriptor 2 in the block (torch's C++ log lines) held back: written out after the
    block, or dropped when an exception ends it."""
    sys.stderr.flush()
    saved = os.dup(2)
    failed = False
    try:
        with tempfile.TemporaryFile() as held:
            os.dup2(held.fileno(), 2)
            try:
                yield
            except BaseException:
                failed = True
                raise
            finally:
                os.dup2(saved, 2)
                if not failed:
                    held.seek(0)
                    os.write(2, held.read())
    finally:
        os.close(saved)


def main(argv=None):
    args = parse_arguments(sys.argv[1:] if argv is None else argv)
    launch = detect_launch(os.environ)
    if args.repeats < 1 or args.warmup < 0 or not 0 < args.timeout <= 86400:
        raise UsageError("--repeats must be at least 1, --warmup at least 0, --timeout from 1 to 86400 seconds")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda needs a CUDA GPU and none is visible (use --device cpu)")
    try:
        sizes = check_sizes(parse_sizes(args.sizes, args.device), launch["world_size"])
    except ValueError as error:
        raise UsageError(f"--sizes: {error}") from None
    if args.output and launch["rank"] == 0:
        check_output(args.output, args.overwrite)
    initialise(launch, args.device, args.timeout)
    try:
        device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
        record = probe_collectives(device=device, sizes=sizes, repeats=args.repeats, warmup=args.warmup)
        record["launch"] = {key: launch[key] for key in ("world_size", "master_addr")}
        if launch["rank"] == 0:
            print(table(record), flush=True)
            if args.output:
                write_json_atomically(args.output, record, args.overwrite)
        return 0
    finally:
        dist.destroy_process_group()


def run_guarded(main_function):
    try:
        sys.exit(main_function())
    except UsageError as error:
        if (os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0") == "0":
            print(f"{PROG}: error: {error}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USAGE)
    except ProbeError as error:
        rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"
        print(f"{PROG}: error: rank {rank}: {error}", file=sys.stderr, flush=True)
        sys.exit(EXIT_ERROR)


if __name__ == "__main__":
    run_guarded(main)
