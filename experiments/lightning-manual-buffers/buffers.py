"""Does DDP broadcast the buffers under Lightning's manual optimization?

Two CPU processes (gloo) train a Linear + BatchNorm1d under Lightning's DDPStrategy with broadcast_buffers on
(DDP's default), each rank on its own data, so their BatchNorm running means drift apart unless DDP broadcasts
rank 0's before every forward. At the start of every training_step each rank records its running mean; rank 0
prints whether the two ranks held the same one, step by step.

    python experiments/lightning-manual-buffers/buffers.py automatic
    python experiments/lightning-manual-buffers/buffers.py manual
    python experiments/lightning-manual-buffers/buffers.py manual-restored
    python experiments/lightning-manual-buffers/buffers.py automatic manual   # several modes, one launch

`manual-restored` sets DDP's require_forward_param_sync back to True after every step, so that DDP's forward
broadcasts again. `manual-synced` is what lightning/ddp_resnet50.py does under manual optimization: DDP's forward
does not broadcast (the flag False before every step), and training_step broadcasts itself (DDP's _sync_buffers),
so that with --cuda-graphs the broadcast is captured with the step.

    python experiments/lightning-manual-buffers/buffers.py manual-synced
"""
import sys
import warnings

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy

MODES = ("automatic", "manual", "manual-restored", "manual-synced")
STEPS = 4


class Probe(L.LightningModule):
    def __init__(self, mode):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
        self.mode, self.automatic_optimization, self.seen = mode, mode == "automatic", []

    def on_train_batch_start(self, batch, batch_idx):
        if self.mode == "manual-synced":
            self.trainer.strategy.model.require_forward_param_sync = False  # the step broadcasts, not DDP.forward

    def training_step(self, batch, batch_idx):
        if self.mode == "manual-synced":
            self.trainer.strategy.model._sync_buffers()
        self.seen.append(self.net[1].running_mean.clone())
        x = torch.randn(8, 4) + 10 * self.global_rank  # each rank its own data: its own batch statistics
        loss = self.net(x).pow(2).mean()
        if not self.automatic_optimization:
            optimizer = self.optimizers()
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.mode == "manual-restored":
            self.trainer.strategy.model.require_forward_param_sync = True

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(range(STEPS), batch_size=None)

    def on_train_end(self):
        seen = [None, None]
        dist.all_gather_object(seen, torch.stack(self.seen))
        if self.global_rank == 0:
            same = ["same" if torch.equal(a, b) else "different" for a, b in zip(*seen)]
            print(f"{self.mode}: running mean of rank 0 and rank 1 at the start of steps 1-{STEPS}: "
                  f"{', '.join(same)}", flush=True)


def main():
    modes = sys.argv[1:]
    if not modes or any(mode not in MODES for mode in modes):
        print(f"usage: buffers.py {'|'.join(MODES)}...", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    for mode in modes:  # one launch: Lightning's second rank re-runs this script and follows the same modes
        torch.manual_seed(0)
        trainer = L.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"),
                            max_steps=STEPS, max_epochs=1, barebones=True, use_distributed_sampler=False,
                            enable_model_summary=False)
        trainer.fit(Probe(mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
