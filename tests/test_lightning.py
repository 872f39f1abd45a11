"""The Lightning twin: same options and result as native, and it trains identically (CPU, gloo)."""
import re
import subprocess
import sys

import pytest

from conftest import (LIGHTNING, ROOT, SMALL, expect_usage_error, load_script, pretend_gpus, read_result,
                      resolve_config, run_script)


@pytest.fixture(scope="module")
def lightning_two_rank(tmp_path_factory):
    output = tmp_path_factory.mktemp("lightning") / "result.json"
    proc = run_script(LIGHTNING, [*SMALL, "--devices", "2", "--output", str(output)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, read_result(output)


@pytest.fixture(scope="module")
def twin():
    return load_script(LIGHTNING, "lightning_twin_under_test")


def test_lightning_and_native_train_identically(lightning_two_rank, native_two_rank):
    _, lightning = lightning_two_rank
    _, native = native_two_rank
    assert lightning["config"]["global_batch_size"] == native["config"]["global_batch_size"] == 8
    # Same seed, data and optimizer: the same loss at every step (warm-up included) and the same weights.
    assert lightning["loss_per_step"] == pytest.approx(native["loss_per_step"], rel=1e-5, abs=1e-6)
    assert len(lightning["loss_per_step"]) == 6
    assert lightning["checks"]["final_parameter_checksum"] == pytest.approx(
        native["checks"]["final_parameter_checksum"], rel=1e-6)


def test_manual_optimization_trains_like_native(native_two_rank, tmp_path):
    """--lightning-manual-optimization (the step --cuda-graphs captures, here uncaptured): training_step runs
    zero_grad, manual_backward and the optimizer step itself, and trains exactly as native and as the default."""
    output = tmp_path / "manual.json"
    proc = run_script(LIGHTNING, [*SMALL, "--devices", "2", "--lightning-manual-optimization",
                                  "--output", str(output)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manual, (_, native) = read_result(output), native_two_rank
    assert manual["config"]["lightning_manual_optimization"] is True
    assert manual["config"]["cuda_graphs"] is False and manual["config"]["lightning_ddp_side_stream"] is False
    assert manual["loss_per_step"] == pytest.approx(native["loss_per_step"], rel=1e-5, abs=1e-6)
    assert manual["checks"]["final_parameter_checksum"] == pytest.approx(
        native["checks"]["final_parameter_checksum"], rel=1e-6)
    assert manual["checks"]["steps_run_per_rank"] == [6, 6] and manual["checks"]["parameters_synchronized"]


@pytest.mark.parametrize("precision", ["fp16", "auto"])
def test_captured_fp16_needs_a_fixed_loss_scale_as_in_native(twin, precision):
    """fp16 (asked for, or what auto resolves to on a GPU without bf16) with Lightning's dynamic GradScaler
    cannot be captured; the twin, like native, takes a fixed --loss-scale instead."""
    with pytest.raises(twin.UsageError) as error:
        resolve_config(twin, ["--cuda-graphs", "--precision", precision, "--warmup-steps", "20"], bf16=False,
                       ddp_world_size=2)
    assert "--cuda-graphs with fp16 needs a fixed --loss-scale (e.g. 1024)" in str(error.value)
    config = resolve_config(twin, ["--cuda-graphs", "--precision", precision, "--loss-scale", "1024",
                                   "--warmup-steps", "20"], bf16=False, ddp_world_size=2)
    assert (config["loss_scale"], config["grad_scaler"], twin.sgd_implementation(config)) == (1024.0, False, "fused")


def test_a_fixed_loss_scale_becomes_lightnings_fp16_plugin(twin):
    """With a fixed --loss-scale the Trainer gets Lightning's own 16-mixed plugin holding FixedLossScaler (and no
    precision flag, which Lightning refuses beside a plugin); otherwise the flag, as before."""
    assert twin.precision_settings({"loss_scale": "dynamic", "trainer_precision": "16-mixed"}) == ("16-mixed", [])
    assert twin.precision_settings({"loss_scale": None, "trainer_precision": "bf16-mixed"}) == ("bf16-mixed", [])
    flag, plugins = twin.precision_settings({"loss_scale": 256.0, "trainer_precision": "16-mixed", "device": "cpu"})
    assert flag is None and len(plugins) == 1
    assert plugins[0].precision == "16-mixed" and isinstance(plugins[0].scaler, twin.FixedLossScaler)
    assert plugins[0].scaler.state_dict() == {"scale": 256.0}


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("automatic", [True, False])
def test_fixed_loss_scaler_steps_as_natives_fixed_scale(twin, fused, automatic):
    """In a real Trainer with Lightning's 16-mixed plugin (which leaves unscaling to fused SGD and calls unscale_
    before a foreach step), FixedLossScaler gives native's fixed-scale update bit for bit: (loss * S).backward(),
    gradients times 1/S, the optimizer step; in automatic and in manual optimization. A small model on the CPU
    under fp16 autocast (the scripts refuse fp16 on the CPU; the device runs check the GPU)."""
    import lightning as L
    import torch
    from lightning.pytorch.plugins import MixedPrecision

    profile = load_script(ROOT / "docs" / "diagnostics" / "lightning-interleaved" / "hook_profile.py")
    inputs, labels, scale, steps = profile.inputs, profile.labels, 1024.0, 3

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

    tiny = profile.Tiny(automatic, *net_and_optimizer(), steps=steps)  # the diagnostic's module, the same step
    plugin = MixedPrecision("16-mixed", device="cpu", scaler=twin.FixedLossScaler(scale))
    L.Trainer(accelerator="cpu", devices=1, plugins=[plugin], max_steps=steps, barebones=True,
              enable_progress_bar=False).fit(tiny)
    for native_parameter, twin_parameter in zip(native_net.parameters(), tiny.net.parameters()):
        assert torch.equal(native_parameter, twin_parameter)


def test_manual_optimization_runs_the_twins_own_step(twin, tmp_path, monkeypatch):
    """--lightning-manual-optimization takes the manual path: training_step calls manual_step every step (one
    process in this process, CPU, the signal handlers left alone)."""
    calls = []
    original = twin.ResNet50Benchmark.manual_step

    def counted(module):
        calls.append(module.trainer.global_step)
        return original(module)

    monkeypatch.setattr(twin.ResNet50Benchmark, "manual_step", counted)
    monkeypatch.setattr(twin.StopRequest, "install", lambda self: None)
    output = tmp_path / "manual.json"
    assert twin.main([*SMALL, "--lightning-manual-optimization", "--output", str(output)]) == 0
    assert calls == list(range(6))  # warm-up + timed steps, each counted by Lightning as one optimizer step
    result = read_result(output)
    assert result["status"] == "ok" and result["config"]["lightning_manual_optimization"] is True


def test_manual_optimization_loses_the_buffer_broadcast_unless_restored():
    """The Lightning behaviour the twin works around under manual optimization (and how), on 2 gloo processes:
    docs/diagnostics/lightning-manual-buffers/."""
    script = ROOT / "docs" / "diagnostics" / "lightning-manual-buffers" / "buffers.py"
    expected = {"automatic": "same, same, same, same", "manual": "same, different, different, different",
                "manual-restored": "same, same, same, same", "manual-synced": "same, same, same, same"}
    proc = subprocess.run([sys.executable, str(script), *expected], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)  # every mode in one launch
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for mode, pattern in expected.items():
        assert f"{mode}: running mean of rank 0 and rank 1 at the start of steps 1-4: {pattern}" in proc.stdout
    twin = (ROOT / "lightning" / "ddp_resnet50.py").read_text()  # the twin does what manual-synced does
    assert "self.trainer.strategy.model.require_forward_param_sync = False" in twin
    assert "self.trainer.strategy.model._sync_buffers()" in twin


def test_lightning_result_fields(lightning_two_rank):
    proc, result = lightning_two_rank
    assert (result["benchmark"], result["strategy"], result["status"]) == \
        ("lightning/ddp_resnet50.py", "lightning_ddp", "ok")
    assert result["world"]["launcher"] == "lightning" and result["world"]["world_size"] == 2
    config = result["config"]
    assert (config["devices"], config["num_nodes"], config["trainer_precision"]) == (2, 1, "32-true")
    # the DDP options the native script uses, and DDP built on the current stream as native builds it
    assert (config["gradient_as_bucket_view"], config["broadcast_buffers"], config["lightning_ddp_side_stream"],
            config["lightning_sigterm_sync"]) == (True, True, False, False)
    assert result["checks"]["steps_run_per_rank"] == [6, 6]  # warm-up + timed on every rank
    assert result["checks"]["parameters_synchronized"] and result["throughput"]["timed_steps"] == 4
    first, last = result["throughput"]["rank0_timed_window_utc"]  # Lightning's hooks start and close the clock too
    assert result["started_at"][:19] <= first[:19] <= last
    assert proc.stdout.count("== lightning/ddp_resnet50.py") == 1 and "| lightning_ddp | 2 |" in proc.stdout


def test_lightning_detects_an_injected_desync(tmp_path):
    output = tmp_path / "desync.json"
    proc = run_script(LIGHTNING, [*SMALL, "--devices", "2", "--steps", "2", "--inject-fault", "desync",
                                  "--inject-fault-rank", "1", "--output", str(output)])
    assert proc.returncode == 3, proc.stderr[-2000:]
    result = read_result(output)
    assert result["status"] == "desync" and result["checks"]["parameters_synchronized"] is False


def test_trainer_precision_mapping(twin):
    assert [twin.resolve_trainer_precision(p) for p in ("fp32", "bf16", "fp16")] == \
        ["32-true", "bf16-mixed", "16-mixed"]


SRUN = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "4", "SLURM_NTASKS": "4",
        "SLURM_NTASKS_PER_NODE": "4", "SLURM_JOB_ID": "42", "SLURM_STEP_NODELIST": "node1"}


@pytest.mark.parametrize("argv,env,rule", [
    (["--devices", "2"], SRUN, "4 Slurm tasks per node but --devices 2"),
    (["--devices", "4", "--num-nodes", "2"], SRUN, "1 nodes in the allocation but --num-nodes 2"),
    (["--devices", "4"], {k: v for k, v in SRUN.items() if k != "SLURM_NTASKS_PER_NODE"},
     "--ntasks without --ntasks-per-node"),
    (["--devices", "2"], {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4",
                          "TORCHELASTIC_RUN_ID": "x"}, "4 torchrun processes per node but --devices 2"),
    (["--devices", "0"], {}, "must be a positive integer"),
    (["--devices", "2"], {"LOCAL_RANK": "one", "NODE_RANK": "0"}, "must be integers"),
    (["--devices", "2"], {"LOCAL_RANK": "2", "NODE_RANK": "0"}, "do not fit --num-nodes 1 --devices 2"),
    (["--precision", "fp16"], {}, "fp16 needs a GPU"),
    (["--devices", "3", "--global-batch-size", "8"], {}, "not divisible by the world size 3"),
    (["--compile", "--compiled-ddp", "python_reducer"], {}, "python_reducer is not supported by the Lightning twin"),
    (["--devices", "2", "--comm-hook", "bf16_compress", "--lightning-ddp-side-stream"], {},
     "--comm-hook with --lightning-ddp-side-stream needs --device cuda"),
    (["--cuda-graphs"], {}, "--cuda-graphs needs --device cuda"),
    (["--loss-scale", "1024"], {}, "--loss-scale 1024 needs --precision fp16"),
])
def test_bad_input(twin, argv, env, rule, tmp_path, monkeypatch, capsys):
    for name in list(SRUN) + ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
                                    "NODE_RANK"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    base = [a for a in SMALL]
    if "--global-batch-size" in argv:
        index = base.index("--batch-size-per-device")
        del base[index:index + 2]
    expect_usage_error(twin, [*base, *argv], rule, tmp_path / "r.json", monkeypatch, capsys)


def test_more_devices_than_gpus(twin, tmp_path, monkeypatch, capsys):
    pretend_gpus(monkeypatch, count=1)
    expect_usage_error(twin, ["--devices", "2"], "2 ranks on this node but only 1 GPUs", tmp_path / "r.json",
                       monkeypatch, capsys)


def test_readme_code_map_line_numbers_match_the_file():
    readme = (ROOT / "lightning" / "README.md").read_text()
    source = (ROOT / "lightning" / "ddp_resnet50.py").read_text().splitlines()
    entries = re.findall(r"`(ResNet50Benchmark\.)?(\w+)(?:\(\))?` — line (\d+)", readme)
    assert len(entries) >= 11, entries
    module_class = next(i for i, text in enumerate(source, 1) if text.startswith("class ResNet50Benchmark("))
    for method, name, line in entries:
        text = source[int(line) - 1]
        assert re.match(rf"\s*(def|class) {name}\b", text), f"{name} is not at line {line}: {text!r}"
        # a method's line lies inside its class (other classes have an __init__ too), a function's outside
        inside = int(line) > module_class and text.startswith(" ") and all(not s.startswith(("def ", "class "))
                                                  for s in source[module_class:int(line) - 1])
        assert inside == bool(method), f"{method}{name} at line {line} is {'' if inside else 'not '}in the class"
    models = re.findall(r"`([\w.]+)\(weights=None\)` at line (\d+)", readme)
    assert models, "the code map names the line that creates the model"
    for name, line in models:
        assert f"{name.split('.')[-1]}(weights=None" in source[int(line) - 1], (name, line)
