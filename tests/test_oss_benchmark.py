"""oss_benchmark.py on the CPU: every strategy gloo can run, in one launch of 2 processes at 32 px; the fairscale
preset; the table rebuilt from the result files; bad input (one line, exit 2, nothing written)."""
import json
import math
import re
import statistics

import pytest
import torch

from conftest import (OSS, SMALL, clean_env, finish, launch_by_hand, load_script, one_error_line, read_result,
                      run_script)

GLOO_STRATEGIES = ["ddp", "zero1", "fsdp_zero2", "fsdp_zero3", "oss_ddp", "oss_sharded_ddp"]  # the run order
# SMALL, shortened: six strategies in one launch must stay well inside the suite's time on 2 CPU cores.
TINY = [*SMALL, "--batch-size-per-device", "2", "--warmup-steps", "1", "--steps", "2", "--phase-steps", "1",
        "--profile-steps", "1"]


@pytest.fixture(scope="module")
def script():
    return load_script(OSS, "oss_benchmark_under_test")


@pytest.fixture(scope="module")
def all_run(tmp_path_factory):
    """One --strategy all launch (channels_last, to exercise the layout restore), a result per strategy."""
    directory = tmp_path_factory.mktemp("oss")
    proc = run_script(OSS, [*TINY, "--model", "resnet18", "--memory-format", "channels_last",
                            "--output", str(directory / "all.json")], nproc=2, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    paths = {strategy: directory / f"all-{strategy}.json" for strategy in GLOO_STRATEGIES}
    return proc, paths, {strategy: read_result(path) for strategy, path in paths.items()}


def test_all_runs_every_gloo_strategy_with_parameters_in_sync(all_run):
    proc, paths, results = all_run
    assert "note: --strategy all skips zero1_overlap on gloo" in proc.stdout
    assert "note: fsdp_zero2, fsdp_zero3 keep their parameters contiguous" in proc.stdout
    assert not (paths["ddp"].parent / "all-zero1_overlap.json").exists()
    # The renamed outputs are announced before the run, not changed silently.
    assert f"note: 6 strategies, one result each: {paths['ddp']}" in proc.stdout
    windows = []
    for strategy, result in results.items():
        assert (result["benchmark"], result["strategy"], result["status"]) == ("oss_benchmark.py", strategy, "ok")
        config = result["config"]
        assert config["output"] == str(paths[strategy])
        assert (config["model"], config["optimizer"], config["backend"]) == ("resnet18", "sgd", "gloo")
        assert config["strategies_in_launch"] == GLOO_STRATEGIES
        assert result["checks"]["parameters_synchronized"] is True, strategy
        assert result["checks"]["parameter_max_abs_diff"] == 0.0
        assert result["checks"]["loss_finite"] and all(math.isfinite(v) for v in result["loss_per_step"])
        assert result["throughput"]["timed_steps"] == 2
        windows.append(result["throughput"]["rank0_timed_window_utc"])
        assert [len(times) for times in result["step_times_ms_per_rank"]] == [2, 2]
    # Each strategy's timed steps have their own window (UTC), one after the other in the launch.
    windows.sort()
    assert all(start <= end for start, end in windows)
    assert all(before[1] <= after[0] for before, after in zip(windows, windows[1:]))
    # Same seed, same data: every strategy starts from the same loss.
    assert len({round(r["loss_per_step"][0], 5) for r in results.values()}) == 1
    assert "Traceback" not in proc.stderr


def test_measured_collectives_match_the_analytic_volumes(all_run):
    _, _, results = all_run
    for strategy, result in results.items():
        analysis = result["analysis"]
        collectives = analysis["collectives"]
        measured, analytic = collectives["measured_per_step"], collectives["analytic_bytes_per_step"]
        assert set(measured) == set(analytic), strategy
        assert collectives["unknown_dtype_assumed_4_bytes"] == 0
        for kind, ratio in collectives["measured_over_analytic"].items():
            assert ratio == pytest.approx(1.0, rel=1e-9), (strategy, kind)
        assert collectives["wire_bytes_per_rank_measured"] == pytest.approx(collectives["wire_bytes_per_rank_analytic"])
        # Every rank saw the same collectives.
        assert collectives["measured_per_step_per_rank"][0] == collectives["measured_per_step_per_rank"][1]
    parameter_bytes = results["ddp"]["analysis"]["parameter_bytes"]
    assert parameter_bytes == 4 * results["ddp"]["analysis"]["parameters"] == 4 * 11_689_512  # resnet18, fp32
    # DDP all-reduces exactly the gradient bytes, once per step.
    assert results["ddp"]["analysis"]["collectives"]["measured_per_step"]["all-reduce"]["bytes"] == parameter_bytes
    # ShardedDDP broadcasts every buffer on its own, plus one parameter shard per rank.
    sharded = results["oss_sharded_ddp"]["analysis"]
    assert sharded["collectives"]["measured_per_step"]["broadcast"]["count"] == sharded["buffers"] + 2
    # ZeRO-3 gathers every unit twice (forward, backward), ZeRO-2 once.
    gathers = {s: results[s]["analysis"]["collectives"]["measured_per_step"]["all-gather"]["count"]
               for s in ("fsdp_zero2", "fsdp_zero3")}
    assert gathers["fsdp_zero3"] == 2 * gathers["fsdp_zero2"] == 2 * results["fsdp_zero2"]["analysis"]["fsdp_units"]


def test_fsdp_units_decide_the_collectives(script, tmp_path):
    """--fsdp-units decides the unit count: one all-gather and one reduce-scatter each, the same bytes.
    ResNet-18: 8 blocks, 4 stages (plus the root, always a unit)."""
    model = script.build_model("resnet18")
    assert [len(script.fsdp_units(model, units)) for units in ("block", "stage", "model")] == [8, 4, 0]
    output = tmp_path / "fsdp.json"
    proc = run_script(OSS, [*TINY, "--model", "resnet18", "--strategy", "fsdp_zero2", "--fsdp-units", "stage",
                            "--output", str(output)], nproc=2, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = read_result(output)
    analysis, config = result["analysis"], result["config"]
    assert (config["fsdp_units"], config["fsdp_param_dtype"], analysis["fsdp_units"]) == ("stage", "fp32", 5)
    measured = analysis["collectives"]["measured_per_step"]
    assert measured["all-gather"] == {"count": 5, "bytes": analysis["parameter_bytes"] / 2}  # 1/N each
    assert measured["reduce-scatter"] == {"count": 5, "bytes": analysis["parameter_bytes"]}
    assert result["checks"]["parameters_synchronized"] is True


def test_bf16_gathers_halve_the_analytic_all_gather(script):
    config = {"precision": "bf16", "fsdp_param_dtype": "compute"}
    assert script.fsdp_gather_dtype(config) is torch.bfloat16
    assert script.fsdp_gather_dtype({**config, "fsdp_param_dtype": "fp32"}) is None
    volumes = script.analytic_volumes("fsdp_zero3", 100, 0, 2, gathered_bytes=50)
    assert volumes == {"all-gather": 50, "reduce-scatter": 100}


def test_phase_breakdown_names_each_strategys_phases(all_run):
    _, _, results = all_run
    for strategy, result in results.items():
        analysis = result["analysis"]
        phases = analysis["phases_ms"]
        assert all(phases[name]["median"] > 0 for name in ("forward", "backward", "optimizer_step")), strategy
        assert analysis["phase_note"] and analysis["phase_steps"] == 1
        assert len(analysis["phases_ms_per_rank"]) == 2
        synced_after_step = strategy in ("oss_ddp", "oss_sharded_ddp", "zero1")
        assert ("parameter_sync" in phases) == synced_after_step, strategy
        assert ("parameter_sync_before_forward" in phases) == strategy.startswith("fsdp"), strategy
        assert analysis["phase_sum_ms_median"] == pytest.approx(sum(v["median"] for v in phases.values()), rel=0.5)
        # the host-cost pass (synchronised at every boundary) names the same phases
        host = analysis["host_phases_ms"]
        assert set(host) == set(phases) and all(v["median"] > 0 for v in host.values()), strategy
        assert analysis["host_phase_sum_ms_median"] > 0 and len(analysis["host_phase_sum_ms_median_per_rank"]) == 2


def test_phase_marker_reads_the_host_clock_beside_events_and_in_the_synchronised_pass(script, monkeypatch):
    clock = iter(range(0, 1000, 1))
    monkeypatch.setattr(script.time, "perf_counter", lambda: next(clock) / 1000)  # +1 ms per read
    marker = script.PhaseMarker(torch.device("cpu"), synchronize=True)
    marker.start_step()
    marker.close("forward")
    marker.close("backward")
    # each boundary reads the clock twice (phase ended, next may start): every phase spans one read = 1 ms
    assert marker.phase_times_ms() == {"forward": [1.0], "backward": [1.0]}
    plain = script.PhaseMarker(torch.device("cpu"))
    plain.start_step()
    plain.close("forward")
    assert plain.phase_times_ms() == {"forward": [1.0]}


def test_optimizer_state_is_sharded_as_expected(all_run):
    _, _, results = all_run
    for strategy, result in results.items():
        memory = result["analysis"]["memory"]
        assert memory["optimizer_state_tensors_per_parameter"] == 1  # SGD with momentum
        assert sum(memory["owned_parameter_fraction_per_rank"]) == pytest.approx(1.0 if strategy != "ddp" else 2.0)
        # The state the optimizer really holds is what the partition predicts (momentum: 4 bytes per element).
        assert memory["optimizer_state_bytes_per_rank"] == memory["expected_optimizer_state_bytes_per_rank"]
        saving = memory["expected_optimizer_state_saving_bytes_vs_ddp"]
        assert saving == 0 if strategy == "ddp" else 0 < saving < result["analysis"]["parameter_bytes"]
    assert results["fsdp_zero2"]["analysis"]["memory"]["owned_parameter_fraction_per_rank"] == [0.5, 0.5]


def test_channels_last_survives_flat_buckets_and_fsdp_keeps_only_inputs_channels_last(all_run):
    _, _, results = all_run
    for strategy, result in results.items():
        fsdp = strategy.startswith("fsdp")
        assert result["config"]["memory_format"] == "channels_last"
        assert result["analysis"]["parameter_memory_format"] == ("contiguous" if fsdp else "channels_last")
        for layout in result["analysis"]["parameter_layout_per_rank"]:
            assert layout == {"conv_weights": 20, "channels_last": 0 if fsdp else 20}, strategy


def test_table_is_rebuilt_from_the_result_files(all_run, script, capsys):
    proc, paths, _ = all_run
    final_table = proc.stdout[proc.stdout.rindex("result: ok ->"):].split("\n", 1)[1]
    assert "| strategy | Median throughput (img/s) (rank 0) ± MAD | Peak memory (MiB) |" in final_table
    assert all(f"| {strategy} |" in final_table for strategy in GLOO_STRATEGIES)
    # Files in any order: the table keeps the strategies' order. (In-process: python oss_benchmark.py --table
    # runs this same main(); a subprocess would only add torch's import time.)
    assert script.main(["--table", *map(str, reversed(list(paths.values())))]) == 0
    assert capsys.readouterr().out == final_table


def test_preset_fills_what_was_not_given_and_reports_overrides(script):
    args, explicit = script.parse_arguments(["--preset", "fairscale"])
    assert script.apply_preset(args, explicit) == {}
    assert (args.model, args.image_size, args.batch_size_per_device, args.precision, args.optimizer, args.lr,
            args.momentum, args.memory_format) == ("resnet101", 28, 256, "fp32", "rmsprop", 1e-4, 0.9, "contiguous")
    args, explicit = script.parse_arguments(["--preset", "fairscale", "--global-batch-size", "64",
                                             "--optimizer", "adam", "--image-size", "28"])
    overrides = script.apply_preset(args, explicit)
    assert overrides == {"global_batch_size": {"preset": 256, "given": 64}, "optimizer": {"preset": "rmsprop",
                                                                                         "given": "adam"}}
    assert args.batch_size_per_device is None and args.optimizer == "adam" and args.model == "resnet101"


def test_preset_end_to_end_with_a_small_batch(script, tmp_path, capsys):
    """The preset with fairscale's own statistic (throughput per epoch, median and MAD over the epochs) beside
    the per-step one, in the result, the summary and the table."""
    output = tmp_path / "preset.json"
    proc = run_script(OSS, ["--preset", "fairscale", "--device", "cpu", "--strategy", "oss_sharded_ddp",
                            "--batch-size-per-device", "2", "--warmup-steps", "1", "--steps", "7",
                            "--steps-per-epoch", "2", "--phase-steps", "0", "--profile-steps", "0",
                            "--output", str(output)], nproc=2)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert ("note: --preset fairscale: --batch-size-per-device 2 given explicitly overrides the preset's 256"
            in proc.stdout)
    result = read_result(output)
    config = result["config"]
    assert (config["model"], config["image_size"], config["precision"], config["optimizer"], config["lr"],
            config["momentum"], config["memory_format"], config["preset"]) == \
        ("resnet101", 28, "fp32", "rmsprop", 1e-4, 0.9, "contiguous", "fairscale")
    assert config["preset_overrides"] == {"batch_size_per_device": {"preset": 256, "given": 2}}
    assert result["status"] == "ok" and result["checks"]["parameters_synchronized"] is True
    memory = result["analysis"]["memory"]
    assert memory["optimizer_state_tensors_per_parameter"] == 2  # RMSprop with momentum: square_avg + momentum
    assert memory["optimizer_state_bytes_per_rank"] == memory["expected_optimizer_state_bytes_per_rank"]
    assert result["analysis"]["parameters"] == 44_549_160  # resnet101
    epochs, steps = result["throughput"]["rank0_epochs"], result["step_times_ms_per_rank"][0]
    assert (config["steps_per_epoch"], epochs["steps_per_epoch"], epochs["count"], epochs["steps_left_out"]) == \
        (2, 2, 3, 1)
    assert epochs["images_per_second"] == pytest.approx([4 * 2 / (sum(steps[i:i + 2]) / 1e3) for i in (0, 2, 4)])
    assert epochs["median"] == statistics.median(epochs["images_per_second"])
    assert epochs["mad"] == statistics.median([abs(v - epochs["median"]) for v in epochs["images_per_second"]])
    assert f"per epoch of 2 steps (rank 0, 3 epochs): {epochs['median']:,.0f} ± {epochs['mad']:,.0f}" in proc.stdout
    capsys.readouterr()
    assert script.main(["--table", str(output)]) == 0
    table = capsys.readouterr().out
    assert "| per epoch of 2 steps: median ± MAD (epochs) |" in table
    assert f"| {epochs['median']:,.0f} ± {epochs['mad']:,.0f} (3) |" in table


def bad_input(args, tmp_path, env=None):
    """Run one process with bad input: exactly one line, exit 2, no result file."""
    output = tmp_path / "never.json"
    proc = run_script(OSS, [*args, "--output", str(output)], env=env)
    lines = one_error_line(proc.stderr)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert not output.exists() and not output.with_name("never-ddp.json").exists()
    return lines[0]


def test_missing_fairscale_names_the_extra(tmp_path):
    hidden = tmp_path / "hide"
    (hidden / "fairscale").mkdir(parents=True)
    (hidden / "fairscale" / "__init__.py").write_text("raise ImportError('No module named fairscale (hidden)')\n")
    line = bad_input([*TINY, "--strategy", "ddp,oss_sharded_ddp"], tmp_path, env=clean_env(PYTHONPATH=str(hidden)))
    assert "needs fairscale" in line and "pip install '.[fairscale]'" in line


@pytest.mark.parametrize("argv, message", [
    (["--strategy", "ddp,zero4"], "unknown strategy zero4 (choose from ddp, oss_ddp"),
    (["--device", "cpu", "--strategy", "zero1_overlap"], "--strategy zero1_overlap cannot run on gloo (cpu)"),
    (["--table", "x.json", "--strategy", "ddp"], "--table only reads result files"),
    (["--compile"], "--compile is not supported"),
    (["--comm-hook", "bf16_compress"], "--comm-hook bf16_compress is not supported by oss_benchmark.py"),
    (["--model", "not_a_model"], "not a torchvision classification model"),
    (["--device", "cuda", "--strategy", "zero1_overlap", "--precision", "fp16"], "zero1_overlap cannot use fp16"),
    (["--device", "cuda", "--strategy", "zero1_overlap", "--warmup-steps", "2"], "needs --warmup-steps >= 3"),
    (["--device", "cpu", "--strategy", "ddp"], "sharding needs at least 2 ranks"),
    (["--table", "/nonexistent/result.json"], "cannot read /nonexistent/result.json"),
    (["--phase-steps", "-1"], "must be zero or a positive integer"),
    (["--device", "cpu", "--fsdp-param-dtype", "compute"], "--fsdp-param-dtype compute needs --device cuda"),
    (["--device", "cuda", "--strategy", "fsdp_zero2", "--precision", "fp32", "--fsdp-param-dtype", "compute"],
     "--fsdp-param-dtype compute needs --precision bf16, fp16 or auto"),
    # without an FSDP strategy the option has nothing to refuse: the next rule speaks
    (["--device", "cpu", "--strategy", "ddp", "--fsdp-param-dtype", "compute"], "sharding needs at least 2 ranks"),
    (["--fsdp-units", "layer"], "invalid choice"),
    (["--cudnn-deterministic", "--cudnn-benchmark"], "--cudnn-deterministic turns cuDNN's autotuning off"),
    (["--cudnn-deterministic", "--cudnn-benchmark-limit", "0"], "drop --cudnn-benchmark-limit"),
    (["--strategy", "all,ddp"], "all cannot be combined with other strategies"),
    (["--optimizer", "adam", "--momentum", "0.5"], "--momentum does not apply to --optimizer adam"),
    (["--model", "googlenet"], "--model googlenet cannot be trained here at 224 px: its training-mode output is "
                               "GoogLeNetOutputs"),
    (["--model", "vit_b_16", "--image-size", "32"], "cannot be trained here at 32 px: AssertionError"),
])
def test_bad_input_raises_one_rule(script, monkeypatch, argv, message):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(script.UsageError, match=re.escape(message)):
        script.main(argv)


def test_fairscale_is_only_needed_by_its_strategies(script, monkeypatch):
    monkeypatch.setattr(script, "fairscale_import_error", lambda: "ImportError: hidden")
    args, explicit = script.parse_arguments(["--device", "cpu", "--strategy", "ddp,zero1,fsdp_zero2"])
    assert script.resolve_strategies(args, explicit) == (["ddp", "zero1", "fsdp_zero2"], [])
    assert script.optimizer_arguments({"optimizer": "sgd", "lr": 0.1, "momentum": 0.9}) == \
        ({"lr": 0.1, "momentum": 0.9, "foreach": True}, "foreach")  # FSDP2 has no fused SGD
    args, explicit = script.parse_arguments(["--device", "cpu"])
    with pytest.raises(script.UsageError, match="oss_ddp,oss_sharded_ddp needs fairscale"):
        script.resolve_strategies(args, explicit)


def test_output_names_and_collective_kinds(script):
    assert script.output_for("zero1", "results/x.json", several=True) == "results/x-zero1.json"
    assert script.output_for("zero1", "results/x.json", several=False) == "results/x.json"
    assert script.output_for("ddp", None, several=True) is None  # the harness default already names the strategy
    kinds = {name: script.collective_kind(name) for name in ("allreduce_", "_allgather_base_", "_reduce_scatter_base_",
                                                              "reduce_", "broadcast_", "barrier",
                                                              "allgather_into_tensor_coalesced_")}
    assert kinds == {"allreduce_": "all-reduce", "_allgather_base_": "all-gather",
                     "_reduce_scatter_base_": "reduce-scatter", "reduce_": "reduce", "broadcast_": "broadcast",
                     "barrier": "other", "allgather_into_tensor_coalesced_": "all-gather"}
    # Ring/chain bytes per rank on 2 ranks: DDP sends P, ZeRO-1 adds half of P, ZeRO-3 gathers twice.
    volumes = {s: script.wire_bytes(script.analytic_volumes(s, 100.0, 0.0, 2), 2) for s in script.STRATEGIES}
    assert volumes == {"ddp": 100.0, "oss_ddp": 150.0, "oss_sharded_ddp": 100.0, "zero1": 150.0,
                       "zero1_overlap": 150.0, "fsdp_zero2": 100.0, "fsdp_zero3": 150.0}


def test_collectives_are_read_from_a_trace_without_dtypes_on_tensor_lists(script):
    events = [
        {"name": "c10d::allreduce_", "args": {"Input type": ["TensorList", ""], "Input Dims": [[[10], [5]], []]}},
        {"name": "nccl:all_reduce", "args": {"Input type": ["c10::BFloat16"], "Input Dims": [[15]]}},
        {"name": "c10d::_allgather_base_", "args": {"Input type": ["float", "float"], "Input Dims": [[8], [4]]}},
        {"name": "record_param_comms", "args": {"Collective name": "broadcast", "In msg nelems": 3,
                                                "Out msg nelems": 3, "dtype": "Long"}},
        {"name": "c10d::broadcast_", "args": {"Input type": ["TensorList"], "Input Dims": [[[3]]]}},
        {"name": "c10d::reduce_", "args": {"Input type": ["TensorList"], "Input Dims": [[[7]]]}},
    ]
    per_step, unknown = script.collectives_from_trace(events, steps=1)
    assert per_step == {"all-reduce": {"count": 1, "bytes": 30}, "all-gather": {"count": 1, "bytes": 16},
                        "broadcast": {"count": 1, "bytes": 24}, "reduce": {"count": 1, "bytes": 28}}
    assert unknown == 1  # the reduce of 7 elements had no backend event to name its dtype
    json.dumps(per_step)


# The failure paths need no analysis passes: one timed step.
QUICK = [*TINY, "--model", "resnet18", "--steps", "1", "--phase-steps", "0", "--profile-steps", "0"]


def test_a_fatal_failure_writes_its_result_and_ends_the_launch(tmp_path):
    """A rank that runs out of memory (or crashes) leaves the process group unusable: the strategy's result says
    so, the later strategies do not run, and rank 0 says it in one line."""
    output = tmp_path / "oom.json"
    # It fails before any check, so the smallest model will do (1.4 M parameters).
    procs = launch_by_hand(OSS, [*QUICK, "--model", "shufflenet_v2_x0_5", "--strategy", "zero1,ddp",
                                 "--inject-fault", "oom", "--inject-fault-rank", "1", "--inject-fault-step", "1",
                                 "--output", str(output)], timeout=60)
    (code0, _, err0), (code1, _, _) = finish(procs)
    assert (code0, code1) == (4, 4)
    result = read_result(tmp_path / "oom-zero1.json")
    assert result["status"] == "oom" and result["failure"]["rank"] == 1
    assert not (tmp_path / "oom-ddp.json").exists()
    assert len(one_error_line(err0)) == 1 and "oom on rank 1" in err0


def test_parameters_out_of_sync_are_reported_and_the_launch_goes_on(tmp_path):
    """A desync is a finding, not a broken process group: every strategy still runs; the exit code says 3."""
    output = tmp_path / "desync.json"
    procs = launch_by_hand(OSS, [*QUICK, "--strategy", "ddp,zero1", "--inject-fault", "desync", "--inject-fault-rank",
                                 "1", "--output", str(output)], timeout=60)
    (code0, _, err0), (code1, _, _) = finish(procs)
    assert (code0, code1) == (3, 0), err0  # rank 0 decides the status; the others only report signals
    assert err0.count("parameters differ across ranks") == 2
    for strategy in ("ddp", "zero1"):
        result = read_result(tmp_path / f"desync-{strategy}.json")
        assert result["status"] == "desync" and result["checks"]["parameters_synchronized"] is False


def test_table_refuses_a_file_that_is_not_an_oss_result(script, tmp_path):
    path = tmp_path / "empty-config.json"
    path.write_text(json.dumps({"strategy": "ddp", "status": "ok", "config": {}, "world": {}, "throughput": {},
                                "memory": {}}))
    with pytest.raises(script.UsageError, match=r"is not an oss_benchmark.py result \(KeyError: 'precision'\)"):
        script.main(["--table", str(path)])


def test_the_help_gives_each_optimizers_own_learning_rate(script):
    text = script.build_parser().format_help()
    assert "learning rate (default per --optimizer: sgd 0.1, adam 0.001, adamw 0.001, rmsprop 0.0001)" in " ".join(
        text.split())
    assert "(default 0.1)" not in text.split("--lr LR", 1)[1].split("--momentum", 1)[0]
