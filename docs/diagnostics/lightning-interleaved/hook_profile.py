"""Where Lightning's per-step host time goes, and how much it is on a given host: a trivial model (Linear 8 -> 4,
4 samples), so that the step is almost all loop, trained by a plain loop and by Trainer(barebones=True).

    python docs/diagnostics/lightning-interleaved/hook_profile.py [automatic|manual] > hook_profile-output.txt
    python docs/diagnostics/lightning-interleaved/hook_profile.py --timing [--device cuda --precision bf16] \\
        [--repeats 5] [--output-json F]

The first form profiles the Trainer under cProfile on the CPU. The second times, without a profiler, the steady
state (steps 500 to 2,900 of 3,000, between device synchronizations) of the plain loop, of the Trainer with
automatic optimization and of the Trainer with the twin's manual optimization, in turn, --repeats times: the
medians' differences are Lightning's own host cost a step on this host, which the device runs set against
native's step time (a host-bound step of t ms with Lightning's cost of d ms runs at t / (t + d) of native).
"""
import argparse
import cProfile
import contextlib
import json
import logging
import os
import platform
import pstats
import socket
import statistics
import sys
import time
import warnings

import lightning as L
import torch

STEPS, FIRST_MARK, LAST_MARK = 3000, 500, 2900
inputs, labels = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)), torch.arange(4)


class Tiny(L.LightningModule):
    """A trivial module, so that a step is nearly all loop (tests/test_lightning.py trains it with its own
    network and optimizer). With marks, the host clock is read after a device synchronize at the end of those
    steps."""

    def __init__(self, automatic, net=None, optimizer=None, steps=STEPS, batch=None, marks=()):
        super().__init__()
        self.net, self.automatic_optimization = net or torch.nn.Linear(8, 4), automatic
        self.optimizer, self.steps = optimizer, steps
        self.batch, self.marks, self.times = batch or (inputs, labels), marks, {}

    def training_step(self, batch, batch_idx):
        images, targets = self.batch
        loss = torch.nn.functional.cross_entropy(self.net(images), targets)
        if not self.automatic_optimization:  # the twin's manual step: zero_grad, manual_backward, step
            optimizer = self.optimizers()
            optimizer.zero_grad(set_to_none=True)
            self.manual_backward(loss)
            optimizer.step()
        return loss

    def configure_optimizers(self):
        return self.optimizer or torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(range(self.steps), batch_size=None)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if batch_idx in self.marks:
            synchronize(self.device)
            self.times[batch_idx] = time.perf_counter()


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def quiet():
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)


def plain_loop_step_s(device, autocast):
    """Seconds a step of native's order (forward, zero_grad, backward, step) in the steady state."""
    net = torch.nn.Linear(8, 4).to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    images, targets = inputs.to(device), labels.to(device)
    times = {}
    for index in range(STEPS):
        with autocast():
            loss = torch.nn.functional.cross_entropy(net(images), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if index in (FIRST_MARK, LAST_MARK):
            synchronize(device)
            times[index] = time.perf_counter()
    return (times[LAST_MARK] - times[FIRST_MARK]) / (LAST_MARK - FIRST_MARK)


def trainer_step_s(device, precision, automatic):
    """Seconds a step of Trainer(barebones=True) around the same model, in the steady state."""
    tiny = Tiny(automatic, batch=(inputs.to(device), labels.to(device)), marks=(FIRST_MARK, LAST_MARK))
    L.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, precision=precision,
              max_steps=STEPS, barebones=True).fit(tiny)
    return (tiny.times[LAST_MARK] - tiny.times[FIRST_MARK]) / (LAST_MARK - FIRST_MARK)


def timing(options):
    quiet()
    device = torch.device(options.device)
    bf16 = options.precision == "bf16"
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    precision = "bf16-mixed" if bf16 else "32-true"
    runs = {"plain": [], "automatic": [], "manual": []}
    for _ in range(options.repeats):  # in turn, so that a drift of the host's pace touches all three
        runs["plain"].append(plain_loop_step_s(device, autocast) * 1e6)
        runs["automatic"].append(trainer_step_s(device, precision, automatic=True) * 1e6)
        runs["manual"].append(trainer_step_s(device, precision, automatic=False) * 1e6)
    medians = {kind: statistics.median(values) for kind, values in runs.items()}
    result = {"diagnostic": "lightning-loop-cost", "device": options.device, "precision": options.precision,
              "steps": STEPS, "timed_steps": [FIRST_MARK, LAST_MARK], "repeats": options.repeats,
              "hostname": socket.gethostname(), "python": platform.python_version(), "torch": torch.__version__,
              "lightning": L.__version__,
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
              "step_us": runs, "median_step_us": medians,
              "lightning_cost_us": {"automatic": medians["automatic"] - medians["plain"],
                                    "manual": medians["manual"] - medians["plain"]}}
    print(f"{options.device} {options.precision}, {options.repeats} repeats, median us a step: plain loop "
          f"{medians['plain']:.0f}, Trainer automatic {medians['automatic']:.0f} (+{result['lightning_cost_us']['automatic']:.0f}), "
          f"manual {medians['manual']:.0f} (+{result['lightning_cost_us']['manual']:.0f})")
    if options.output_json:
        temporary = options.output_json + ".tmp"
        with open(temporary, "w") as handle:
            json.dump(result, handle, indent=1)
        os.replace(temporary, options.output_json)
    return result


def profile(mode):
    quiet()
    net = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    started = time.perf_counter()
    for _ in range(STEPS):
        loss = torch.nn.functional.cross_entropy(net(inputs), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    plain = (time.perf_counter() - started) / STEPS
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, barebones=True)
    started = time.perf_counter()
    trainer.fit(Tiny(mode == "automatic"))
    lightning = (time.perf_counter() - started) / STEPS
    profiler = cProfile.Profile()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, barebones=True)
    profiler.runcall(trainer.fit, Tiny(mode == "automatic"))
    print(f"{mode} optimization, {STEPS} steps: plain loop {plain * 1e6:.0f} us a step, Trainer {lightning * 1e6:.0f} "
          f"us a step (setup included); the profiled Trainer, by own time:")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(20)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", choices=["automatic", "manual"], default="automatic",
                        help="the optimization the profiled Trainer runs")
    parser.add_argument("--timing", action="store_true", help="time the three loops without a profiler")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output-json")
    options = parser.parse_args(argv)
    if options.timing:
        timing(options)
    else:
        profile(options.mode)


if __name__ == "__main__":
    main()
