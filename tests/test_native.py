"""ddp_resnet50.py end to end on the CPU: 2 gloo processes through torchrun, 32 px images."""
import datetime
import json
import math

import pytest

from conftest import NATIVE, SMALL, read_result, run_script


def test_two_rank_result_field_by_field(native_two_rank):
    proc, result = native_two_rank
    assert result["schema_version"] == 1
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
    # Rank 0's timed window in UTC, to line the run up with GPU telemetry: inside the run, as long as the timing.
    first, last = (datetime.datetime.strptime(t, "%Y-%m-%dT%H:%M:%S.%fZ") for t in throughput["rank0_timed_window_utc"])
    began = datetime.datetime.strptime(result["started_at"], "%Y-%m-%dT%H:%M:%SZ")
    assert began <= first <= last <= began + datetime.timedelta(seconds=result["wall_time_s"] + 1)
    assert (last - first).total_seconds() == pytest.approx(throughput["timed_wall_s"], abs=0.05)
    # Step times: 4 per rank, pooled statistics over both ranks.
    per_rank = result["step_times_ms_per_rank"]
    assert [len(times) for times in per_rank] == [4, 4]
    pooled = sorted(t for times in per_rank for t in times)
    stats = result["step_time_ms"]
    assert stats["count"] == 8 and stats["min"] == pooled[0] and stats["max"] == pooled[-1]
    assert stats["median"] == pytest.approx((pooled[3] + pooled[4]) / 2)
    assert stats["min"] <= stats["median"] <= stats["p90"] <= stats["p99"] <= stats["max"]
    assert result["host_lead_ms"] is None and result["host_lead_ms_per_rank"] is None  # GPU events only
    # What the host did during the timed steps, per rank (Linux: /proc/stat and getrusage).
    hosts = result["host_cpu_per_rank"]
    assert len(hosts) == 2 and all(h["process_cpu_per_wall"] > 0 for h in hosts)
    assert all(0 <= h["machine_steal_percent"] <= 100 and 0 < h["machine_busy_percent"] <= 100 for h in hosts)
    assert all(h["involuntary_context_switches"] >= 0 and h["voluntary_context_switches"] >= 0 for h in hosts)
    assert result["config"]["cudnn_benchmark_limit"] is None  # no cuDNN on the CPU
    assert result["compile_cache_per_rank"] is None  # nothing compiled
    # The event (here: host clock per step) sum agrees with the wall time of the timed region.
    checks = result["checks"]
    assert checks["timing_consistent"] and all(0.95 <= q <= 1.02 for q in checks["event_time_over_wall"])
    assert checks["parameters_synchronized"] is True and checks["parameter_max_abs_diff"] == 0.0
    assert checks["loss_finite"] and checks["steps_run_per_rank"] == [6, 6]
    assert len(result["loss_per_step"]) == 6 and all(math.isfinite(v) for v in result["loss_per_step"])
    assert result["memory"]["peak_allocated_mib"] is None  # no CUDA memory counters on the CPU
    assert [r["rank"] for r in result["memory"]["per_rank"]] == [0, 1]
    assert result["efficiency"]["model_flops_per_image"] > 0 and result["efficiency"]["mfu"] is None
    assert result["software"]["torch"] and result["software"]["torchvision"]
    assert result["hardware"]["device_count"] == 2 and len(result["hardware"]["ranks"]) == 2
    assert all(rank["cpu_affinity"] for rank in result["hardware"]["ranks"])  # Linux: the cores it may use
    # torchrun sets OMP_NUM_THREADS for its workers (unless set already): a tuning variable, recorded
    assert "OMP_NUM_THREADS" in result["software"]["environment"]
    assert result["failure"] is None and result["wall_time_s"] > 0
    # Rank 0 prints an environment block, progress and a Markdown table; rank 1 prints nothing of it.
    assert proc.stdout.count("== ddp_resnet50.py") == 1
    assert "measuring step 4/4" in proc.stdout and "| ddp | 2 | fp32 | 4 |" in proc.stdout


def test_strong_scaling_splits_the_global_batch(tmp_path):
    output = tmp_path / "strong.json"
    index = SMALL.index("--batch-size-per-device")
    args = SMALL[:index] + SMALL[index + 2:]
    proc = run_script(NATIVE, [*args, "--global-batch-size", "6", "--output", str(output)], nproc=2)
    assert proc.returncode == 0, proc.stderr
    config = read_result(output)["config"]
    assert (config["batch_mode"], config["batch_size_per_device"], config["global_batch_size"]) == ("global", 3, 6)


def test_single_process_plain_python(tmp_path):
    output = tmp_path / "one.json"
    proc = run_script(NATIVE, [*SMALL, "--precision", "bf16", "--output", str(output)])
    assert proc.returncode == 0, proc.stderr
    result = read_result(output)
    assert result["world"]["launcher"] == "single" and result["world"]["world_size"] == 1
    assert result["config"]["precision"] == "bf16" and result["status"] == "ok"


def test_injected_desync_is_detected(tmp_path):
    output = tmp_path / "desync.json"
    proc = run_script(NATIVE, [*SMALL, "--inject-fault", "desync", "--inject-fault-rank", "1",
                               "--output", str(output)], nproc=2)
    assert proc.returncode == 1  # torchrun ends with 1 when a worker fails (each rank exits 3)
    result = read_result(output)
    assert result["status"] == "desync"
    assert result["checks"]["parameters_synchronized"] is False
    assert result["checks"]["parameter_max_abs_diff"] > 0
    assert "parameters differ" in proc.stderr


def test_existing_output_is_refused_then_overwritten(tmp_path):
    output = tmp_path / "exists.json"
    output.write_text("{}")
    proc = run_script(NATIVE, [*SMALL, "--steps", "1", "--output", str(output)])
    assert proc.returncode == 2 and output.read_text() == "{}"
    assert "--overwrite" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_script(NATIVE, [*SMALL, "--steps", "1", "--output", str(output), "--overwrite"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(output.read_text())["status"] == "ok"
