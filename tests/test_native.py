"""ddp_resnet50.py end to end on the CPU: 2 gloo processes through torchrun, 32 px images."""
import datetime
import json
import math
import os
import pathlib
import subprocess

import pytest

from conftest import NATIVE, ROOT, SMALL, clean_env, finish, launch_by_hand, read_result, run_script

UMASK = os.umask(0o022)
os.umask(UMASK)


def test_two_rank_result_field_by_field(native_two_rank):
    proc, result = native_two_rank
    assert result["schema_version"] == 2 and result["launch_id"]
    assert (result["benchmark"], result["strategy"], result["status"]) == ("ddp_resnet50.py", "ddp", "ok")
    config = result["config"]
    assert config["device"] == "cpu" and config["backend"] == "gloo"
    assert (config["precision_requested"], config["precision"]) == ("auto", "fp32")
    assert (config["memory_format_requested"], config["memory_format"]) == ("auto", "contiguous")
    assert (config["batch_mode"], config["batch_size_per_device"], config["global_batch_size"]) == ("per_device", 4, 8)
    assert (config["warmup_steps"], config["steps"], config["image_size"]) == (2, 4, 32)
    assert config["compile"] is False and config["grad_scaler"] is False and config["optimizer"] == "sgd"
    world = result["world"]
    assert world == {**world, "world_size": 2, "num_nodes": 1, "devices_per_node": 2, "launcher": "torchrun",
                     "backend": "gloo", "slurm_job_id": None}
    # Throughput is global images over the timed wall time; per device is its share.
    throughput = result["throughput"]
    assert throughput["timed_steps"] == 4
    assert throughput["images_per_second"] == pytest.approx(8 * 4 / throughput["timed_wall_s"])
    assert throughput["images_per_second_per_device"] == pytest.approx(throughput["images_per_second"] / 2)
    began = datetime.datetime.strptime(result["started_at"], "%Y-%m-%dT%H:%M:%SZ")
    assert began <= datetime.datetime.utcnow() and result["wall_time_s"] >= throughput["timed_wall_s"]
    # Step times: 4 per rank, pooled statistics over both ranks.
    per_rank = result["step_times_ms_per_rank"]
    assert [len(times) for times in per_rank] == [4, 4]
    pooled = sorted(t for times in per_rank for t in times)
    stats = result["step_time_ms"]
    assert stats["count"] == 8 and stats["min"] == pooled[0] and stats["max"] == pooled[-1]
    assert stats["median"] == pytest.approx((pooled[3] + pooled[4]) / 2)
    assert stats["min"] <= stats["median"] <= stats["p90"] <= stats["p99"] <= stats["max"]
    assert result["host_lead_ms"] is None and result["host_lead_ms_per_rank"] is None  # GPU events only
    # Whether one run can be trusted: on the CPU there is no host lead, only the halves of the timed steps.
    stability = result["stability"]
    assert stability["host_ahead"] is None and stability["second_half_over_first"] > 0
    assert stability["noisy"] == (abs(stability["second_half_over_first"] - 1) > 0.01)
    assert result["memory"]["window"].startswith("every step after the first")
    # The event (here: host clock per step) sum agrees with the wall time of the timed region.
    checks = result["checks"]
    assert checks["timing_consistent"] and all(0.95 <= q <= 1.02 for q in checks["event_time_over_wall"])
    assert checks["parameters_synchronized"] is True and checks["parameter_max_abs_diff"] == 0.0
    assert checks["loss_finite"] and checks["steps_run_per_rank"] == [6, 6]
    assert result["config"]["bucket_cap_mb"] == 25.0 and result["config"]["gradient_as_bucket_view"] is True
    assert len(result["loss_per_step"]) == 6 and all(math.isfinite(v) for v in result["loss_per_step"])
    assert result["memory"]["peak_allocated_mib"] is None  # no CUDA memory counters on the CPU
    assert [r["rank"] for r in result["memory"]["per_rank"]] == [0, 1]
    # --collective-probe: the collectives timed between the ranks after the timed steps, latency and bandwidth fitted
    probe = result["collective_probe"]
    assert (probe["backend"], probe["world_size"], result["config"]["collective_probe"]) == ("gloo", 2, True)
    assert all(probe["collectives"][name]["fit"]["latency_us"] >= 0 for name in
               ("all_reduce", "broadcast", "all_gather", "reduce_scatter"))
    assert result["efficiency"]["model_flops_per_image"] > 0 and result["efficiency"]["mfu"] is None
    assert result["software"]["torch"] and result["software"]["torchvision"]
    assert result["hardware"]["device_count"] == 2 and len(result["hardware"]["ranks"]) == 2
    # torchrun sets OMP_NUM_THREADS for its workers (unless set already): a tuning variable, recorded
    assert "OMP_NUM_THREADS" in result["software"]["environment"]
    assert result["failure"] is None and result["wall_time_s"] > 0
    # Rank 0 prints an environment block, progress and a Markdown table; rank 1 prints nothing of it.
    assert proc.stdout.count("== ddp_resnet50.py") == 1
    assert "measuring step 4/4" in proc.stdout and "| ddp | 2 | 4 |" in proc.stdout


def test_single_process_plain_python_without_output_writes_under_runs(tmp_path):
    """No --output: the result goes to runs/ where the run starts (git-ignored in a checkout), never into the
    committed results/; it is readable by others under the usual umask."""
    def status():
        return subprocess.run(["git", "status", "--porcelain", "--", "results"], capture_output=True, text=True,
                              cwd=ROOT).stdout
    before = status()
    proc = run_script(NATIVE, SMALL, env=clean_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    written = pathlib.Path(proc.stdout.split("result: ok -> ")[1].split()[0])
    try:
        assert written.parent == ROOT / "runs" and status() == before
        assert oct(written.stat().st_mode & 0o777) == oct(0o666 & ~UMASK)
        result = read_result(written)
        assert result["world"]["launcher"] == "single" and result["world"]["world_size"] == 1
        assert result["config"]["precision"] == "fp32" and result["status"] == "ok"
    finally:
        written.unlink()


def test_replicas_that_drift_apart_are_a_desync(tmp_path):
    """Rank 1 given another learning rate: the replicas really differ after the steps."""
    output = tmp_path / "desync.json"
    procs = launch_by_hand(NATIVE, [*SMALL, "--output", str(output)], rank_args={1: ["--lr", "0.02"]})
    (code, _, err), (code1, _, _) = finish(procs)
    assert (code, code1) == (3, 0), err
    result = read_result(output)
    assert result["status"] == "desync" and result["failure"]["kind"] == "desync"
    assert result["checks"]["parameters_synchronized"] is False and result["checks"]["parameter_max_abs_diff"] > 0
    assert "parameters differ" in err


def test_existing_output_is_overwritten_with_overwrite(tmp_path):
    """(Refused without --overwrite: tests/test_faults.py.)"""
    output = tmp_path / "exists.json"
    output.write_text("{}")
    proc = run_script(NATIVE, [*SMALL, "--steps", "1", "--output", str(output), "--overwrite"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(output.read_text())["status"] == "ok"
