"""Where Lightning's per-step host time goes: a trivial model (Linear 8 -> 4, 4 samples), so that the step is
almost all loop, trained by a plain loop and by Trainer(barebones=True), the second under cProfile. CPU only.

    python docs/diagnostics/lightning-interleaved/hook_profile.py [automatic|manual] > hook_profile-output.txt
"""
import cProfile
import logging
import pstats
import sys
import time
import warnings

import lightning as L
import torch

STEPS = 3000
inputs, labels = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)), torch.arange(4)


class Tiny(L.LightningModule):
    """A trivial module, so that a step is nearly all loop (tests/test_lightning.py trains it with its own
    network and optimizer)."""

    def __init__(self, automatic, net=None, optimizer=None, steps=STEPS):
        super().__init__()
        self.net, self.automatic_optimization = net or torch.nn.Linear(8, 4), automatic
        self.optimizer, self.steps = optimizer, steps

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.cross_entropy(self.net(inputs), labels)
        if not self.automatic_optimization:
            optimizer = self.optimizers()
            optimizer.zero_grad(set_to_none=True)
            self.manual_backward(loss)
            optimizer.step()
        return loss

    def configure_optimizers(self):
        return self.optimizer or torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(range(self.steps), batch_size=None)


def main(mode):
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
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


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "automatic")
