"""The Lightning twin on the CPU (gloo): stock Lightning by default, --lightning-matched on request, and both train
exactly as native does."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import (LIGHTNING, ROOT, SMALL, clean_env, expect_usage_error, finish, launch_by_hand, load_script,
                      pretend_gpus, read_result, resolve_config, run_script)


@pytest.fixture(scope="module")
def lightning_two_rank(tmp_path_factory):
    """The default (stock) run, 2 processes started by Lightning's own launcher."""
    output = tmp_path_factory.mktemp("lightning") / "stock.json"
    proc = run_script(LIGHTNING, [*SMALL, "--devices", "2", "--output", str(output)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, read_result(output)


@pytest.fixture(scope="module")
def lightning_matched(tmp_path_factory):
    """--lightning-matched, 2 processes started by torchrun."""
    output = tmp_path_factory.mktemp("lightning") / "matched.json"
    proc = run_script(LIGHTNING, [*SMALL, "--devices", "2", "--lightning-matched", "--output", str(output)], nproc=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, read_result(output)


@pytest.fixture(scope="module")
def twin():
    return load_script(LIGHTNING, "lightning_twin_under_test")


def test_the_default_is_stock_lightning(lightning_two_rank):
    proc, result = lightning_two_rank
    assert (result["benchmark"], result["strategy"], result["status"]) == ("lightning/ddp_resnet50.py",
                                                                           "lightning_ddp", "ok")
    assert result["world"]["launcher"] == "lightning" and result["world"]["world_size"] == 2
    config = result["config"]
    assert (config["devices"], config["num_nodes"], config["trainer_precision"]) == (2, 1, "32-true")
    # Lightning's own DDPStrategy (no CUDA stream on the CPU) and its per-step SIGTERM broadcast, automatic optimization
    assert (config["lightning_variant"], config["lightning_sigterm_sync"], config["lightning_ddp_side_stream"],
            config["lightning_manual_optimization"]) == ("stock", True, False, False)
    assert (config["gradient_as_bucket_view"], config["broadcast_buffers"]) == (True, True)  # native's DDP options
    assert result["checks"]["steps_run_per_rank"] == [6, 6] and result["throughput"]["timed_steps"] == 4
    assert result["checks"]["parameters_synchronized"]
    assert proc.stdout.count("== lightning/ddp_resnet50.py") == 1 and "| lightning_ddp | 2 | 4 |" in proc.stdout


def test_matched_is_recorded_as_matched(lightning_matched):
    _, result = lightning_matched
    assert result["world"]["launcher"] == "torchrun" and result["status"] == "ok"
    config = result["config"]
    assert (config["lightning_variant"], config["lightning_sigterm_sync"], config["lightning_ddp_side_stream"]) == \
        ("matched", False, False)
    assert "lightning_matched" not in config


def test_native_and_both_variants_train_identically(lightning_two_rank, lightning_matched, native_two_rank):
    native = native_two_rank[1]
    for _, lightning in (lightning_two_rank, lightning_matched):
        assert lightning["config"]["global_batch_size"] == native["config"]["global_batch_size"] == 8
        # Same seed, data and optimizer: the same loss at every step (warm-up included) and the same weights.
        assert len(lightning["loss_per_step"]) == 6
        assert lightning["loss_per_step"] == pytest.approx(native["loss_per_step"], rel=1e-5, abs=1e-6)
        assert lightning["checks"]["final_parameter_checksum"] == pytest.approx(
            native["checks"]["final_parameter_checksum"], rel=1e-6)


def test_one_process_smoke_run_of_the_script_copied_alone(tmp_path):
    """One process: no DDP wrapper, Lightning's 32-true precision (TF32 on GPUs, as native); the twin copied alone
    into an empty folder needs nothing from the repository."""
    import shutil
    output = tmp_path / "one.json"
    shutil.copy(LIGHTNING, tmp_path / "ddp_resnet50.py")
    proc = run_script(tmp_path / "ddp_resnet50.py", [*SMALL, "--output", str(output)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = read_result(output)
    assert (result["world"]["launcher"], result["world"]["world_size"], result["status"]) == ("single", 1, "ok")
    assert (result["config"]["trainer_precision"], result["config"]["lightning_sigterm_sync"]) == ("32-true", False)


def test_a_rank_with_another_learning_rate_is_a_desync(tmp_path):
    output = tmp_path / "desync.json"
    procs = launch_by_hand(LIGHTNING, [*SMALL, "--steps", "2", "--output", str(output)],
                           rank_args={1: ["--lr", "0.02"]})  # the last --lr counts
    (code, _, err), _ = finish(procs)
    assert code == 3, err[-2000:]
    result = read_result(output)
    assert result["status"] == "desync" and result["checks"]["parameters_synchronized"] is False
    assert "parameters differ" in err and "Traceback" not in err


def test_a_fixed_loss_scale_replaces_the_dynamic_scaler(twin):
    config = resolve_config(twin, ["--precision", "fp16", "--loss-scale", "1024"], bf16=False)
    assert (config["loss_scale"], config["grad_scaler"]) == (1024.0, False)


def test_a_killed_worker_of_lightnings_launcher_ends_the_run_as_lightning_does(tmp_path):
    """Stock Lightning: its launcher's observer ends every process when a worker dies; nothing is written."""
    output = tmp_path / "dead.json"
    rank0 = subprocess.Popen([sys.executable, str(LIGHTNING), *SMALL, "--steps", "400", "--devices", "2", "--output",
                              str(output)], env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=ROOT)
    while (line := rank0.stdout.readline()) and "measuring step 1/400" not in line:
        pass
    worker = subprocess.run(["pgrep", "-P", str(rank0.pid)], capture_output=True, text=True).stdout.split()
    assert len(worker) == 1, worker
    os.kill(int(worker[0]), signal.SIGKILL)
    started = time.monotonic()
    (code, _, err), = finish([rank0])
    assert code != 0 and time.monotonic() - started < 30, err[-2000:]
    assert not output.exists()


@pytest.mark.filterwarnings("ignore:.*(srun|LeafSpec|barebones|many workers)")
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("automatic", [True, False])
def test_fixed_loss_scale_steps_as_natives(twin, native, fused, automatic):
    """In a real Trainer with Lightning's 16-mixed plugin holding the package's FixedLossScaler (Lightning leaves
    unscaling to fused SGD and unscales before a foreach step), automatic optimization and the twin's manual
    train_step give the fixed-scale update bit for bit: (loss * S).backward(), gradients times 1/S, the step; so does
    native's train_step with the same scaler. A small network on the CPU under fp16 autocast (the scripts refuse fp16
    on the CPU)."""
    import lightning as L
    import torch
    from lightning.pytorch.plugins import MixedPrecision

    inputs, labels, scale, steps = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)), torch.arange(4), \
        1024.0, 3

    def net_and_optimizer():
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        return net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, fused=fused)

    native_net, native_optimizer = net_and_optimizer()
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.float16, cache_enabled=False):
            loss = torch.nn.functional.cross_entropy(native_net(inputs), labels)
        native_optimizer.zero_grad(set_to_none=True)
        (loss * scale).backward()
        torch._foreach_mul_([p.grad for p in native_net.parameters()], 1.0 / scale)
        native_optimizer.step()
    scripts_net, scripts_optimizer = net_and_optimizer()
    scaler = native.import_extras().FixedLossScaler(scale)
    for _ in range(steps):
        native.train_step(scripts_net, scripts_optimizer, scaler, inputs, labels,
                          {"precision": "fp16", "device": "cpu", "cuda_graphs": False})
    assert all(torch.equal(a, b) for a, b in zip(native_net.parameters(), scripts_net.parameters()))

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            (self.model, self.optimizer), self.automatic_optimization = net_and_optimizer(), automatic
            self.sync_buffers = False

        def training_step(self, batch, batch_idx):
            if automatic:
                return torch.nn.functional.cross_entropy(self.model(inputs), labels)
            return twin.train_step(self, inputs, labels, {"precision": "fp16", "device": "cpu"})

        def configure_optimizers(self):
            return self.optimizer

        def train_dataloader(self):
            return torch.utils.data.DataLoader(range(steps), batch_size=None)

    tiny = Tiny()
    plugin = MixedPrecision("16-mixed", "cpu", twin.import_extras().FixedLossScaler(scale))
    L.Trainer(accelerator="cpu", devices=1, plugins=[plugin], max_steps=steps, barebones=True).fit(tiny)
    for native_parameter, twin_parameter in zip(native_net.parameters(), tiny.model.parameters()):
        assert torch.equal(native_parameter, twin_parameter)


SRUN = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "4", "SLURM_NTASKS": "4",
        "SLURM_NTASKS_PER_NODE": "4", "SLURM_JOB_ID": "42", "SLURM_STEP_NODELIST": "node1"}
TORCHRUN = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "x"}


# (srun's and torchrun's layout against --devices and --num-nodes: Lightning's own check, at the launch)
@pytest.mark.parametrize("argv,env,rule", [
    (["--devices", "0"], {}, "--devices and --num-nodes must be positive"),
    (["--devices", "2"], {"LOCAL_RANK": "one", "NODE_RANK": "0"}, "must be integers"),
    (["--devices", "2"], {"LOCAL_RANK": "2", "NODE_RANK": "0"}, "do not fit --num-nodes 1 --devices 2"),
    (["--precision", "fp16"], {}, "fp16 needs a GPU"),
    (["--devices", "3", "--global-batch-size", "8"], {}, "not divisible by the world size 3"),
    (["--cuda-graphs"], {}, "--cuda-graphs needs --device cuda"),
    (["--loss-scale", "1024"], {}, "--loss-scale must be dynamic or a power of two from 1 to 2**24, with --precision"),
    (["--devices", "2"], {"RANK": "1", "WORLD_SIZE": "2"}, "RANK and WORLD_SIZE without torchrun"),
    (["--devices", "2"], {"MASTER_PORT": "99999"}, "must be integers (MASTER_PORT up to 65535)"),
    (["--devices", "2"], {"SLURM_NTASKS": "2", "SLURM_JOB_NAME": "job"}, "start the twin under srun"),
], ids=["zero-devices", "local-rank-text", "local-rank-range", "fp16-cpu", "global-batch", "cuda-graphs-cpu",
        "loss-scale-fp32", "rank-by-hand", "master-port-range", "slurm-without-srun"])
def test_bad_input(twin, argv, env, rule, tmp_path, monkeypatch, capsys):
    for name in [*SRUN, *TORCHRUN, "NODE_RANK", "MASTER_PORT", "MASTER_ADDR", "SLURM_JOB_NAME"]:
        monkeypatch.setenv(name, "")  # set, then removed: whatever the run sets is undone after the test
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    base = list(SMALL)
    if "--global-batch-size" in argv:
        index = base.index("--batch-size-per-device")
        del base[index:index + 2]
    expect_usage_error(twin, [*base, *argv], rule, tmp_path / "r.json", monkeypatch, capsys)


def test_more_devices_than_gpus(twin, tmp_path, monkeypatch, capsys):
    pretend_gpus(monkeypatch, count=1)
    monkeypatch.setenv("MASTER_PORT", "")  # the launch plan picks a port: undone after the test
    monkeypatch.delenv("MASTER_PORT")
    expect_usage_error(twin, ["--devices", "2"], "2 ranks on this node but only 1 GPUs", tmp_path / "r.json",
                       monkeypatch, capsys)


def test_errors_name_the_lightning_script_not_native(tmp_path, twin, capsys, monkeypatch):
    """Both kinds of refusal, the parser's and the harness's, start with the twin's own name: as a user sees one,
    then the other in the test's process (the same run_guarded)."""
    proc = run_script(LIGHTNING, [*SMALL, "--output", f"{tmp_path}/folder/"])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("lightning/ddp_resnet50.py: error: "), lines
    monkeypatch.setattr(sys, "argv", [str(LIGHTNING), *SMALL, "--steps", "zero"])
    with pytest.raises(SystemExit) as stopped:
        twin.run_guarded(twin.main, twin.SCRIPT)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("lightning/ddp_resnet50.py: error: argument --steps: invalid int value"), err


def test_readme_code_map_line_numbers_match_the_file():
    readme = (ROOT / "lightning" / "README.md").read_text()
    source = (ROOT / "lightning" / "ddp_resnet50.py").read_text().splitlines()
    entries = re.findall(r"`(ResNet50Benchmark\.)?(\w+)(?:\(\))?` — line (\d+)", readme)
    assert len(entries) >= 12, entries
    module_class = next(i for i, text in enumerate(source, 1) if text.startswith("class ResNet50Benchmark("))
    for method, name, line in entries:
        text = source[int(line) - 1]
        assert re.match(rf"\s*(def|class) {name}\b", text), f"{name} is not at line {line}: {text!r}"
        # a method's line lies inside its class (other classes have an __init__ too), a function's outside
        inside = int(line) > module_class and text.startswith(" ") and all(
            not s.startswith(("def ", "class ")) for s in source[module_class:int(line) - 1])
        assert inside == bool(method), f"{method}{name} at line {line} is {'' if inside else 'not '}in the class"
    models = re.findall(r"`([\w.]+)\(([\w, ]*)weights=None\)` at line (\d+)", readme)
    assert models, "the code map names the line that creates the model"
    for name, arguments, line in models:
        assert f"{name.split('.')[-1]}({arguments}weights=None" in source[int(line) - 1], (name, line)


def test_the_private_lightning_names_the_twin_touches_still_exist(twin):
    """An upgrade that removes one of them fails here, naming it, rather than deep inside a GPU run."""
    import importlib
    import inspect
    import re
    import lightning
    for module, cls, name in twin.PRIVATE_NAMES:
        owner = getattr(importlib.import_module(module), cls)
        named = hasattr(owner, name) or re.search(rf"self\.{name}\b", inspect.getsource(owner.__init__))
        assert named, (f"{module}.{cls}.{name} is gone in Lightning {lightning.__version__} (torch "
                       f"{twin.torch.__version__}): lightning/ddp_resnet50.py's private section needs a new way")


def test_stock_lightning_keeps_its_sigterm_broadcast_and_says_so(twin, monkeypatch):
    """The stock variant measures Lightning's per-step SIGTERM broadcast: the result says so, and on_train_start
    leaves the broadcast alone; only --lightning-matched turns it off."""
    import signal
    import types
    assert twin.lightning_variant(False, True, True, False) == {
        "lightning_variant": "stock", "lightning_ddp_side_stream": True, "lightning_sigterm_sync": True,
        "lightning_manual_optimization": False}
    assert twin.lightning_variant(True, True, True, False)["lightning_sigterm_sync"] is False
    assert twin.lightning_variant(False, False, True, False)["lightning_sigterm_sync"] is False  # one process
    turned_off = []
    monkeypatch.setattr(twin, "turn_off_the_sigterm_broadcast", turned_off.append)
    handler = signal.getsignal(signal.SIGTERM)
    for sync in (True, False):
        run = types.SimpleNamespace(synthetic_batch=lambda: (None, None))
        module = types.SimpleNamespace(
            config={"lightning_sigterm_sync": sync, "comm_hook": "none", "cuda_graphs": False,
                    "broadcast_buffers": True}, run=run, trainer=types.SimpleNamespace(
                strategy=types.SimpleNamespace(model=None)), device=twin.torch.device("cpu"),
            automatic_optimization=True)
        twin.ResNet50Benchmark.on_train_start(module)
        assert len(turned_off) == (0 if sync else 1), sync
    assert signal.getsignal(signal.SIGTERM) is handler  # Lightning's handler stays: the twin installs none
