"""The checks the diagnostic probes share, on top of ddp_resnet50.py's harness (one-line errors, exit 2):
an unwritable --json refused before any measuring, the launch a distributed probe needs, and sizes that do not
fit in memory."""
import contextlib
import os
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import ddp_resnet50 as bench  # noqa: E402


def check_json_path(path, option="--json"):
    """An unwritable JSON path (the probes' --json, or `option`) is bad input, said before the measuring, not a
    traceback at its end."""
    if path:
        try:
            bench.check_output_path(path, overwrite=True)
        except bench.UsageError as error:
            raise bench.UsageError(str(error).replace("--output", option, 1)) from None


def ran_cpu_check(args, check, what):
    """The --json path first; then --check runs `check` on the CPU (True: the probe is done), or else the probe
    needs a CUDA GPU to time `what` on."""
    check_json_path(args.json)
    if args.check:
        check()
        return True
    if not torch.cuda.is_available():
        raise bench.UsageError(f"times {what} on a CUDA GPU and none is visible (--check runs on the CPU)")
    return False


def time_iterations(iteration, iterations, device):
    """`iteration` run `iterations` times, each timed by the harness's StepTimer (CUDA events on a GPU, after a
    synchronize; the host clock on the CPU): the harness's summary of the times in ms (median, MAD, min, ...)."""
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    synchronize()
    timer = bench.StepTimer(device, iterations)
    timer.mark()
    for _ in range(iterations):
        iteration()
        timer.mark()
    synchronize()
    return bench.summarize(timer.step_times_ms())


def check_distributed_launch(args, why):
    """The --json path, then the launch: under torchrun, and on a GPU when --device cuda (`why` says what the
    ranks are for)."""
    check_json_path(args.json)
    if "RANK" not in os.environ:
        raise bench.UsageError(f"run it under torchrun: {why}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise bench.UsageError("--device cuda needs a CUDA GPU and none is visible (--device cpu runs on gloo)")


def add_distributed_arguments(parser):
    """--device (cuda: NCCL; cpu: gloo, the CI test) and --json, as every distributed probe takes them."""
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--json")


def start_distributed(device_name):
    """This rank's number and device, its process group started (NCCL on the GPU, gloo on the CPU)."""
    import torch.distributed as dist
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if device_name == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return rank, device


@contextlib.contextmanager
def fits_in_memory(what):
    """A size the device cannot hold (`what` names the option) is bad input: one line, not a traceback. The
    CPU's allocator reports it as a plain RuntimeError, CUDA's as OutOfMemoryError."""
    try:
        yield
    except RuntimeError as error:
        if not (isinstance(error, torch.OutOfMemoryError) or "can't allocate memory" in str(error)):
            raise
        raise bench.UsageError(f"{what} does not fit in this device's memory") from None
