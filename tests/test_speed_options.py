"""Plumbing of the DDP options and of the package's speed and computation options: they reach the model and the run
and are recorded (their bad combinations are in test_bad_input.py). Their speed is proven by the GPU runs in results/.
"""
import pytest

from conftest import LIGHTNING, NATIVE, SMALL, finish, launch_by_hand, read_result, resolve_config, run_script


@pytest.fixture(scope="module")
def extras(native):
    return native.import_extras()


def test_without_its_options_no_script_imports_the_extras():
    """A script needs only torch, torchvision and its framework until one of the package's options is given (DDP's
    are the script's own)."""
    import subprocess
    import sys
    code = ("import importlib.util, sys; EXTRAS = 'resnet50_ddp_benchmarks.benchmark_extras'; "
            " spec = importlib.util.spec_from_file_location('n', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "m.parse_arguments(['--device', 'cpu']); print(EXTRAS in sys.modules); "
            "m.parse_arguments(['--device', 'cpu', '--static-graph']); print(EXTRAS in sys.modules); "
            "m.parse_arguments(['--device', 'cpu', '--comm-hook', 'none']); print(EXTRAS in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code, str(NATIVE)], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["False", "False", "True"], proc.stderr


def test_fp16_and_a_fixed_loss_scale_choose_the_sgd_kernel_and_the_scaler(native, tmp_path):
    """Fused SGD on the GPU except under fp16's dynamic GradScaler; a fixed --loss-scale drops the scaler (so the
    fused kernel and a CUDA graph fit again)."""
    out = ["--output", str(tmp_path / "r.json")]
    config = resolve_config(native, ["--precision", "fp16", "--loss-scale", "1024", "--cuda-graphs",
                                     "--warmup-steps", "2", *out], count=1)
    assert (config["loss_scale"], config["grad_scaler"], config["cuda_graphs"]) == (1024.0, False, True)
    config = resolve_config(native, ["--precision", "fp16", *out], count=1)
    assert (config["loss_scale"], config["grad_scaler"]) == ("dynamic", True)
    assert resolve_config(native, [*out], count=1)["loss_scale"] is None


def test_ddp_is_built_with_the_options(native, tmp_path, monkeypatch):
    """build_step hands the DDP options to DistributedDataParallel itself (recorded here in place of DDP)."""
    config = resolve_config(native, ["--device", "cpu", "--image-size", "32", "--batch-size-per-device", "2",
                                     "--bucket-cap-mb", "10", "--no-gradient-as-bucket-view", "--no-broadcast-buffers",
                                     "--static-graph", "--output", str(tmp_path / "r.json")], cuda=False, count=0)
    config.update(model="resnet50", optimizer="sgd", optimizer_impl="foreach")
    run = object.__new__(native.Run)  # no constructor: no device set up, no process group
    run.config, run.device, run.rank, run.world_size = config, native.torch.device("cpu"), 0, 2
    built = {}
    monkeypatch.setattr(native, "DistributedDataParallel", lambda model, **options: built.update(options) or model)
    native.build_step(run)
    buffers = "forward_sync_buffers" if "forward_sync_buffers" in built else "broadcast_buffers"
    assert (built["bucket_cap_mb"], built["gradient_as_bucket_view"], built["static_graph"], built[buffers]) == (
        10.0, False, True, False)


def test_coordinate_descent_tuning_reaches_inductor_and_what_runs_is_recorded(native, tmp_path):
    import torch._inductor.config as inductor_config
    out = ["--output", str(tmp_path / "r.json")]

    def tuned(argv):
        return resolve_config(native, [*argv, *out], count=1)["coordinate_descent_tuning"]

    # Inductor's own patch, not monkeypatch: monkeypatch's undo deletes the setting, and Inductor then hides it
    # from every later compilation in this process
    with inductor_config.patch(coordinate_descent_tuning=False):
        assert tuned([]) is False and tuned(["--compile"]) is False
        # the max-autotune modes turn it on themselves: recorded, without touching the global setting
        assert tuned(["--compile-mode", "max-autotune-no-cudagraphs"]) is True
        assert inductor_config.coordinate_descent_tuning is False
        assert tuned(["--compile", "--coordinate-descent-tuning"]) is True
        assert inductor_config.coordinate_descent_tuning is True
        # set earlier (the option, or TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1, which the result's software
        # environment records): what runs is recorded whenever an extras option is given
        assert tuned(["--compile", "--compile-mode", "default"]) is True
    assert inductor_config.coordinate_descent_tuning is False


def test_compile_runs_end_to_end(tmp_path):
    """torch.compile on the CPU (Inductor's C++ backend): slow to compile, so two images and one timed step, with
    the computation options, which are written for compiled steps (the rest of the compiled path is the same
    without)."""
    output = tmp_path / "compiled.json"
    proc = run_script(NATIVE, [*SMALL, "--batch-size-per-device", "2", "--warmup-steps", "1", "--steps", "1",
                               "--compile-mode", "default", "--coordinate-descent-tuning", "--space-to-depth-stem",
                               "--dense-max-pool-backward", "--sums-batch-norm", "--output", str(output)],
                      timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = read_result(output)
    assert result["config"]["compile"] is True and result["config"]["compile_mode"] == "default"
    # the computation options are written for compiled steps: Dynamo and Inductor take them (autograd.Function
    # included, and the sums batch norm's in-place running statistics)
    assert (result["config"]["stem_conv"], result["config"]["max_pool_backward"],
            result["config"]["batch_norm"]) == ("space_to_depth", "dense", "sums")
    assert result["config"]["coordinate_descent_tuning"] is True  # a no-op for the CPU's C++ kernels
    assert result["status"] == "ok" and result["checks"]["loss_finite"]


def test_a_captured_graph_is_freed_before_the_process_group_is_destroyed(native, extras, monkeypatch):
    """A live graph holding NCCL kernels makes destroy_process_group hang (pytorch/pytorch#115388): the graph holding
    the captured all-reduce must go first."""
    order = []

    class FakeGraph:
        def replay(self):
            order.append("replay")

        def reset(self):
            order.append("graph freed")

    monkeypatch.setattr(native.torch.cuda, "Stream", lambda: None)
    monkeypatch.setattr(extras.torch.cuda, "synchronize", lambda *args: order.append("synchronize"))
    monkeypatch.setattr(native.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(native.dist, "destroy_process_group", lambda *args: order.append("group destroyed"))
    step = extras.GraphedStep(lambda: None, eager_steps=0)
    step.graph, step.static_loss = FakeGraph(), native.torch.zeros(())
    step()
    native.shut_down(step)
    assert order == ["replay", "synchronize", "graph freed", "group destroyed"]
    assert step.graph is None and step.static_loss is None
    order.clear()
    native.shut_down(None)  # no graph (every other run): only the group
    assert order == ["group destroyed"]


@pytest.mark.parametrize("size", [32, 33])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_the_computation_options_compute_the_same_model(native, extras, size, layout):
    """--space-to-depth-stem, --dense-max-pool-backward, --sums-batch-norm and --fused-batch-norm (in PyTorch's
    operators, as every layer runs on the CPU) change how the model is computed, not the model: the same parameters
    and buffers under the same names, and in float64 the same output, the same gradient of every parameter and the
    same running statistics as torchvision's ResNet-50 (to rounding, which batch norm over 4 images magnifies to
    ~1e-10)."""
    import copy

    import torch
    torch.manual_seed(0)
    memory_format = getattr(torch, "channels_last" if layout == "channels_last" else "contiguous_format")
    reference = native.build_model().double().to(memory_format=memory_format)
    with torch.no_grad():  # not the initial weight 1, bias 0 and statistics 0 / 1, which would hide their misuse
        for norm in (module for module in reference.modules() if isinstance(module, torch.nn.BatchNorm2d)):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
            norm.running_mean.uniform_(-0.5, 0.5)
            norm.running_var.uniform_(0.5, 2.0)
    images = torch.randn(4, 3, size, size, dtype=torch.float64).contiguous(memory_format=memory_format)
    labels = torch.randint(0, 1000, (4,))
    for stem_conv, max_pool_backward, batch_norm in (("space_to_depth", "torchvision", "torchvision"),
                                                     ("torchvision", "dense", "torchvision"),
                                                     ("torchvision", "torchvision", "sums"),
                                                     ("space_to_depth", "dense", "sums"),
                                                     ("torchvision", "torchvision", "fused")):
        config = {"stem_conv": stem_conv, "max_pool_backward": max_pool_backward, "batch_norm": batch_norm}
        baseline = copy.deepcopy(reference)
        model = extras.apply_computation_options(copy.deepcopy(reference), config)
        assert [name for name, _ in model.named_parameters()] == [name for name, _ in reference.named_parameters()]
        assert model.state_dict().keys() == reference.state_dict().keys()
        outputs = [net(images) for net in (baseline, model)]
        assert torch.allclose(outputs[0], outputs[1], rtol=1e-9, atol=1e-9), config
        grads = [torch.autograd.grad(torch.nn.functional.cross_entropy(out, labels), list(net.parameters()))
                 for out, net in zip(outputs, (baseline, model))]
        worst = max(((a - b).abs().max() / a.abs().max().clamp_min(1e-30)).item() for a, b in zip(*grads))
        assert worst < 1e-8, (config, worst)
        for name, buffer in baseline.named_buffers():  # the running statistics and the batch counts
            assert torch.allclose(buffer, model.get_buffer(name), rtol=1e-9, atol=1e-12), (config, name)


def test_a_comm_hook_and_the_computation_options_reach_both_twins_which_train_alike(tmp_path, native_two_rank):
    """Both twins (eager, 2 gloo processes) with PyTorch's fp16 compression of the all-reduce (gloo takes fp16) and
    the three computation options: recorded, parameters in sync, the same loss at every step and the same weights
    as each other. The rounded gradients change the training (on 4 images a step the losses part from step 2 on),
    so a twin that ran without the hook would not match the other; before any update the loss is torchvision's
    model's (to float32 rounding: the convolution sums its 147 products in another order, batch norm its
    statistics)."""
    options = ["--comm-hook", "fp16_compress", "--space-to-depth-stem", "--dense-max-pool-backward",
               "--sums-batch-norm"]
    results = {}
    for script in (NATIVE, LIGHTNING):  # native's ranks started as a launcher would; the twin's by Lightning
        output = tmp_path / f"{script.parent.name}-options.json"
        if script == NATIVE:
            outputs = finish(launch_by_hand(NATIVE, [*SMALL, *options, "--output", str(output)]))
            assert [code for code, _, _ in outputs] == [0, 0], outputs
        else:
            proc = run_script(script, [*SMALL, *options, "--output", str(output), "--devices", "2"])
            assert proc.returncode == 0, proc.stdout + proc.stderr
        results[script] = result = read_result(output)
        assert (result["config"]["comm_hook"], result["config"]["stem_conv"], result["config"]["max_pool_backward"],
                result["config"]["batch_norm"]) == ("fp16_compress", "space_to_depth", "dense", "sums")
        assert result["checks"]["parameters_synchronized"] is True
    native, lightning = results[NATIVE], results[LIGHTNING]
    assert lightning["loss_per_step"] == pytest.approx(native["loss_per_step"], rel=1e-5, abs=1e-6)
    assert lightning["checks"]["final_parameter_checksum"] == pytest.approx(
        native["checks"]["final_parameter_checksum"], rel=1e-6)
    _, plain = native_two_rank  # the same command without the options
    assert (plain["config"]["comm_hook"], plain["config"]["stem_conv"], plain["config"]["batch_norm"]) == \
        ("none", "torchvision", "torchvision")
    assert native["loss_per_step"][0] == pytest.approx(plain["loss_per_step"][0], rel=1e-4)
    assert native["loss_per_step"] != pytest.approx(plain["loss_per_step"], rel=1e-3)
    assert native["efficiency"]["model_flops_per_image"] == plain["efficiency"]["model_flops_per_image"]
