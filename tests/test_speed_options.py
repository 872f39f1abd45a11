"""Plumbing of the speed options (compile, CUDA graphs, DDP buckets) and their bad combinations.

Their speed is proven by the device runs in results/; here they must reach the model, be recorded, and be
refused in one line where they cannot work."""
import pytest

from conftest import NATIVE, SMALL, expect_usage_error, pretend_gpus, read_result, run_script

@pytest.mark.parametrize("argv,rule", [
    (["--cuda-graphs", "--device", "cpu"], "--cuda-graphs needs --device cuda"),
    (["--cuda-graphs", "--precision", "fp16", "--warmup-steps", "20"], "--cuda-graphs with fp16 needs a fixed --loss-scale"),
    (["--cuda-graphs", "--compile-mode", "reduce-overhead", "--warmup-steps", "20"], "captures its own CUDA graphs"),
    (["--cuda-graphs", "--compile-mode", "max-autotune", "--warmup-steps", "20"], "captures its own CUDA graphs"),
    (["--cuda-graphs", "--warmup-steps", "1"], "--cuda-graphs needs --warmup-steps >= 2"),
    (["--compiled-ddp", "python_reducer"], "--compiled-ddp needs --compile"),
    (["--compile-mode", "fastest"], "invalid choice"),
    (["--bucket-cap-mb", "0"], "must be a positive finite number"),
    (["--loss-scale", "1024"], "--loss-scale 1024 needs --precision fp16"),
    (["--loss-scale", "1000", "--precision", "fp16"], "must be dynamic or a power of two"),
    (["--loss-scale", "0.5", "--precision", "fp16"], "must be dynamic or a power of two"),
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
    args = native.parse_arguments(["--precision", "fp16", "--loss-scale", "1024", "--cuda-graphs",
                                   "--warmup-steps", "2", "--output", str(tmp_path / "r.json")])
    config = native.resolve_harness_config(args, native.detect_launch({}), "ddp", True, 1, True)
    native.resolve_ddp_options(args, config, 1)
    assert (config["loss_scale"], config["grad_scaler"], config["cuda_graphs"]) == (1024.0, False, True)
    assert native.sgd_implementation(config) == "fused"  # no GradScaler, so the fused kernel is safe again
    args = native.parse_arguments(["--precision", "fp16", "--output", str(tmp_path / "r.json")])
    config = native.resolve_harness_config(args, native.detect_launch({}), "ddp", True, 1, True)
    native.resolve_ddp_options(args, config, 1)
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


def test_ddp_defaults_use_bucket_views_and_broadcast_buffers(native, tmp_path):
    config = native.resolve_harness_config(native.parse_arguments(["--output", str(tmp_path / "r.json")]),
                                           native.detect_launch({}), "ddp", True, 1, True)
    native.resolve_ddp_options(native.parse_arguments(["--output", str(tmp_path / "r.json")]), config, 1)
    assert (config["gradient_as_bucket_view"], config["broadcast_buffers"], config["loss_scale"]) == (True, True, None)
    key, = native.ddp_buffer_option(config)  # the keyword this torch's DDP takes
    assert key in ("broadcast_buffers", "forward_sync_buffers")


def test_compile_runs_end_to_end(tmp_path):
    """torch.compile on the CPU (Inductor's C++ backend): slow to compile, so two images and one timed step."""
    output = tmp_path / "compiled.json"
    proc = run_script(NATIVE, [*SMALL, "--batch-size-per-device", "2", "--warmup-steps", "1", "--steps", "1",
                               "--compile-mode", "default", "--output", str(output)], timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = read_result(output)
    assert result["config"]["compile"] is True and result["config"]["compile_mode"] == "default"
    assert result["status"] == "ok" and result["checks"]["loss_finite"]
