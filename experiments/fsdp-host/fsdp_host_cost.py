"""Host cost of FSDP2's per-step machinery, without the arithmetic: a module with as many parameters as
ResNet-50 (161) but two elements each, on the CPU, one process (gloo), one FSDP2 unit as oss_benchmark.py's
default, against the same module unwrapped; foreach SGD with momentum as oss_benchmark.py's SGD.

    python experiments/fsdp-host/fsdp_host_cost.py [--profile]

Prints the host milliseconds per step of forward+backward and of the optimizer step for both, and with
--profile the functions of the FSDP2 step by cumulative time (cProfile)."""
import argparse
import cProfile
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import probe_common as common  # noqa: E402  (the profile's paths shortened)

PARAMETERS = 161  # torchvision's resnet50: len(list(model.parameters()))


class Tiny(torch.nn.Module):
    def __init__(self, count):
        super().__init__()
        self.weights = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(2)) for _ in range(count)])

    def forward(self, x):
        return sum((weight.sum() for weight in self.weights), x.sum())


def timed(module, steps=20, warmup=10):
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9, foreach=True)
    x = torch.zeros(2)
    backward = step = 0.0
    for i in range(warmup + steps):
        start = time.perf_counter()
        module(x).backward()
        middle = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad()
        end = time.perf_counter()
        if i >= warmup:
            backward, step = backward + middle - start, step + end - middle
    return backward / steps * 1e3, step / steps * 1e3, optimizer


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29555"), RANK="0",
                      WORLD_SIZE="1")
    dist.init_process_group("gloo")
    try:
        for name in ("plain", "fsdp2"):
            module = Tiny(PARAMETERS)
            if name == "fsdp2":
                fully_shard(module)
            forward_backward, optimizer_step, _ = timed(module)
            print(f"{name:6s} {PARAMETERS} parameters: forward+backward {forward_backward:.2f} ms, "
                  f"optimizer step {optimizer_step:.2f} ms (host, per step)")
        if args.profile:
            module = Tiny(PARAMETERS)
            fully_shard(module)
            profile = cProfile.Profile()
            profile.enable()
            timed(module, steps=20, warmup=0)
            profile.disable()
            common.print_profile(profile, "cumulative", 30)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
