"""The harness's pure parts: statistics, launch detection, precision and batch resolution, atomic writes."""
import json
import math
import os
import random
import statistics
import subprocess
import sys

import pytest
import torch

from conftest import NATIVE, clean_env, resolve_config


def args_for(native, *argv):
    return native.parse_arguments(list(argv))


def test_statistics_match_the_textbook_definitions(native):
    rng = random.Random(1)
    values = [rng.uniform(1, 100) for _ in range(101)]
    assert len(set(values)) == 101
    stats = native.summarize(values)
    assert stats["median"] == statistics.median(values)
    assert stats["mean"] == pytest.approx(statistics.fmean(values))
    assert stats["p90"] == pytest.approx(statistics.quantiles(values, n=10, method="inclusive")[-1])
    assert stats["p99"] == pytest.approx(statistics.quantiles(values, n=100, method="inclusive")[-1])
    assert stats["mad"] == statistics.median([abs(v - stats["median"]) for v in values])
    assert (stats["min"], stats["max"], stats["count"]) == (min(values), max(values), 101)
    assert native.summarize([]) is None
    assert native.summarize([2.0])["p99"] == 2.0
    assert native.median([1, 2, 3, 10]) == 2.5


def test_epoch_throughput_is_fairscales_statistic_over_whole_epochs(native):
    """Each whole epoch's images over its summed step times; the steps after the last whole epoch are counted
    as left out, not averaged in."""
    epochs = native.epoch_throughput([10.0, 10.0, 20.0, 20.0, 10.0, 10.0, 5.0], 2, 4)
    assert epochs == {"steps_per_epoch": 2, "count": 3, "steps_left_out": 1,
                      "images_per_second": [400.0, 200.0, 400.0], "median": 400.0, "mad": 0.0}
    assert native.epoch_throughput([10.0], 2, 4) == {"steps_per_epoch": 2, "count": 0, "steps_left_out": 1,
                                                     "images_per_second": [], "median": None, "mad": None}


@pytest.mark.parametrize("requested,device,bf16,expected", [
    ("auto", "cpu", False, "fp32"), ("bf16", "cpu", False, "bf16"), ("auto", "cuda", True, "bf16"),
    ("auto", "cuda", False, "fp16"), ("fp32", "cuda", True, "fp32"), ("fp16", "cuda", True, "fp16"),
])
def test_precision_resolution(native, requested, device, bf16, expected):
    assert native.resolve_precision(requested, device, bf16) == expected


@pytest.mark.parametrize("requested,device,bf16,rule", [
    ("fp16", "cpu", False, "fp16 needs a GPU"), ("bf16", "cuda", False, "bf16 is not supported"),
])
def test_precision_rules(native, requested, device, bf16, rule):
    with pytest.raises(native.UsageError, match=rule):
        native.resolve_precision(requested, device, bf16)


def test_batch_modes(native):
    assert native.resolve_batch(args_for(native), 4, "cuda") == ("per_device", 256, 1024)
    assert native.resolve_batch(args_for(native), 2, "cpu") == ("per_device", 8, 16)
    assert native.resolve_batch(args_for(native, "--batch-size-per-device", "32"), 3, "cuda") == ("per_device", 32, 96)
    assert native.resolve_batch(args_for(native, "--global-batch-size", "1024"), 4, "cuda") == ("global", 256, 1024)
    with pytest.raises(native.UsageError, match="not divisible by the world size 3"):
        native.resolve_batch(args_for(native, "--global-batch-size", "1024"), 3, "cuda")


TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "head",
            "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "x"}
SRUN = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_NTASKS": "8",
        "SLURM_JOB_ID": "123456", "SLURM_STEP_NODELIST": "gpu[007-008]", "SLURM_NTASKS_PER_NODE": "4"}


def test_launch_detection(native):
    assert native.detect_launch({})["launcher"] == "single"
    torchrun = native.detect_launch(TORCHRUN)
    assert (torchrun["launcher"], torchrun["rank"], torchrun["world_size"], torchrun["num_nodes"]) == \
        ("torchrun", 1, 4, 2)
    slurm = native.detect_launch(SRUN)
    assert slurm == {**slurm, "launcher": "slurm", "rank": 5, "local_rank": 1, "world_size": 8,
                     "local_world_size": 4, "num_nodes": 2, "master_addr": "gpu007",
                     "master_port": 15000 + 123456 % 20000, "slurm_job_id": "123456"}
    # torchrun's variables win over Slurm's (srun torchrun: SLURM_PROCID is the node rank)
    both = native.detect_launch({**SRUN, **TORCHRUN})
    assert both["launcher"] == "torchrun" and both["slurm_job_id"] == "123456"
    # An empty MASTER_ADDR is no address: the default, as when it is unset.
    assert native.detect_launch({**TORCHRUN, "MASTER_ADDR": ""})["master_addr"] == "127.0.0.1"
    # The batch step of an sbatch script (no srun) is one process, not rank 0 of 8.
    batch = {k: v for k, v in SRUN.items() if not k.startswith("SLURM_STEP")}
    assert native.detect_launch(batch)["launcher"] == "single"


@pytest.mark.parametrize("override,rule", [
    ({"SLURM_PROCID": "8"}, "disagree"), ({"SLURM_LOCALID": "4"}, "disagree"),
    ({"SLURM_STEP_TASKS_PER_NODE": "3(x2)"}, "disagree"), ({"SLURM_NTASKS_PER_NODE": "2"}, "disagree"),
    ({"SLURM_NTASKS": "4"}, "only SLURM_NTASKS"), ({"SLURM_NODEID": "2"}, "disagree"),
    ({"SLURM_PROCID": "x"}, "not an integer"),
])
def test_contradicting_slurm_variables(native, override, rule):
    with pytest.raises(native.UsageError, match=rule):
        native.detect_launch({**SRUN, **override})


def test_contradicting_torchrun_variables(native):
    with pytest.raises(native.UsageError, match="inconsistent launcher variables"):
        native.detect_launch({**TORCHRUN, "RANK": "4"})


def test_slurm_helpers(native):
    assert native.parse_slurm_tasks_per_node("4(x2),3") == [4, 4, 3]
    assert native.first_slurm_host("gpu[007-009,012],cpu1") == "gpu007"
    assert native.first_slurm_host("node12") == "node12"
    assert native.first_slurm_host("a[1,3]") == "a1"


def resolve(native, argv, env=None, cuda=True, count=8, bf16=True):
    return resolve_config(native, argv, env, cuda, count, bf16)


def test_more_ranks_on_a_node_than_gpus(native, tmp_path):
    out = ["--output", str(tmp_path / "r.json")]
    with pytest.raises(native.UsageError, match="2 ranks on this node but only 1 GPUs"):
        resolve(native, out, env={**TORCHRUN, "LOCAL_WORLD_SIZE": "2"}, count=1)
    with pytest.raises(native.UsageError, match="only 2 GPUs allocated"):
        resolve(native, out, env={**SRUN, "SLURM_GPUS_ON_NODE": "2"})
    # One GPU bound to each Slurm task is fine: the rank picks local_rank % device_count.
    assert resolve(native, out, env=SRUN, count=1)["global_batch_size"] == 8 * 256


def test_resolved_config_records_requested_and_resolved_values(native, tmp_path):
    config = resolve(native, ["--output", str(tmp_path / "r.json"), "--compile-mode", "max-autotune"])
    assert (config["precision_requested"], config["precision"]) == ("auto", "bf16")
    assert (config["memory_format_requested"], config["memory_format"]) == ("auto", "channels_last")
    assert config["compile"] is True and config["compile_mode"] == "max-autotune"
    assert config["grad_scaler"] is False
    assert resolve(native, ["--output", str(tmp_path / "r.json"), "--precision", "fp16"])["grad_scaler"] is True
    assert config["cudnn_benchmark"] is True  # on by default on a GPU, off when asked, off on the CPU
    assert resolve(native, ["--output", str(tmp_path / "r.json"), "--no-cudnn-benchmark"])["cudnn_benchmark"] is False


def test_output_rules(native, tmp_path):
    existing = tmp_path / "exists.json"
    existing.write_text("{}")
    with pytest.raises(native.UsageError, match="exists: pass --overwrite"):
        native.check_output_path(str(existing), overwrite=False)
    native.check_output_path(str(existing), overwrite=True)
    native.check_output_path(str(tmp_path / "new" / "deeper" / "r.json"), overwrite=False)  # created later
    with pytest.raises(native.UsageError, match="cannot be written"):
        native.check_output_path(str(existing / "below-a-file.json"), overwrite=False)
    with pytest.raises(native.UsageError, match="is a directory"):
        native.check_output_path(str(tmp_path), overwrite=False)
    with pytest.raises(native.UsageError, match="--output is empty"):  # not the default name: refused
        resolve(native, ["--device", "cpu", "--output", ""], cuda=False, count=0, bf16=False)


def test_atomic_write_leaves_no_partial_file(native, tmp_path):
    target = tmp_path / "sub" / "result.json"
    native.write_json_atomically(str(target), {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}
    with pytest.raises(TypeError):  # not serialisable: the dump fails half-way through the file
        native.write_json_atomically(str(target), {"a": 2, "b": [1.0] * 1000 + [object()]})
    assert json.loads(target.read_text()) == {"a": 1}
    assert os.listdir(target.parent) == ["result.json"]
    native.write_json_atomically(str(target), {"loss": [1.5, math.nan, math.inf]})  # a diverged run
    assert json.loads(target.read_text()) == {"loss": [1.5, None, None]}


def test_checksums_detect_a_changed_replica(native):
    params = [torch.randn(3, 4), torch.randn(5)]
    same = native.parameter_checksums(params)
    assert native.compare_checksums([same, same.clone()]) == (True, 0.0)
    params[1] = params[1].clone()
    params[1][0] += 1e-4
    synced, largest = native.compare_checksums([same, native.parameter_checksums(params)])
    assert not synced and largest > 0
    # Each tensor against its own size: a small tensor's difference is not hidden by a large tensor's checksum.
    big = torch.stack([same[0] * 1e12, *same[1:]])
    changed = big.clone()
    changed[1, 0] += 1e-3
    assert native.compare_checksums([big, changed])[0] is False
    # A diverged run is not a desync: NaN agrees with NaN, infinity with infinity, and a NaN against a number is
    # an infinite difference.
    infinite = same.clone()
    infinite[0, 1] = float("inf")
    assert native.compare_checksums([infinite, infinite.clone()]) == (True, 0.0)
    nan = same.clone()
    nan[0, 0] = float("nan")
    assert native.compare_checksums([nan, nan.clone()]) == (True, 0.0)
    assert native.compare_checksums([same, nan]) == (False, float("inf"))


def test_flop_count_comes_from_the_model(native):
    flops = native.model_flops_per_image(native.build_model, 224)
    assert 23e9 < flops < 26e9  # ResNet-50 training: about 3 x 4.1 GMAC x 2 FLOP per image
    assert native.model_flops_per_image(native.build_model, 112) == pytest.approx(flops / 4, rel=0.1)  # padding
    assert native.peak_tflops("NVIDIA H200", "bf16") == 989.0 and native.peak_tflops("Some GPU", "bf16") is None
    # PCIe and NVL parts of the H-series run lower clocks than the datasheet peak above: no figure
    assert native.peak_tflops("NVIDIA H100 PCIe", "bf16") is None and native.peak_tflops("NVIDIA H200 NVL", "fp16") is None
    assert native.peak_tflops("NVIDIA A100 80GB PCIe", "bf16") == 312.0


def test_stop_agreement_reads_the_previous_round_and_settles_the_last(native, tmp_path):
    # One gloo process stands in for the ranks: the round started after a step is read after the next one,
    # so a launch-bound step never waits for the other hosts, and settle() reads the round left in flight.
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        stop = native.StopRequest()
        assert stop.agreed(None, 2) == 0  # nothing in flight yet
        stop.signum = 15
        assert stop.agreed(None, 2) == 0  # the round before the signal
        assert stop.agreed(None, 2) == 15  # every rank sees it after the same step, one step later
        assert stop.settle(2) == 15 and stop.pending is None
        assert stop.settle(2) == 0  # nothing left
        stop.signum = 0
        stop.agreed(None, 2)
        stop.signum = 2
        assert stop.settle(2) == 0  # the round in flight was started before this signal
    finally:
        torch.distributed.destroy_process_group()


def test_host_lead_is_how_long_the_gpu_took_to_reach_each_mark(native):
    class Event:  # a recorded CUDA event: when the GPU passed it, in ms
        def __init__(self, at_ms):
            self.at_ms = at_ms

        def elapsed_time(self, later):
            return later.at_ms - self.at_ms

    timer = native.StepTimer(torch.device("cpu"), 3)
    for _ in range(4):
        timer.mark()
    assert timer.host_lead_ms() is None  # no GPU: nothing to lead
    # The host queued the marks at 0, 1, 2 and 3 ms; the GPU reached them at 0, 50, 100 and 150 ms: the host was
    # ahead by 49, 98 and 147 ms (the GPU set the pace). A launch-bound step shows the GPU right behind the host.
    timer.cuda, timer.host_marks = True, [10.0, 10.001, 10.002, 10.003]
    timer.events = [Event(0.0), Event(50.0), Event(100.0), Event(150.0)]
    assert timer.host_lead_ms() == pytest.approx([49.0, 98.0, 147.0])
    assert timer.step_times_ms() == pytest.approx([50.0, 50.0, 50.0])
    timer.events = [Event(0.0), Event(1.02), Event(2.01), Event(3.05)]
    assert timer.host_lead_ms() == pytest.approx([0.02, 0.01, 0.05])


def test_tuning_variables_are_recorded_and_nothing_else(native):
    environment = {"NCCL_MAX_NCHANNELS": "4", "TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS": "ATEN",
                   "CUDA_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": "1", "HOME": "/root", "AWS_SECRET": "x",
                   "SLURM_JOB_ID": "7", "PATH": "/bin"}
    recorded = native.collect_software(environment)["environment"]
    assert recorded == {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_MAX_NCHANNELS": "4", "OMP_NUM_THREADS": "1",
                        "TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS": "ATEN"}


def test_cpu_affinity_is_written_as_ranges(native, monkeypatch):
    monkeypatch.setattr(native.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 8, 10, 11}, raising=False)
    assert native.cpu_affinity() == "0-3,8,10-11"


def test_host_activity_shares_and_missing_counters(native, monkeypatch):
    """Steal and busy shares come from the machine's CPU-time counters over the timed steps; counters the OS does
    not have stay None instead of failing the run."""
    start = {"process_cpu_s": 1.0, "voluntary_switches": 10, "involuntary_switches": 2,
             "machine": [100, 0, 50, 800, 50, 0, 0, 0]}
    end = {"process_cpu_s": 3.0, "voluntary_switches": 15, "involuntary_switches": 5,
           "machine": [160, 0, 70, 900, 50, 0, 0, 20]}  # +60 user, +20 system, +100 idle, +20 steal of 200
    monkeypatch.setattr(native, "host_counters", lambda: end)
    activity = native.host_activity(start, wall_s=2.0)
    assert activity == {"process_cpu_per_wall": 1.0, "involuntary_context_switches": 3,
                        "voluntary_context_switches": 5, "machine_steal_percent": 10.0,
                        "machine_busy_percent": 40.0}
    bare = {"process_cpu_s": 1.0, "voluntary_switches": None, "involuntary_switches": None, "machine": None}
    monkeypatch.setattr(native, "host_counters", lambda: {**bare, "process_cpu_s": 1.5})
    activity = native.host_activity(bare, wall_s=1.0)
    assert activity["process_cpu_per_wall"] == 0.5 and activity["machine_steal_percent"] is None
    assert activity["involuntary_context_switches"] is None and activity["machine_busy_percent"] is None


COMPILE_TWICE = """
import importlib.util, json, sys
import torch
spec = importlib.util.spec_from_file_location("native", sys.argv[1])
native = importlib.util.module_from_spec(spec)
spec.loader.exec_module(native)
seen = [native.compile_cache_counts()]
for _ in range(2):  # the second compilation, after a reset, finds the first one's graph in the on-disk cache
    torch._dynamo.reset()
    torch.compile(lambda x: (x * 2).relu().sum())(torch.randn(8))
    seen.append(native.compile_cache_counts())
print(json.dumps(seen))
"""


def test_compile_cache_counts_tell_a_cold_compilation_from_a_cache_hit(tmp_path):
    """A real torch.compile on the CPU, twice in one process with a fresh cache directory: nothing before,
    a miss after the first compilation, a hit after the second (what compile_cache_per_rank records)."""
    proc = subprocess.run([sys.executable, "-c", COMPILE_TWICE, str(NATIVE)], capture_output=True, text=True,
                          timeout=240, env=clean_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor")))
    assert proc.returncode == 0, proc.stderr
    before, cold, warm = json.loads(proc.stdout.strip().splitlines()[-1])
    assert before is None
    assert (cold["fx_graph_cache_miss"], cold["fx_graph_cache_hit"]) == (1, 0)
    assert (warm["fx_graph_cache_miss"], warm["fx_graph_cache_hit"]) == (1, 1)
    assert set(cold) == {f"{cache}_{kind}" for cache in ("fx_graph_cache", "autograd_cache")
                         for kind in ("hit", "miss", "bypass")}


def test_the_timed_loop_counts_timed_steps_across_runs_and_stops_on_request(native, capsys):
    """TimedLoop (measure()'s loop; interleave.py times native blocks with it): each step gets the fault hooks,
    the loss kept, a mark when timed and the stop round; progress lines count timed steps against timed_total
    over several runs; a stop request ends a run after its step and returns False."""
    config = {"inject_fault": None, "inject_fault_rank": 0, "inject_fault_step": 0}
    stop, timer = native.StopRequest(), native.StepTimer(torch.device("cpu"), 4)
    calls = []

    def step():
        calls.append(1)
        if len(calls) == 6:
            stop.signum = 15  # a SIGTERM during the sixth step (the fourth timed one)
        return torch.tensor(float(len(calls)))

    loop = native.TimedLoop(step, config, 0, 1, None, stop, timer, timed_total=4)
    assert loop.run(2, timed=False)
    assert loop.run(2, timed=True) and loop.timed_done == 2
    assert not loop.run(3, timed=True)  # the stop ends the run after the step it arrived in
    assert len(calls) == 6 and loop.timed_done == 4 and timer.count == 4
    assert loop.record["steps_run"] == 6 and loop.record["signal"] == 15
    assert [float(loss) for loss in loop.losses] == [1, 2, 3, 4, 5, 6]
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert lines == ["warm-up step 1/2 (queued)", "warm-up step 2/2 (queued)",
                     *(f"measuring step {i}/4 (queued)" for i in range(1, 5))]
