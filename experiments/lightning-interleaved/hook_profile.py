"""Where Lightning's per-step host time goes, and how much it is on a given host: a trivial model (Linear 8 -> 4,
4 samples), so that the step is almost all loop, trained by a plain loop and by Trainer(barebones=True).

    python experiments/lightning-interleaved/hook_profile.py [automatic|manual] \\
        > experiments/lightning-interleaved/hook_profile-output.txt
    python experiments/lightning-interleaved/hook_profile.py --timing [--device cuda --precision bf16] \\
        [--repeats 5] [--output-json F]

Both time the steady state (steps 500 to 2,900 of 3,000, between device synchronizations). The first form times
the plain loop and the Trainer once each on the CPU, then profiles the Trainer under cProfile. The second times,
without a profiler, the plain loop, the Trainer with automatic optimization and the Trainer with the twin's
manual optimization, in turn, --repeats times: the medians' differences are Lightning's own host cost a step on
this host, which the device runs set against native's step time (a host-bound step of t ms with Lightning's
cost of d ms runs at t / (t + d) of native).
"""
import cProfile
import contextlib
import logging
import os
import pathlib
import platform
import socket
import statistics
import sys
import time
import warnings

import lightning as L
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import probe_common as common  # noqa: E402

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
          f"{medians['plain']:.0f}, Trainer automatic {medians['automatic']:.0f} "
          f"(+{result['lightning_cost_us']['automatic']:.0f}), "
          f"manual {medians['manual']:.0f} (+{result['lightning_cost_us']['manual']:.0f})")
    if options.output_json:
        common.write_json(options.output_json, result)
    return result


def profile(mode):
    """The steady-state step of the plain loop and of the Trainer (as --timing times them, once each), then the
    Trainer under cProfile."""
    quiet()
    cpu = torch.device("cpu")
    plain = plain_loop_step_s(cpu, contextlib.nullcontext)
    lightning = trainer_step_s(cpu, "32-true", automatic=mode == "automatic")
    profiler = cProfile.Profile()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, barebones=True)
    profiler.runcall(trainer.fit, Tiny(mode == "automatic"))
    print(f"{mode} optimization, steps {FIRST_MARK}-{LAST_MARK} of {STEPS}: plain loop {plain * 1e6:.0f} us a step, "
          f"Trainer {lightning * 1e6:.0f} us a step; the profiled Trainer ({STEPS} steps), by own time:")
    common.print_profile(profiler, "tottime", 20, stream=sys.stdout)


def main(argv=None):
    parser = common.OneLineArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", choices=["automatic", "manual"], default="automatic",
                        help="the optimization the profiled Trainer runs")
    parser.add_argument("--timing", action="store_true", help="time the three loops without a profiler")
    parser.add_argument("--device", choices=["cpu", "cuda"])
    parser.add_argument("--precision", choices=["fp32", "bf16"])
    parser.add_argument("--repeats", type=common.positive_int)
    parser.add_argument("--output-json")
    options = parser.parse_args(argv)
    timing_only = [f"--{name.replace('_', '-')}" for name in ("device", "precision", "repeats", "output_json")
                   if getattr(options, name) is not None]
    if not options.timing:
        if timing_only:
            raise common.UsageError(f"{', '.join(timing_only)} only with --timing (the profile runs on the CPU)")
        profile(options.mode)
        return 0
    options.device, options.precision = options.device or "cpu", options.precision or "fp32"
    options.repeats = options.repeats or 5
    common.check_json_path(options.output_json, "--output-json")
    if options.device == "cuda" and not torch.cuda.is_available():
        raise common.UsageError("--device cuda needs a CUDA GPU and none is visible")
    timing(options)
    return 0


if __name__ == "__main__":
    common.run_guarded(main)
