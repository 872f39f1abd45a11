"""oss_benchmark.py on the CPU: every strategy gloo can run in one launch of 2 processes at 32 px; the same on one
process (unsharded) under the fairscale preset with its epoch statistic; report.py's sharding table of the files;
real faults (a one-rank run out of memory, a rank with another learning rate); bad input (one line, exit 2,
nothing written)."""
import json
import re
import shutil
import sys

import pytest
import torch

from conftest import OSS, ROOT, SMALL, finish, launch_by_hand, load_script, read_result, run_script

GLOO_STRATEGIES = ["ddp", "zero1", "fsdp_zero2", "fsdp_zero3", "oss_ddp", "oss_sharded_ddp"]  # the run order
# SMALL, shortened: six strategies in one launch must stay well inside the suite's time on 2 CPU cores.
TINY = [*SMALL, "--batch-size-per-device", "2", "--warmup-steps", "1", "--steps", "2", "--phase-steps", "1",
        "--profile-steps", "1"]
# The failure paths need no analysis passes: one timed step of the smallest ResNet.
QUICK = [*TINY, "--model", "resnet18", "--steps", "1", "--phase-steps", "0", "--profile-steps", "0"]


@pytest.fixture(scope="module")
def script():
    return load_script(OSS, "oss_benchmark_under_test")


@pytest.fixture
def refused(script, monkeypatch):
    """For in-process bad-input tests: no launcher variables, and a command wrongly accepted fails at once instead
    of training in the test process."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(script, "Run", lambda *args, **kwargs: pytest.fail("the command was accepted"))
    return script


@pytest.fixture(scope="module")
def all_run(tmp_path_factory):
    """One --strategy all launch on 2 ranks (channels_last, to exercise the layout restore; FSDP2 per stage; the
    traces kept), a result per strategy."""
    directory = tmp_path_factory.mktemp("oss")
    proc = run_script(OSS, [*TINY, "--model", "resnet18", "--memory-format", "channels_last", "--fsdp-units", "stage",
                            "--trace-dir", str(directory / "traces"), "--output", str(directory / "all.json")],
                      nproc=2, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    paths = {strategy: directory / f"all-{strategy}.json" for strategy in GLOO_STRATEGIES}
    return proc, paths, {strategy: read_result(path) for strategy, path in paths.items()}


@pytest.fixture(scope="module")
def one_rank_run(tmp_path_factory):
    """`python oss_benchmark.py` on one process: every strategy over a one-rank group, under the fairscale preset
    (ResNet-18 and 2 images given explicitly) with fairscale's epochs of 2 steps over 3 timed steps."""
    folder = tmp_path_factory.mktemp("one")  # the script copied alone into an empty folder: it needs nothing else
    output = folder / "one.json"
    shutil.copy(OSS, folder / OSS.name)
    proc = run_script(folder / OSS.name, ["--preset", "fairscale", "--device", "cpu", "--model", "resnet18",
                                          "--batch-size-per-device", "2", "--warmup-steps", "1", "--steps", "3",
                                          "--steps-per-epoch", "2", "--phase-steps", "0", "--profile-steps", "0",
                                          "--output", str(output)], timeout=400, cwd=folder)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    paths = {strategy: output.with_name(f"one-{strategy}.json") for strategy in GLOO_STRATEGIES}
    return proc, paths, {strategy: read_result(path) for strategy, path in paths.items()}


def test_all_runs_every_gloo_strategy_with_parameters_in_sync(all_run):
    proc, paths, results = all_run
    assert "note: --strategy all skips zero1_overlap on gloo" in proc.stdout
    assert "note: fsdp_zero2, fsdp_zero3 keep their parameters contiguous" in proc.stdout
    assert f"note: 6 strategies, one result each: {paths['ddp']}" in proc.stdout  # announced before the run
    assert not (paths["ddp"].parent / "all-zero1_overlap.json").exists()
    for strategy, result in results.items():
        assert (result["benchmark"], result["strategy"], result["status"]) == ("oss_benchmark.py", strategy, "ok")
        config = result["config"]
        assert config["output"] == str(paths[strategy]) and config["strategies_in_launch"] == GLOO_STRATEGIES
        assert (config["model"], config["optimizer"], config["backend"]) == ("resnet18", "sgd", "gloo")
        # the DDP options, at their defaults
        assert (config["bucket_cap_mb"], config["gradient_as_bucket_view"], config["broadcast_buffers"],
                config["static_graph"], config["cudnn_benchmark"]) == (25.0, True, True, False, False)
        assert result["sharded"] is (strategy != "ddp")
        assert result["checks"]["parameters_synchronized"] is True and result["checks"]["loss_finite"]
        assert result["throughput"]["timed_steps"] == 2 and [len(t) for t in result["step_times_ms_per_rank"]] == [2, 2]
        for rank in (0, 1):  # each rank's profiler trace, named after the strategy's result
            assert json.loads((paths[strategy].parent / "traces" / f"all-{strategy}-rank{rank}.trace.json")
                              .read_text())["traceEvents"]
    # Same seed, same data: every strategy starts from the same loss.
    assert len({round(r["loss_per_step"][0], 5) for r in results.values()}) == 1
    assert "Traceback" not in proc.stderr and "USDT" not in proc.stderr  # nor the profiler's chatter


def test_measured_collectives_match_the_analytic_volumes(all_run):
    _, _, results = all_run
    for strategy, result in results.items():
        collectives = result["analysis"]["collectives"]
        measured, analytic = collectives["measured_per_step"], collectives["analytic_bytes_per_step"]
        assert set(measured) == set(analytic), strategy  # the stop agreement's all-reduce is not counted
        assert collectives["unknown_dtype_assumed_4_bytes"] == 0
        assert all(ratio == pytest.approx(1.0, rel=1e-9) for ratio in collectives["measured_over_analytic"].values())
        assert collectives["wire_bytes_per_rank_measured"] == pytest.approx(collectives["wire_bytes_per_rank_analytic"])
        assert collectives["measured_per_step_per_rank"][0] == collectives["measured_per_step_per_rank"][1]
    analysis = results["ddp"]["analysis"]
    assert analysis["parameter_bytes"] == 4 * analysis["parameters"] == 4 * 11_689_512  # resnet18, fp32
    assert analysis["collectives"]["measured_per_step"]["all-reduce"]["bytes"] == analysis["parameter_bytes"]
    # ShardedDDP broadcasts every buffer on its own, plus one parameter shard per rank.
    sharded = results["oss_sharded_ddp"]["analysis"]
    assert sharded["collectives"]["measured_per_step"]["broadcast"]["count"] == sharded["buffers"] + 2
    # --fsdp-units stage: 4 stages and the root, one all-gather (ZeRO-3: two) and one reduce-scatter each.
    for strategy, gathers in (("fsdp_zero2", 5), ("fsdp_zero3", 10)):
        fsdp = results[strategy]["analysis"]
        assert fsdp["fsdp_units"] == 5
        assert fsdp["collectives"]["measured_per_step"] == {
            "all-gather": {"count": gathers, "bytes": gathers / 5 * fsdp["parameter_bytes"] / 2},
            "reduce-scatter": {"count": 5, "bytes": fsdp["parameter_bytes"]}}


def test_phase_breakdown_names_each_strategys_phases(all_run):
    _, _, results = all_run
    for strategy, result in results.items():
        analysis = result["analysis"]
        phases, host = analysis["phases_ms"], analysis["host_phases_ms"]
        assert all(phases[name]["median"] > 0 for name in ("forward", "backward", "optimizer_step")), strategy
        assert analysis["phase_note"] and analysis["phase_steps"] == 1 and len(analysis["phases_ms_per_rank"]) == 2
        assert ("parameter_sync" in phases) == (strategy in ("oss_ddp", "oss_sharded_ddp", "zero1")), strategy
        assert ("parameter_sync_before_forward" in phases) == strategy.startswith("fsdp"), strategy
        assert analysis["phase_sum_ms_median"] == pytest.approx(sum(v["median"] for v in phases.values()))
        # the host-cost pass (synchronised at every boundary) names the same phases
        assert set(host) == set(phases) and all(v["median"] > 0 for v in host.values()), strategy
        assert analysis["host_phase_sum_ms_median"] > 0 and len(analysis["host_phase_sum_ms_median_per_rank"]) == 2


def test_optimizer_state_is_sharded_as_expected_and_channels_last_survives(all_run):
    _, _, results = all_run
    for strategy, result in results.items():
        analysis, fsdp = result["analysis"], strategy.startswith("fsdp")
        memory = analysis["memory"]
        assert memory["optimizer_state_tensors_per_parameter"] == 1  # SGD with momentum
        assert sum(memory["owned_parameter_fraction_per_rank"]) == pytest.approx(1.0 if strategy != "ddp" else 2.0)
        # The state the optimizer really holds is what the partition predicts (momentum: 4 bytes per element).
        assert memory["optimizer_state_bytes_per_rank"] == memory["expected_optimizer_state_bytes_per_rank"]
        saving = memory["expected_optimizer_state_saving_bytes_vs_ddp"]
        assert saving == 0 if strategy == "ddp" else 0 < saving < analysis["parameter_bytes"]
        # Flat buckets keep channels_last weights; FSDP2 keeps only its inputs channels_last.
        assert analysis["parameter_memory_format"] == ("contiguous" if fsdp else "channels_last")
        assert analysis["parameter_layout_per_rank"] == [{"conv_weights": 20, "channels_last": 0 if fsdp else 20}] * 2


def sharding_table(paths):
    """report.py's sharding table of result files: the one reader of them."""
    import subprocess
    proc = subprocess.run([sys.executable, str(ROOT / "report.py"), "--sharding", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_launch_names_the_command_that_compares_its_strategies(all_run):
    proc, paths, _ = all_run
    line = proc.stdout.strip().splitlines()[-1]
    assert line == "the strategies side by side: python report.py --sharding " + " ".join(map(str, paths.values()))
    table = sharding_table(reversed(list(paths.values())))
    rows = {row.split(" | ")[0].lstrip("| ") for row in table.splitlines() if row.startswith("| ")}
    assert set(GLOO_STRATEGIES) <= rows, table


def test_one_rank_runs_every_strategy_unsharded(one_rank_run, script, capsys):
    proc, paths, results = one_rank_run
    assert "note: one rank: every strategy runs over a process group of one rank, unsharded" in proc.stdout
    assert "note: --strategy all skips zero1_overlap on gloo" in proc.stdout
    for strategy, result in results.items():
        assert (result["status"], result["sharded"], result["world"]["world_size"]) == ("ok", False, 1), strategy
        assert result["analysis"]["memory"]["expected_optimizer_state_saving_bytes_vs_ddp"] == 0
    assert "Traceback" not in proc.stderr


def test_preset_fills_what_was_not_given_and_reports_overrides(one_rank_run):
    proc, _, results = one_rank_run
    assert "note: --preset fairscale: --model resnet18 given explicitly overrides the preset's resnet101" in proc.stdout
    config = results["oss_sharded_ddp"]["config"]
    assert (config["image_size"], config["precision"], config["optimizer"], config["lr"], config["momentum"],
            config["memory_format"], config["preset"]) == (28, "fp32", "rmsprop", 1e-4, 0.9, "contiguous", "fairscale")
    assert config["preset_overrides"] == {"model": {"preset": "resnet101", "given": "resnet18"},
                                          "batch_size_per_device": {"preset": 256, "given": 2}}
    memory = results["oss_sharded_ddp"]["analysis"]["memory"]
    assert memory["optimizer_state_tensors_per_parameter"] == 2  # RMSprop with momentum: square_avg + momentum
    assert memory["optimizer_state_bytes_per_rank"] == memory["expected_optimizer_state_bytes_per_rank"]


def test_fairscales_epoch_statistic_in_the_result_and_the_table(one_rank_run, script, capsys):
    proc, paths, results = one_rank_run
    result = results["oss_ddp"]
    epochs, steps = result["throughput"]["rank0_epochs"], result["step_times_ms_per_rank"][0]
    assert (result["config"]["steps_per_epoch"], epochs["steps_per_epoch"], epochs["count"],
            epochs["steps_left_out"]) == (2, 2, 1, 1)
    assert epochs["images_per_second"] == pytest.approx([2 * 2 / (sum(steps[:2]) / 1e3)])
    assert (epochs["median"], epochs["mad"]) == (epochs["images_per_second"][0], 0.0)
    assert re.search(r" ± 0(\.0+)? \(1 × 2\)", sharding_table([paths["oss_ddp"]]))


def test_a_one_rank_run_out_of_memory_writes_its_result_and_ends_the_launch(tmp_path):
    """A batch at 100,000 px cannot be allocated: a real out-of-memory. The strategy's result says oom (batch sweeps
    read it), the later strategies do not run, the run says it in one line."""
    output = tmp_path / "oom.json"
    proc = run_script(OSS, [*QUICK, "--strategy", "zero1,ddp", "--image-size", "100000", "--output", str(output)])
    assert proc.returncode == 4, proc.stderr[-2000:]
    result = read_result(tmp_path / "oom-zero1.json")
    assert result["status"] == "oom" and result["failure"]["rank"] == 0
    assert not (tmp_path / "oom-ddp.json").exists()
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "oom: " in lines[0], proc.stderr


def test_parameters_out_of_sync_are_reported_and_the_launch_goes_on(tmp_path):
    """Rank 1 with another learning rate: DDP's replicas drift apart (a desync is a finding, not a broken group);
    ZeRO-1 broadcasts each shard from its owner, so its replicas agree. The exit code is the first non-zero."""
    output = tmp_path / "desync.json"
    procs = launch_by_hand(OSS, [*QUICK, "--strategy", "ddp,zero1", "--output", str(output)], timeout=60,
                           rank_args={1: ["--lr", "0.05"]})
    (code0, _, err0), (code1, _, _) = finish(procs)
    assert (code0, code1) == (3, 0), err0  # rank 0 decides the status
    assert read_result(tmp_path / "desync-ddp.json")["status"] == "desync"
    assert err0.count("parameters differ across ranks") == 1
    assert read_result(tmp_path / "desync-zero1.json")["checks"]["parameters_synchronized"] is True


@pytest.mark.parametrize("argv, message", [
    (["--strategy", "ddp,zero4"], "unknown or repeated strategy in 'ddp,zero4'"),
    (["--device", "cpu", "--strategy", "zero1_overlap"], "--strategy zero1_overlap cannot run on gloo"),
    (["--table", "x.json"], "unrecognized arguments: --table"),  # report.py --sharding reads result files
    (["--compile"], "--compile is not offered here"),
    (["--device", "cpu", "--strategy", "ddp", "--collective-probe"], "unrecognized arguments: --collective-probe"),
    (["--comm-hook", "bf16_compress"], "unrecognized arguments: --comm-hook"),  # no speed options here
    (["--model", "vgg16"], "invalid choice: 'vgg16'"),
    (["--device", "cuda", "--strategy", "zero1_overlap", "--precision", "fp16"], "zero1_overlap cannot use fp16"),
    (["--device", "cuda", "--strategy", "zero1_overlap", "--warmup-steps", "2"], "needs --warmup-steps >= 3"),
    (["--device", "cpu", "--strategy", "ddp", "--trace-dir", "/proc/traces"], "--trace-dir /proc/traces cannot be "
                                                                              "written"),
    (["--phase-steps", "-1"], "must not be negative"),
    (["--device", "cpu", "--steps-per-epoch", "0"], "--steps-per-epoch must be from 1 to --steps"),
    (["--device", "cpu", "--fsdp-param-dtype", "compute"], "--fsdp-param-dtype compute needs --device cuda"),
    (["--device", "cpu", "--cudnn-benchmark"], "--cudnn-benchmark needs --device cuda"),
    (["--optimizer", "adam", "--momentum", "0.5"], "--momentum does not apply to --optimizer adam"),
])
def test_bad_input_raises_one_rule(refused, argv, message):
    with pytest.raises(refused.UsageError, match=message.replace("(", r"\(")):
        refused.main(argv)


@pytest.mark.parametrize("argv", [["--strategy", "zero4"], ["--device", "cpu", "--phase-steps", "-1"],
                                  ["--device", "cpu", "--strategy", "ddp"]], ids=["parser", "script", "harness"])
def test_an_invalid_command_makes_no_trace_folder(refused, tmp_path, monkeypatch, capsys, argv):
    """Bad input (the last: an --output that exists) exits 2 with one line and leaves no --trace-dir behind."""
    script = refused
    (tmp_path / "exists.json").write_text("{}")
    traces = tmp_path / "traces" / "deeper"
    monkeypatch.setattr(sys, "argv", [script.SCRIPT, *argv, "--trace-dir", str(traces), "--output",
                                      str(tmp_path / "exists.json")])
    with pytest.raises(SystemExit) as exit_info:
        script.run_guarded(script.main, script.SCRIPT)
    assert exit_info.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "traces").exists()


def test_fairscale_is_only_needed_by_its_strategies(script, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "fairscale", None)  # an import of fairscale now fails
    args, explicit = script.parse_arguments(["--device", "cpu", "--strategy", "ddp,zero1,fsdp_zero2"])
    assert script.resolve_strategies(args, explicit, fp16=False) == (["ddp", "zero1", "fsdp_zero2"], [])
    args, explicit = script.parse_arguments(["--device", "cpu"])
    with pytest.raises(script.UsageError, match=r"oss_ddp,oss_sharded_ddp needs fairscale, which cannot be imported "
                                                r"\(\w*Error: .*pip install '.\[fairscale\]'"):
        script.resolve_strategies(args, explicit, fp16=False)
    trace_file = tmp_path / "file"
    trace_file.write_text("")
    args, explicit = script.parse_arguments(["--device", "cpu", "--strategy", "ddp", "--trace-dir", str(trace_file)])
    with pytest.raises(script.UsageError, match="--trace-dir must name a folder"):
        script.resolve_strategies(args, explicit, fp16=False)
    for argv, rule in ((["--trace-dir", str(tmp_path), "--profile-steps", "0"], "--profile-steps must not be 0"),
                       (["--steps", "4", "--steps-per-epoch", "5"], "--steps-per-epoch must be from 1 to --steps"),
                       (["--output", f"{tmp_path}/"], "is not a file path")):
        args, explicit = script.parse_arguments(["--device", "cpu", "--strategy", "ddp", *argv])
        with pytest.raises(script.UsageError, match=re.escape(rule)):
            script.resolve_strategies(args, explicit, fp16=False)


def test_explicit_options_and_the_preset(script):
    args, explicit = script.parse_arguments(["--preset", "fairscale"])
    assert script.apply_preset(args, explicit) == {}
    assert (args.model, args.image_size, args.batch_size_per_device, args.precision, args.optimizer, args.lr,
            args.momentum, args.memory_format) == ("resnet101", 28, 256, "fp32", "rmsprop", 1e-4, 0.9, "contiguous")
    args, explicit = script.parse_arguments(["--preset", "fairscale", "--global-batch-size", "64", "--optimizer",
                                             "adam", "--image-size", "28", "--bucket-cap-mb", "50"])
    assert "bucket_cap_mb" in explicit and args.bucket_cap_mb == 50.0  # a DDP option, given explicitly
    assert script.apply_preset(args, explicit) == {"global_batch_size": {"preset": 256, "given": 64},
                                                   "optimizer": {"preset": "rmsprop", "given": "adam"}}
    assert args.batch_size_per_device is None and args.model == "resnet101"
    args, explicit = script.parse_arguments(["--optimizer", "adam"])
    script.apply_preset(args, explicit)
    assert args.lr == 1e-3  # each optimizer's own rate without --lr


def test_collectives_are_read_from_a_trace(script):
    events = [
        {"name": "c10d::allreduce_", "args": {"Input type": ["TensorList", ""], "Input Dims": [[[10], [5]], []]}},
        {"name": "nccl:all_reduce", "args": {"Input type": ["c10::BFloat16"], "Input Dims": [[15]]}},
        {"name": "c10d::_allgather_base_", "args": {"Input type": ["float", "float"], "Input Dims": [[8], [4]]}},
        {"name": "record_param_comms", "args": {"In msg nelems": 3, "Out msg nelems": 3, "dtype": "Long"}},
        {"name": "c10d::broadcast_", "args": {"Input type": ["TensorList"], "Input Dims": [[[3]]]}},
        {"name": "c10d::reduce_", "args": {"Input type": ["TensorList"], "Input Dims": [[[7]]]}},
    ]
    per_step, unknown = script.collectives_from_trace(events, steps=1)
    assert per_step == {"all-reduce": {"count": 1, "bytes": 30}, "all-gather": {"count": 1, "bytes": 16},
                        "broadcast": {"count": 1, "bytes": 24}, "reduce": {"count": 1, "bytes": 28}}
    assert unknown == 1  # the reduce of 7 elements had no backend event to name its dtype
    kinds = [script.collective_kind(name) for name in ("allreduce_", "_allgather_base_", "_reduce_scatter_base_",
                                                       "reduce_", "broadcast_", "barrier", "allgather_into_tensor_")]
    assert kinds == ["all-reduce", "all-gather", "reduce-scatter", "reduce", "broadcast", "other", "all-gather"]
    # Ring/chain bytes per rank on 2 ranks: DDP sends P, ZeRO-1 adds half of P, ZeRO-3 gathers twice.
    volumes = {s: script.wire_bytes(script.analytic_volumes(s, 100.0, 0.0, 2), 2) for s in script.STRATEGIES}
    assert volumes == {"ddp": 100.0, "oss_ddp": 150.0, "oss_sharded_ddp": 100.0, "zero1": 150.0,
                       "zero1_overlap": 150.0, "fsdp_zero2": 100.0, "fsdp_zero3": 150.0}
    assert script.analytic_volumes("fsdp_zero3", 100, 0, 2, gathered_bytes=50) == {"all-gather": 50,
                                                                                    "reduce-scatter": 100}
    assert script.analytic_volumes("fsdp_zero2", 100, 8, 1) == {}  # one rank: FSDP2 sends nothing, DDP still does
    assert script.analytic_volumes("ddp", 100, 8, 1) == {"all-reduce": 100, "broadcast": 8}


def test_phase_marker_reads_the_host_clock_on_the_cpu(script, monkeypatch):
    clock = iter(range(1000))
    monkeypatch.setattr(script.time, "perf_counter", lambda: next(clock) / 1000)  # +1 ms per read
    marker = script.PhaseMarker(torch.device("cpu"), synchronize=True)
    marker.end_phase()
    marker.end_phase("forward")
    marker.end_phase("optimizer_step")
    marker.end_phase("parameter_sync")
    marker.end_phase("optimizer_step")  # a phase ended twice in a step adds up
    # each boundary reads the clock twice (phase ended, next may start): every phase spans one read = 1 ms
    assert marker.phase_times_ms() == {"forward": [1.0], "optimizer_step": [2.0], "parameter_sync": [1.0]}


def test_epoch_throughput_leaves_out_a_partial_epoch(script):
    epochs = script.epoch_throughput([100.0, 300.0, 200.0, 200.0, 50.0], steps_per_epoch=2, images_per_step=8)
    assert epochs == {"steps_per_epoch": 2, "count": 2, "images_per_second": [40.0, 40.0], "median": 40.0,
                      "mad": 0.0, "steps_left_out": 1}
