"""Plumbing of the speed options (compile, CUDA graphs, DDP buckets) and their bad combinations.

Their speed is proven by the device runs in results/; here they must reach the model, be recorded, and be
refused in one line where they cannot work."""
import pytest

from conftest import (LIGHTNING, NATIVE, SMALL, expect_usage_error, load_script, pretend_gpus, read_result,
                      resolve_config, run_script)

@pytest.mark.parametrize("argv,rule", [
    (["--cuda-graphs", "--device", "cpu"], "--cuda-graphs needs --device cuda"),
    (["--cuda-graphs", "--precision", "fp16", "--warmup-steps", "20"], "--cuda-graphs with fp16 needs a fixed --loss-scale (e.g. 1024)"),
    (["--cuda-graphs", "--compile-mode", "reduce-overhead", "--warmup-steps", "20"], "captures its own CUDA graphs"),
    (["--cuda-graphs", "--compile-mode", "max-autotune", "--warmup-steps", "20"], "captures its own CUDA graphs"),
    (["--cuda-graphs", "--warmup-steps", "1"], "--cuda-graphs needs --warmup-steps >= 2"),
    (["--compiled-ddp", "python_reducer"], "--compiled-ddp needs --compile"),
    (["--coordinate-descent-tuning"], "--coordinate-descent-tuning needs --compile or --compile-mode"),
    (["--compile-mode", "fastest"], "invalid choice"),
    (["--bucket-cap-mb", "0"], "must be a positive finite number"),
    (["--loss-scale", "1024"], "--loss-scale 1024 needs --precision fp16"),
    (["--loss-scale", "1000", "--precision", "fp16"], "must be dynamic or a power of two"),
    (["--loss-scale", "0.5", "--precision", "fp16"], "must be dynamic or a power of two"),
    (["--loss-scale", str(2**25), "--precision", "fp16"], "from 1 to 2**24"),
    (["--bucket-cap-mb", "1e300"], "must be at most 1e6 MB"),
    (["--comm-hook", "bf16_compress", "--cuda-graphs", "--warmup-steps", "20"],
     "--comm-hook bf16_compress with --cuda-graphs is not supported"),
    (["--comm-hook", "fp16_compress", "--compile", "--compiled-ddp", "python_reducer"],
     "does not apply to --compiled-ddp python_reducer"),
    (["--comm-hook", "powersgd"], "invalid choice"),
])
def test_bad_combinations(native, argv, rule, tmp_path, monkeypatch, capsys):
    pretend_gpus(monkeypatch, count=2)
    expect_usage_error(native, argv, rule, tmp_path / "r.json", monkeypatch, capsys)


def test_cuda_graphs_with_ddp_need_eleven_eager_steps_first(native, tmp_path, monkeypatch):
    args = native.parse_arguments(["--cuda-graphs", "--warmup-steps", "11", "--output", str(tmp_path / "r.json")])
    launch = native.detect_launch({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"})
    config = native.resolve_harness_config(args, launch, "ddp", True, 2, True)
    with pytest.raises(native.UsageError, match="warmup-steps >= 12.*11 eager DDP steps"):
        native.resolve_ddp_options(args, config, 2)
    args.warmup_steps = config["warmup_steps"] = 12
    native.resolve_ddp_options(args, config, 2)
    assert config["cuda_graphs"] is True


def test_fp16_uses_the_unfused_sgd(native, tmp_path):
    for precision, impl in (("fp16", "foreach"), ("bf16", "fused"), ("fp32", "fused")):
        args = native.parse_arguments(["--precision", precision, "--output", str(tmp_path / "r.json")])
        config = native.resolve_harness_config(args, native.detect_launch({}), "ddp", True, 1, True)
        assert native.sgd_implementation(config) == impl, precision


def test_a_fixed_fp16_loss_scale_replaces_the_grad_scaler_and_fits_a_graph(native, tmp_path):
    out = ["--output", str(tmp_path / "r.json")]
    config = resolve_config(native, ["--precision", "fp16", "--loss-scale", "1024", "--cuda-graphs",
                                     "--warmup-steps", "2", *out], count=1, ddp_world_size=1)
    assert (config["loss_scale"], config["grad_scaler"], config["cuda_graphs"]) == (1024.0, False, True)
    assert native.sgd_implementation(config) == "fused"  # no GradScaler, so the fused kernel is safe again
    config = resolve_config(native, ["--precision", "fp16", *out], count=1, ddp_world_size=1)
    assert (config["loss_scale"], config["grad_scaler"]) == ("dynamic", True)


def test_ddp_options_reach_the_run_and_the_result(tmp_path):
    output = tmp_path / "ddp-options.json"
    proc = run_script(NATIVE, [*SMALL, "--steps", "2", "--bucket-cap-mb", "10", "--no-gradient-as-bucket-view",
                               "--no-broadcast-buffers", "--static-graph", "--output", str(output)], nproc=2)
    assert proc.returncode == 0, proc.stderr
    result = read_result(output)
    config = result["config"]
    assert (config["bucket_cap_mb"], config["gradient_as_bucket_view"], config["static_graph"],
            config["broadcast_buffers"]) == (10.0, False, True, False)
    assert result["checks"]["parameters_synchronized"] is True


def test_a_comm_hook_reaches_ddp_and_the_twins_train_alike_with_it(tmp_path, native_two_rank):
    # Both twins with PyTorch's fp16 compression of the all-reduce (gloo takes fp16 and bf16): the same loss at
    # every step and the same weights, as without a hook; the option is recorded. The rounded gradients change
    # the training (on 4 images a step the losses part from step 2 on), so a twin that ran without the hook
    # would not match the other.
    results = {}
    for script, extra in ((NATIVE, []), (LIGHTNING, ["--devices", "2"])):
        output = tmp_path / f"{script.parent.name}-hook.json"
        proc = run_script(script, [*SMALL, "--comm-hook", "fp16_compress", "--output", str(output), *extra],
                          nproc=1 if extra else 2)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        results[script] = read_result(output)
        assert results[script]["config"]["comm_hook"] == "fp16_compress"
        assert results[script]["checks"]["parameters_synchronized"] is True
    native, lightning = results[NATIVE], results[LIGHTNING]
    _, without_hook = native_two_rank  # the same command without --comm-hook
    assert native["loss_per_step"][0] == without_hook["loss_per_step"][0]  # before any update
    assert native["loss_per_step"] != pytest.approx(without_hook["loss_per_step"], rel=1e-3)
    assert lightning["loss_per_step"] == pytest.approx(native["loss_per_step"], rel=1e-5, abs=1e-6)
    assert lightning["checks"]["final_parameter_checksum"] == pytest.approx(
        native["checks"]["final_parameter_checksum"], rel=1e-6)


@pytest.mark.parametrize("hook", ["none", "bf16_compress", "fp16_compress"])
def test_each_script_registers_the_comm_hook_it_records(native, hook, tmp_path, monkeypatch):
    # DDP's own log names the hook that runs: native's build_step and the Lightning twin's strategy (which
    # registers it on the CPU too, where Lightning's DDPStrategy would skip it) register the one asked for.
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    twin = load_script(LIGHTNING, "lightning_twin_hooks")
    args = native.parse_arguments([*SMALL, "--comm-hook", hook, "--output", str(tmp_path / "r.json")])
    config, _ = native.resolve_config(args, native.detect_launch({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                                                                   "LOCAL_WORLD_SIZE": "2"}))
    monkeypatch.setattr(native, "build_model", lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3),
                        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 10)))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        _, model = native.build_step(config, torch.device("cpu"), 0, 2)
        strategy = twin.CurrentStreamDDPStrategy(ddp_comm_hook=twin.comm_hook_function(config))
        strategy.parallel_devices = [torch.device("cpu")]
        strategy.model = DistributedDataParallel(torch.nn.Linear(4, 4))
        strategy._register_ddp_hooks()
        expected = None if hook == "none" else f"{hook}_hook"
        assert model._get_ddp_logging_data().get("comm_hook") == expected
        assert strategy.model._get_ddp_logging_data().get("comm_hook") == expected
    finally:
        dist.destroy_process_group()


def test_ddp_defaults_use_bucket_views_and_broadcast_buffers(native, tmp_path):
    out = ["--output", str(tmp_path / "r.json")]
    config = resolve_config(native, out, count=1, ddp_world_size=1)
    assert (config["gradient_as_bucket_view"], config["broadcast_buffers"], config["loss_scale"]) == (True, True, None)
    (key, value), = native.ddp_buffer_option(config).items()  # the keyword this torch's DDP takes, and the choice
    assert key in ("broadcast_buffers", "forward_sync_buffers") and value is True
    config = resolve_config(native, ["--no-broadcast-buffers", *out], count=1, ddp_world_size=1)
    assert native.ddp_buffer_option(config) == {key: False}


def test_the_compiled_ddp_mode_that_runs_is_recorded(native, tmp_path):
    # Without a choice PyTorch splits a compiled graph at DDP's buckets: recorded as ddp_optimizer, in the
    # Lightning twin too (Dynamo sees DDP around the compiled ResNet); one rank has no DDP to treat.
    import torch._dynamo
    out = ["--output", str(tmp_path / "r.json")]
    optimize_ddp = torch._dynamo.config.optimize_ddp
    try:
        assert resolve_config(native, ["--compile", *out], count=2, ddp_world_size=2)["compiled_ddp"] == "ddp_optimizer"
        assert resolve_config(native, ["--compile", *out], count=2, ddp_world_size=1)["compiled_ddp"] is None
        assert resolve_config(native, out, count=2, ddp_world_size=2)["compiled_ddp"] is None
        config = resolve_config(native, ["--compile", "--compiled-ddp", "no_optimization", *out], count=2,
                                ddp_world_size=2)
        assert config["compiled_ddp"] == "no_optimization" and torch._dynamo.config.optimize_ddp == "no_optimization"
    finally:
        torch._dynamo.config.optimize_ddp = optimize_ddp


def test_coordinate_descent_tuning_reaches_inductor_and_what_runs_is_recorded(native, tmp_path):
    import torch._inductor.config as inductor_config
    out = ["--output", str(tmp_path / "r.json")]

    def tuned(argv):
        return resolve_config(native, [*argv, *out], count=1, ddp_world_size=1)["coordinate_descent_tuning"]

    # Inductor's own patch, not monkeypatch: monkeypatch's undo deletes the setting, and Inductor then hides it
    # from every later compilation in this process
    with inductor_config.patch(coordinate_descent_tuning=False):
        assert tuned([]) is False and tuned(["--compile"]) is False
        # the max-autotune modes turn it on themselves: recorded, without touching the global setting
        assert tuned(["--compile-mode", "max-autotune-no-cudagraphs"]) is True
        assert inductor_config.coordinate_descent_tuning is False
        assert tuned(["--compile", "--coordinate-descent-tuning"]) is True
        assert inductor_config.coordinate_descent_tuning is True
        # set by TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 (or the option earlier): recorded as what runs
        assert tuned(["--compile"]) is True
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


def test_a_captured_graph_is_freed_before_the_process_group_is_destroyed(native, monkeypatch):
    """Two 2-GPU --cuda-graphs runs on the H200s wrote their results and then hung in destroy_process_group
    (pytorch#115388): the graph holding the captured all-reduce must go first."""
    order = []

    class FakeGraph:
        def replay(self):
            order.append("replay")

        def reset(self):
            order.append("graph freed")

    monkeypatch.setattr(native.torch.cuda, "Stream", lambda: None)
    monkeypatch.setattr(native.torch.cuda, "synchronize", lambda *args: order.append("synchronize"))
    monkeypatch.setattr(native.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(native.dist, "destroy_process_group", lambda *args: order.append("group destroyed"))
    step = native.GraphedStep(lambda: None, eager_steps=0)
    step.graph, step.static_loss = FakeGraph(), native.torch.zeros(())
    step()
    native.shut_down(step)
    assert order == ["replay", "synchronize", "graph freed", "group destroyed"]
    assert step.graph is None and step.static_loss is None
    order.clear()
    native.shut_down(None)  # no graph (every other run): only the group
    assert order == ["group destroyed"]


def test_cudnn_benchmark_limit_reaches_cudnn_and_what_runs_is_recorded(native, tmp_path, monkeypatch):
    """--cudnn-benchmark-limit sets torch.backends.cudnn.benchmark_limit; without it PyTorch's own limit is
    recorded, so that a result always says how many algorithms cuDNN timed per convolution."""
    import torch
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark_limit", 10)
    out = ["--output", str(tmp_path / "r.json")]
    launch = {"local_rank": 0, "local_world_size": 1}

    def applied(argv):
        config = resolve_config(native, [*argv, *out], count=1, ddp_world_size=1)
        native.setup_device(config, launch, 1)
        return config["cudnn_benchmark_limit"], torch.backends.cudnn.benchmark_limit

    assert applied([]) == (10, 10)
    assert applied(["--cudnn-benchmark-limit", "0"]) == (0, 0)
    assert applied(["--no-cudnn-benchmark"])[0] is None  # heuristics: no algorithm is timed


def test_the_stem_probes_max_pools_give_the_modules_gradient():
    """docs/diagnostics/stem/README.md reports a max-pool backward written as a scatter, and times the scripts'
    dense max-pool backward and space-to-depth convolution; its claim that each gives the module's output and
    gradient (ties included, both memory layouts, odd sizes) is checked here, on the CPU in float64."""
    from conftest import ROOT, load_script
    probe = load_script(ROOT / "docs" / "diagnostics" / "stem" / "stem_probe.py", "stem_probe_under_test")
    probe.check()  # asserts equal outputs and gradients
    import torch
    for pool in (probe.ScatterMaxPoolModule(), probe.bench.DenseMaxPool()):
        images = torch.tensor([[[[1.0, 5.0, 5.0], [0.0, 2.0, 5.0], [3.0, 1.0, 4.0]]]], requires_grad=True)
        pool(images).sum().backward()
        # a 2x2 output over a 3x3 input (3x3 windows, stride 2, padding 1): the top windows both pick the first 5
        # in scan order, (0, 1), although the top-right window holds three 5s; the bottom ones pick 3 and the 5 at
        # (1, 2)
        assert images.grad.tolist() == [[[[0.0, 2.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]]], pool
        reference = images.detach().clone().requires_grad_(True)
        torch.nn.MaxPool2d(3, 2, 1)(reference).sum().backward()
        assert torch.equal(reference.grad, images.grad)


@pytest.mark.parametrize("size", [32, 33])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_the_computation_options_compute_the_same_model(native, size, layout):
    """--space-to-depth-stem, --dense-max-pool-backward and --sums-batch-norm change how the model is computed, not
    the model: the same parameters and buffers under the same names, and in float64 the same output, the same
    gradient of every parameter and the same running statistics as torchvision's ResNet-50 (to rounding, which
    batch norm over 4 images magnifies to ~1e-10)."""
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
                                                     ("space_to_depth", "dense", "sums")):
        config = {"stem_conv": stem_conv, "max_pool_backward": max_pool_backward, "batch_norm": batch_norm}
        baseline = copy.deepcopy(reference)
        model = native.apply_computation_options(copy.deepcopy(reference), config)
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


def test_the_computation_options_reach_both_twins_which_train_alike(tmp_path, native_two_rank):
    """Both twins with the three computation options (eager, 2 gloo processes): recorded, parameters in sync, the
    same loss at every step and the same weights as each other; before any update the loss is torchvision's
    model's (to float32 rounding: the convolution sums its 147 products in another order, batch norm its
    statistics)."""
    fast = ["--space-to-depth-stem", "--dense-max-pool-backward", "--sums-batch-norm"]
    results = {}
    for script, extra in ((NATIVE, []), (LIGHTNING, ["--devices", "2"])):
        output = tmp_path / f"{script.parent.name}-stem.json"
        proc = run_script(script, [*SMALL, *fast, "--output", str(output), *extra], nproc=1 if extra else 2)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "computed another way (same model): conv1 as space to depth, dense max-pool backward, batch-norm " \
               "statistics from sums; these are for compiled steps (eager, on an H200, the dense max-pool " \
               "backward made the stem 2.3x slower and the sums batch norm made the step 4.6x slower)" \
               in proc.stdout  # rank 0 says so, as eager is where they do not pay
        results[script] = result = read_result(output)
        assert (result["config"]["stem_conv"], result["config"]["max_pool_backward"],
                result["config"]["batch_norm"]) == ("space_to_depth", "dense", "sums")
        assert result["checks"]["parameters_synchronized"] is True
    native, lightning = results[NATIVE], results[LIGHTNING]
    assert lightning["loss_per_step"] == pytest.approx(native["loss_per_step"], rel=1e-5, abs=1e-6)
    assert lightning["checks"]["final_parameter_checksum"] == pytest.approx(
        native["checks"]["final_parameter_checksum"], rel=1e-6)
    _, torchvision_stem = native_two_rank  # the same command without the options
    assert (torchvision_stem["config"]["stem_conv"], torchvision_stem["config"]["batch_norm"]) == \
        ("torchvision", "torchvision")
    assert native["loss_per_step"][0] == pytest.approx(torchvision_stem["loss_per_step"][0], rel=1e-4)
    assert native["efficiency"]["model_flops_per_image"] == torchvision_stem["efficiency"]["model_flops_per_image"]


def test_the_batch_norm_probes_sums_batch_norm_is_pytorchs():
    """docs/diagnostics/batchnorm/README.md times the scripts' sums batch norm against PyTorch's; its claim that
    both compute the same thing (output, gradients, running statistics; eager and compiled; random weights, biases
    and running statistics; in float32 a mean of 1000 against a spread of 3, where the sums lose digits without
    their shift) is checked here, on the CPU."""
    from conftest import ROOT, load_script
    probe = load_script(ROOT / "docs" / "diagnostics" / "batchnorm" / "bn_probe.py", "bn_probe_under_test")
    probe.check()  # raises SystemExit on any difference
    import torch
    for other in (torch.nn.BatchNorm2d(4, affine=False), torch.nn.BatchNorm2d(4, momentum=None),
                  torch.nn.SyncBatchNorm(4)):  # a form it was not written for is refused, not half-computed
        with pytest.raises(ValueError, match="replaces BatchNorm2d with affine parameters"):
            probe.bench.SumsBatchNorm2d.replacing(other)


def test_the_probes_time_each_iteration_with_the_harness_timer():
    """stem_probe.py and bn_probe.py time their iterations through probe_checks.time_iterations (the harness's
    StepTimer and summary); on the CPU it times with the host clock: one time per iteration, each one's own."""
    import time
    from conftest import ROOT, load_script
    import torch
    checks = load_script(ROOT / "docs" / "diagnostics" / "probe_checks.py", "probe_checks_under_test")
    calls = []
    stats = checks.time_iterations(lambda: (calls.append(1), time.sleep(0.02 * len(calls))), 3, torch.device("cpu"))
    assert len(calls) == stats["count"] == 3
    assert 20 <= stats["min"] < 40 <= stats["median"] < 60 <= stats["max"] < 400  # 20, 40 and 60 ms of sleep


@pytest.mark.parametrize("probe,argv,rule", [
    *[(probe, ["--batch", "0"], "argument --batch: must be a positive integer") for probe in ("stem", "batchnorm")],
    *[(probe, ["--iterations", "-3"], "argument --iterations: must be a positive integer")
      for probe in ("stem", "batchnorm")],
    ("stem", ["--benchmark-limit", "-1"], "argument --benchmark-limit: must be zero or a positive integer"),
    ("stem", ["--s2d-channels", "12"], "--s2d-channels needs --conv space-to-depth"),
    ("stem", ["--conv", "space-to-depth", "--pad-channels", "8"], "--conv space-to-depth takes the 3-channel image"),
    ("batchnorm", ["--batch-norm", "welford"], "argument --batch-norm: invalid choice")])
def test_the_stem_and_batch_norm_probes_refuse_bad_input_in_one_line(probe, argv, rule, tmp_path):
    from conftest import ROOT
    script = {"stem": "stem_probe.py", "batchnorm": "bn_probe.py"}[probe]
    output = tmp_path / "probe.json"
    proc = run_script(ROOT / "docs" / "diagnostics" / probe / script, [*argv, "--json", str(output)])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and rule in lines[0], proc.stderr
    assert not output.exists()


def test_the_tail_probe_times_ddp_after_an_all_at_once_backward(tmp_path):
    """docs/diagnostics/compiled-scaling/tail_probe.py on 2 gloo processes: DDP sees ResNet-50's 161 gradients at
    once, averages them (the ranks' gradients differ, the averages agree) and the probe writes its JSON."""
    import json
    from conftest import ROOT
    probe = ROOT / "docs" / "diagnostics" / "compiled-scaling" / "tail_probe.py"
    output = tmp_path / "tail.json"
    proc = run_script(probe, ["--device", "cpu", "--iterations", "3", "--json", str(output)], nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(output.read_text())
    assert result["world_size"] == 2 and result["parameters"] == 161 and result["gradients_in_sync"] is True
    assert result["gradient_bytes"] == 4 * 25_557_032  # ResNet-50's parameters in fp32
    assert result["plain_ms"]["count"] == result["ddp_ms"]["count"] == 3
    assert result["tail_ms"] == result["ddp_ms"]["median"] - result["plain_ms"]["median"]
    assert "tail probe: 2 ranks, hook none, buckets 25 MB" in proc.stdout


@pytest.mark.parametrize("argv,rule", [(["--device", "cpu"], "run it under torchrun"),
                                       (["--iterations", "0"], "argument --iterations: must be a positive integer"),
                                       (["--bucket-cap-mb", "0"], "must be a positive finite number")])
def test_the_tail_probe_refuses_bad_input_in_one_line(argv, rule, tmp_path):
    from conftest import ROOT
    output = tmp_path / "tail.json"
    proc = run_script(ROOT / "docs" / "diagnostics" / "compiled-scaling" / "tail_probe.py",
                      [*argv, "--json", str(output)])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and rule in lines[0], proc.stderr
    assert not output.exists()


@pytest.mark.parametrize("probe", [("stem", "stem_probe.py"), ("batchnorm", "bn_probe.py"),
                                   ("compiled-scaling", "tail_probe.py"),
                                   ("compiled-scaling", "link_load.py", "--mode", "idle")])
def test_the_probes_refuse_an_unwritable_json_before_measuring(probe, tmp_path):
    from conftest import ROOT
    blocked = tmp_path / "file"
    blocked.write_text("")
    proc = run_script(ROOT / "docs" / "diagnostics" / probe[0] / probe[1],
                      [*probe[2:], "--json", str(blocked / "out.json")])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0] == f"{probe[1]}: error: --json directory {blocked} cannot be written ({blocked} is not a writable directory)"


def test_the_link_load_all_reduces_at_its_pace_and_writes_its_window(tmp_path):
    """docs/diagnostics/compiled-scaling/link_load.py (the controlled test of the power share) on 2 gloo ranks."""
    from conftest import ROOT
    load = ROOT / "docs" / "diagnostics" / "compiled-scaling" / "link_load.py"
    output = tmp_path / "busy.json"
    proc = run_script(load, ["--mode", "busy", "--seconds", "1", "--megabytes", "1", "--period-ms", "100",
                             "--device", "cpu", "--json", str(output)], nproc=2)
    assert proc.returncode == 0, proc.stderr
    import json
    result = json.loads(output.read_text())
    assert result["mode"] == "busy" and result["world_size"] == 2 and 5 <= result["all_reduces"] <= 11
    assert result["all_reduce_ms"]["count"] == result["all_reduces"] and 0 < result["busy_share"] < 1
    first, last = result["window_utc"]
    assert first < last and result["wall_s"] >= 1


@pytest.mark.parametrize("argv,under_torchrun,rule", [
    (["--mode", "busy"], False, "run it under torchrun"),
    (["--mode", "busy", "--megabytes", "2e6"], True, "must be at most 1e6 MB"),
    (["--mode", "busy", "--megabytes", "5e5"], True, "--megabytes 500000 does not fit in this device's memory"),
    (["--mode", "often"], True, "invalid choice"),
])
def test_the_link_load_refuses_bad_input_in_one_line(argv, under_torchrun, rule, tmp_path):
    from conftest import ROOT, clean_env, free_port
    env = clean_env(**(dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=str(free_port())) if under_torchrun else {}))
    output = tmp_path / "load.json"
    proc = run_script(ROOT / "docs" / "diagnostics" / "compiled-scaling" / "link_load.py",
                      [*argv, "--device", "cpu", "--json", str(output)], env=env)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and rule in lines[0], proc.stderr
    assert not output.exists()
