"""The functions behind a published figure or a verdict, each called with the case that decides it: an fp16 run's
MFU peak, a rank that ran fewer steps, step times 5 % over the wall time, a tuned NCCL, --timeout for the process
group, a whole number of epochs on two ranks, uneven optimizer-state shards, a round that fails after writing an ok
result, two CPUs under one hostname, two sides that share one GPU of two. In-process, in seconds."""
import datetime
import json
import shlex
import sys
import types

import pytest
import torch

from conftest import OSS, ROOT, load_script, resolve_config
from resnet50_ddp_benchmarks import pairing
from resnet50_ddp_benchmarks.analysis import SOFTWARE

FIXTURE_RESULT = ROOT / "tests" / "fixtures" / "results" / "native-strong-1proc.json"


@pytest.fixture(scope="module")
def oss():
    return load_script(OSS, "oss_benchmark_deciding")


@pytest.fixture(scope="module")
def compare():
    return load_script(ROOT / "compare.py", "compare_deciding")


# ---------------------------------------------------------------------------------------------- the harness block

@pytest.mark.parametrize("precision,peak", [("fp16", 989.0), ("bf16", 989.0), ("fp32", 494.0)])
def test_mfu_of_an_fp16_run_is_taken_against_the_16_bit_peak(native, monkeypatch, precision, peak):
    """fp16 runs on the same tensor cores as bf16: its MFU on an H200 is against 989 TFLOP/s, not TF32's 494."""
    run = object.__new__(native.Run)
    run.config = {"global_batch_size": 16, "precision": precision, "model": "resnet50", "image_size": 32}
    monkeypatch.setattr(native, "flops_per_image", lambda config: 3e9)
    hardware = [{"rank": r, "hostname": "h", "device": f"cuda:{r}", "gpu_name": "NVIDIA H200",
                 **({"host": {"cpu": "x"}} if r == 0 else {})} for r in range(2)]
    figures = run.figures({"rank": [0, 1], "step_times_ms": [[10.0] * 4] * 2, "timed_wall_s": [0.04] * 2,
                           "host_lead_ms": [[5.0] * 4] * 2, "peak_allocated_mib": [1.0] * 2,
                           "peak_reserved_mib": [2.0] * 2, "losses": [[1.0]] * 2, "hardware": hardware})
    achieved = 3e9 * 16 * 4 / 0.04 / 1e12
    assert figures["efficiency"]["peak_tflops_per_device"] == peak
    assert figures["efficiency"]["mfu"] == pytest.approx(achieved / (peak * 2))


def records(steps_run, ratios=None):
    """Gathered records of ranks that agree (checksums, finite losses); steps_run and the event time over the wall
    time (1.0: they add up) per rank."""
    ratios = ratios or [1.0] * len(steps_run)
    sums = torch.tensor([[15.0, 55.0], [2.0, 1.0]], dtype=torch.float64)
    return {"rank": list(range(len(steps_run))), "checksums": [sums.clone() for _ in steps_run],
            "step_times_ms": [[10.0] * 4 for _ in steps_run], "timed_wall_s": [0.04 / q for q in ratios],
            "losses": [[1.0] * n for n in steps_run], "steps_run": list(steps_run)}


@pytest.mark.parametrize("steps_run", [[7, 6], [7, 7, 6], [7, 8], [6, 7]])
def test_a_rank_that_ran_another_number_of_steps_is_an_error(native, steps_run):
    per_rank = records(steps_run)
    status, message = native.run_status(per_rank, native.replica_checks(per_rank), expected_steps=7)
    assert status == "error" and message
    per_rank = records([7] * len(steps_run))
    assert native.run_status(per_rank, native.replica_checks(per_rank), expected_steps=7) == ("ok", None)


@pytest.mark.parametrize("ratio,consistent", [(1.0, True), (1.015, True), (0.96, True), (1.05, False),
                                              (1.1, False), (0.9, False)])
def test_event_step_times_must_add_up_to_the_wall_time(native, ratio, consistent):
    """The timed steps' event times over the timed region's wall time: from 0.95 to 1.02, on every rank."""
    checks = native.replica_checks(records([7, 7], ratios=[1.0, ratio]))
    assert checks["event_time_over_wall"] == [pytest.approx(1.0), pytest.approx(ratio)]
    assert checks["timing_consistent"] is consistent


def test_nccl_variables_are_recorded_with_the_software(native, monkeypatch):
    """A run tuned through NCCL_* (and the other tuning prefixes) records them; other variables stay out."""
    tuned = {"NCCL_ALGO": "Tree", "NCCL_IB_HCA": "mlx5_0", "TORCH_NCCL_BLOCKING_WAIT": "1", "CUDA_LAUNCH_BLOCKING": "1"}
    for name, value in {**tuned, "UNRELATED_SETTING": "x"}.items():
        monkeypatch.setenv(name, value)
    software, _, _ = native.collect_environment(torch.device("cpu"), 1)
    assert {name: software["environment"].get(name) for name in tuned} == tuned
    assert "UNRELATED_SETTING" not in software["environment"]


def test_timeout_bounds_the_process_group_and_the_monitor_group(native, monkeypatch, tmp_path):
    """--timeout 7 reaches init_process_group and the gloo group of the host-side barrier and gathers."""
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29500"}
    config = resolve_config(native, ["--device", "cpu", "--timeout", "7", "--output", str(tmp_path / "r.json")],
                            env=env, cuda=False, count=0, bf16=False)
    config.update(model="resnet50", optimizer="sgd", optimizer_impl="foreach")
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)  # a CPU run's share of the cores
    run = native.Run(config, native.detect_launch(env), 0)
    calls = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: calls.append(("init", k)))
    monkeypatch.setattr(torch.distributed, "new_group", lambda *a, **k: calls.append(("monitor", k)))
    for name in ("MASTER_ADDR", "MASTER_PORT"):  # join_ranks sets them for the process group: undone after
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    run.join_ranks()
    assert [(kind, k.get("timeout")) for kind, k in calls] == [("init", datetime.timedelta(seconds=7)),
                                                            ("monitor", datetime.timedelta(seconds=7))]


# -------------------------------------------------------------------------------------------- oss_benchmark.py

def test_epoch_images_per_second_count_every_ranks_images(oss):
    """fairscale's per-epoch statistic in global images: 2 ranks of 4 images, epochs of 2 steps of 100 ms."""
    result = {"config": {"steps_per_epoch": 2, "global_batch_size": 8, "batch_size_per_device": 4},
              "throughput": {"images_per_second": 80.0}, "step_times_ms_per_rank": [[100.0] * 5, [100.0] * 5]}
    oss.add_epoch_figures(result)
    assert result["throughput"]["rank0_epochs"]["images_per_second"] == pytest.approx([80.0, 80.0])


@pytest.mark.parametrize("steps,per_epoch,count", [(4, 2, 2), (6, 3, 2), (3, 3, 1), (5, 1, 5)])
def test_a_whole_number_of_epochs_counts_every_epoch(oss, steps, per_epoch, count):
    epochs = oss.epoch_throughput([100.0] * steps, steps_per_epoch=per_epoch, images_per_step=8)
    assert (epochs["count"], epochs["steps_left_out"]) == (count, 0)
    assert epochs["images_per_second"] == pytest.approx([8 * per_epoch / (0.1 * per_epoch)] * count)


def test_the_expected_saving_is_the_most_loaded_ranks(oss, monkeypatch):
    """Uneven shards (rank 0 owns 12 of 15 parameters' state, rank 1 owns 3): memory is set by the rank that
    holds most, so the saving against DDP's 60 bytes of momentum is 60 - 48, not 60 - 12."""
    model = torch.nn.Linear(4, 3)
    weight, bias = model.weight, model.bias
    shards = [torch.optim.SGD([weight], lr=0.1, momentum=0.9), torch.optim.SGD([bias], lr=0.1, momentum=0.9)]
    config = {"strategy": "oss_ddp", "phase_steps": 0, "profile_steps": 0, "broadcast_buffers": True,
              "fsdp_param_dtype": "fp32", "optimizer_state_tensors_per_parameter": 1, "model": "linear",
              "optimizer_impl": "foreach"}
    numbers = {"parameters": 15, "parameter_bytes": 60, "buffer_bytes": 0}
    setups = [oss.Setup(model, shard, None) for shard in shards]
    others = [oss.local_analysis(setup, config, None, None, numbers) for setup in setups]
    monkeypatch.setattr(torch.distributed, "all_gather_object",
                        lambda out, obj, group=None: out.__setitem__(slice(None), others))
    for rank in (0, 1):
        run = types.SimpleNamespace(config=config, rank=rank, world_size=2, monitor=None)
        memory = oss.analyse(run, setups[rank], None, numbers, "contiguous")["memory"]
        assert memory["expected_optimizer_state_bytes_per_rank"] == [48, 12]
        assert memory["expected_optimizer_state_saving_bytes_vs_ddp"] == 60 - 48


# --------------------------------------------------------------------------------------------------- compare.py

@pytest.mark.parametrize("exit_code", [3, 1])
def test_a_round_that_exits_non_zero_after_an_ok_result_fails(compare, tmp_path, exit_code):
    """The command wrote a valid "ok" result, then failed: the round is not paired."""
    code = (f"import shutil, sys; shutil.copy({str(FIXTURE_RESULT)!r}, sys.argv[sys.argv.index('--output') "
            f"+ 1]); sys.exit({{}})")
    ok = ({}, [sys.executable, "-c", code.format(0)])
    record, result = compare.run_round(ok, "a", 1, 1, tmp_path, tmp_path)  # the same result, exit 0: a good round
    assert (record["exit_code"], record["status"], result["status"]) == (0, "ok", "ok")
    failing = ({}, [sys.executable, "-c", code.format(exit_code)])
    with pytest.raises(compare.RoundFailed) as failed:
        compare.run_round(failing, "b", 1, 2, tmp_path, tmp_path)
    record, line = failed.value.args
    assert (record["exit_code"], record["status"]) == (exit_code, "ok") and line
    assert shlex.split(record["command"])[-2] == "--output"


def cpu_result(cpu, host="vm"):
    result = json.loads(FIXTURE_RESULT.read_text())
    result["hardware"].update(hostnames=[host], cpu=cpu, ranks=[{"rank": 0, "hostname": host, "device": "cpu"}])
    return result


@pytest.mark.parametrize("a_side_first", [True, False])
def test_cpu_rounds_on_two_machines_that_share_a_hostname_are_refused(compare, a_side_first):
    """Two containers both called "vm", with different CPU models: not one machine."""
    first, second = ("a", "b") if a_side_first else ("b", "a")
    firsts = {}
    compare.check_same_machine(compare.machine_of(cpu_result("AMD EPYC 9654")), first,
                               {"order": 1, "pair": 1}, firsts)
    with pytest.raises(compare.UsageError):
        compare.check_same_machine(compare.machine_of(cpu_result("Intel Xeon Platinum 8480+")), second,
                                   {"order": 2, "pair": 1}, firsts)
    compare.check_same_machine(compare.machine_of(cpu_result("AMD EPYC 9654")), second, {"order": 2, "pair": 1},
                               firsts)  # the same CPU: one machine


# ------------------------------------------------------------------------------------------------------ the pairing rule (report.py's ratios)

@pytest.mark.parametrize("b,a,same", [
    ({"GPU-1", "GPU-2"}, {"GPU-1", "GPU-2"}, True),  # the same GPUs
    ({"GPU-1", "GPU-2"}, {"GPU-1"}, True),  # scaling: A's one GPU among B's two
    ({"GPU-1", "GPU-2"}, {"GPU-2", "GPU-3"}, False),  # one GPU shared, one not
    ({"GPU-1"}, {"GPU-1", "GPU-2"}, False),  # B's among A's: A ran on a GPU that B did not
    ({"GPU-1"}, {"GPU-2"}, False),
    (set(), set(), False),  # nothing known
])
def test_same_gpus_means_every_gpu_of_a_is_among_bs(b, a, same):
    """A ratio of B over A is like for like only where A's GPUs are B's (scaling: among B's), with one build."""
    def run(devices):
        return {"devices": frozenset(devices), "commit": "c" * 40, "software": dict.fromkeys(SOFTWARE, "1")}
    assert (pairing.unlike(run(b), run(a), scaling=True) is None) is same
    assert (pairing.unlike(run(b), run(a)) is None) is (same and b == a)
