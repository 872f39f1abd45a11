"""The measuring code, run for real on fakes of what only a GPU has: a made-up host clock, a made-up GPU timeline
with CUDA events that complete when the GPU reaches them, synchronize() that makes the host wait for it, and memory
counters that peak as the steps allocate. Every expected figure is written out from the fake's numbers, so that
an off-by-one at the warm-up boundary, a wrong unit, a check of part of the replicas or a wait counted in a phase
shows as a wrong number. In-process and on tiny tensors: no launch, no model."""
import json
import math
import os
import statistics
import time
import types

import pytest
import torch
import torch.nn.functional as F

from conftest import OSS, ROOT, load_script, resolve_config, validate

GiB, MiB = 2**30, 2**20
PROBE = ROOT / "resnet50_ddp_benchmarks" / "collective_probe.py"


@pytest.fixture(scope="module")
def oss():
    return load_script(OSS, "oss_benchmark_measuring")


@pytest.fixture(scope="module")
def probe():
    return load_script(PROBE, "collective_probe_measuring")


# ------------------------------------------------------------------------------------------------- the fakes

class FakeEvent:
    """A CUDA event on the fake GPU: it completes when the GPU has done the work queued before it."""

    def __init__(self, gpu):
        self.gpu, self.at = gpu, None

    def record(self, stream=None):
        self.at = max(self.gpu.gpu, self.gpu.host)

    def synchronize(self):
        self.gpu.host = max(self.gpu.host, self.at)

    def elapsed_time(self, end):
        if self.at is None or end.at is None:
            raise RuntimeError("elapsed_time of an event that was not recorded")
        return (end.at - self.at) * 1e3


class HostClock:
    """The time module, its perf_counter reading the fake host clock."""

    def __init__(self, gpu):
        self.gpu = gpu

    def perf_counter(self):
        return self.gpu.host

    def __getattr__(self, name):
        return getattr(time, name)


class FakeGpu:
    """One GPU and its host on a made-up clock (seconds). queue(): the host spends host_s queueing work that the GPU
    runs for gpu_s, starting once the GPU is free and the host has begun queueing it; the host does not wait. The
    memory peaks are the largest allocation since the last reset (which goes back to the resident bytes)."""

    def __init__(self, resident=1 * GiB):
        self.host = self.gpu = 1000.0
        self.resident, self.peaks, self.resets, self.syncs = resident, [resident, resident], 0, 0

    def queue(self, host_s, gpu_s, allocated=0, reserved=0):
        self.gpu = max(self.gpu, self.host) + gpu_s
        self.host += host_s
        self.peaks = [max(self.peaks[0], allocated), max(self.peaks[1], reserved)]

    def synchronize(self, device=None):
        self.syncs += 1
        self.host = max(self.host, self.gpu)

    def reset_peaks(self, device=None):
        self.resets += 1
        self.peaks = [self.resident, self.resident]

    def install(self, monkeypatch, *modules):
        """The modules' clock and torch.cuda's events, synchronize, memory counters and sleep become this fake's."""
        for module in modules:
            monkeypatch.setattr(module, "time", HostClock(self))
        for name, value in {"Event": lambda enable_timing=False, **_: FakeEvent(self), "synchronize": self.synchronize,
                            "set_device": lambda device: None, "reset_peak_memory_stats": self.reset_peaks,
                            "max_memory_allocated": lambda device=None: self.peaks[0],
                            "max_memory_reserved": lambda device=None: self.peaks[1],
                            "_sleep": lambda cycles: self.queue(0.0, 1e-3)}.items():
            monkeypatch.setattr(torch.cuda, name, value)


@pytest.fixture
def flags(monkeypatch):
    """A fake CUDA run sets cuDNN's and TF32's switches: they are put back after the test."""
    switches = [(torch.backends.cudnn, "benchmark"), (torch.backends.cudnn, "allow_tf32"),
                (torch.backends.cuda.matmul, "allow_tf32")]
    saved = [getattr(module, name) for module, name in switches]
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)  # a CPU run's share of the cores
    yield
    for (module, name), value in zip(switches, saved):
        setattr(module, name, value)


def launch_env(rank, world):
    return {} if world == 1 else {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                                  "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def make_run(native, monkeypatch, tmp_path, warmup, steps, rank=0, world=1, cuda=True, batch=16,
             gpu_name="NVIDIA H200"):
    """The script's real Run for a command line, on the fake GPU (or the CPU), its environment made up."""
    env = launch_env(rank, world)
    argv = ["--warmup-steps", str(warmup), "--steps", str(steps), "--batch-size-per-device", str(batch),
            "--image-size", "32", "--output", str(tmp_path / "result.json"), *([] if cuda else ["--device", "cpu"])]
    config = resolve_config(native, argv, env=env, cuda=cuda, count=world if cuda else 0, bf16=cuda)
    config.update(model="resnet50", optimizer="sgd", optimizer_impl=native.sgd_implementation(cuda, False))

    def environment(device, rank):
        hardware = {"rank": rank, "hostname": f"node{rank}", "device": str(device),
                    **({"gpu_name": gpu_name} if cuda else {})}
        if rank == 0:
            hardware["host"] = {"cpu": "made up", "cpu_count": 2, "interconnect": None}
        software = {**dict.fromkeys(("python", "torch_git", "cuda", "cudnn", "nccl", "torchvision", "lightning",
                                     "fairscale")), "torch": torch.__version__, "environment": {}}
        return software, {"commit": None, "dirty": None}, hardware

    monkeypatch.setattr(native, "collect_environment", environment)
    monkeypatch.setattr(native, "flops_per_image", lambda config: 4e9)  # (counted on the meta device: seconds)
    return native.Run(config, native.detect_launch(env), world if cuda else 0)


def train(native, run, gpu, work, loss=2.0):
    """The script's own loop (warm-up, then the timed steps) over steps of made-up cost: work[i] is step i's
    (host_s, gpu_s, allocated bytes, reserved bytes)."""
    costs = iter(work)

    def step():
        gpu.queue(*next(costs))
        return torch.tensor(loss)

    native.measure(run, step)


def parameters(last=0.0):
    """Three small tensors; `last` changes only the last one."""
    return [torch.arange(6.0).reshape(2, 3), torch.full((4,), 0.5), torch.tensor([1.0, -2.0]) + last]


# A GPU-bound run: 3 warm-up steps (the first compiles, 2 s; the last captures, with a larger pool), then 4 timed
# steps of 10, 11, 12 and 13 ms that the host queues in 2 ms each.
WARMUP = [(0.5, 2.0, 40 * GiB, 48 * GiB), (0.003, 0.2, int(3.5 * GiB), 4 * GiB), (0.003, 0.3, 5 * GiB, 6 * GiB)]
TIMED = [(0.002, 0.010 + 0.001 * i, int(3.5 * GiB), 4 * GiB) for i in range(4)]


def gpu_bound_record(native, monkeypatch, tmp_path, rank=0, world=1, last=0.0, extra_ms=0.0, peak=None):
    gpu = FakeGpu()
    gpu.install(monkeypatch, native)
    monkeypatch.setattr(torch.distributed, "barrier", lambda *args, **kwargs: None)
    run = make_run(native, monkeypatch, tmp_path, warmup=3, steps=4, rank=rank, world=world)
    timed = [(h, g + extra_ms / 1e3, peak or a, r) for h, g, a, r in TIMED]
    train(native, run, gpu, WARMUP + timed)
    return run, run.collect_record(parameters(last)), gpu


# ------------------------------------------------------------------------------ the warm-up boundary and timing

def test_the_timed_steps_are_the_steps_after_the_warm_up_on_the_gpu(native, monkeypatch, tmp_path, flags):
    """Each timed step's time is its own GPU time: not the last warm-up step's (2 s, 0.3 s), none left out, none
    counted twice; the timed region's wall time runs from the synchronised start to the GPU's last step."""
    run, record, gpu = gpu_bound_record(native, monkeypatch, tmp_path)
    assert record["step_times_ms"] == pytest.approx([10.0, 11.0, 12.0, 13.0], abs=1e-6)
    assert record["steps_run"] == 7 and len(record["losses"]) == 7
    assert record["timed_wall_s"] == pytest.approx(0.046, abs=1e-9)
    assert gpu.syncs == 2  # once at the timed start, once after the last step: none inside the timed loop


def test_the_timed_steps_are_the_steps_after_the_warm_up_on_the_cpu(native, monkeypatch, tmp_path, flags):
    """The host clock's branch: milliseconds between the marks after each timed step, from the timed start."""
    clock = FakeGpu()
    clock.install(monkeypatch, native)
    run = make_run(native, monkeypatch, tmp_path, warmup=2, steps=3, cuda=False)
    train(native, run, clock, [(0.9, 0, 0, 0), (0.4, 0, 0, 0), (0.020, 0, 0, 0), (0.021, 0, 0, 0),
                               (0.025, 0, 0, 0)])
    record = run.collect_record(parameters())
    assert record["step_times_ms"] == pytest.approx([20.0, 21.0, 25.0], abs=1e-6)
    assert record["timed_wall_s"] == pytest.approx(0.066, abs=1e-9)
    assert record["steps_run"] == 5 and record["host_lead_ms"] is None and record["peak_allocated_mib"] is None


def test_host_lead_is_how_far_the_gpu_trails_the_host(native, monkeypatch, tmp_path, flags):
    """After timed step i the host has spent 2 ms per step and the GPU 10, 11, 12, 13 ms: the GPU reaches the step's
    end 8, 17, 27 and 38 ms after the host queued it."""
    _, record, _ = gpu_bound_record(native, monkeypatch, tmp_path)
    assert record["host_lead_ms"] == pytest.approx([8.0, 17.0, 27.0, 38.0], abs=1e-6)


def test_peak_memory_in_mib_from_the_second_step(native, monkeypatch, tmp_path, flags):
    """The first step's 40 GiB (autotuning, compiling) is left out; the last warm-up step's 5 GiB (a CUDA graph's
    capture) is in; bytes / 2**20, one decimal."""
    _, record, gpu = gpu_bound_record(native, monkeypatch, tmp_path)
    assert (record["peak_allocated_mib"], record["peak_reserved_mib"]) == (5120.0, 6144.0)
    assert gpu.resets == 1
    _, record, _ = gpu_bound_record(native, monkeypatch, tmp_path / "b", peak=int(7.3 * GiB))
    assert record["peak_allocated_mib"] == round(int(7.3 * GiB) / MiB, 1) == 7475.2


def test_a_gpu_bound_run_end_to_end(native, monkeypatch, tmp_path, flags, capsys):
    """finish() on the fake GPU's record: the written result's throughput in images per second, steps in ms,
    memory in MiB, MFU against the H200's bf16 peak, and a steady GPU-bound run is not noisy."""
    run, record, _ = gpu_bound_record(native, monkeypatch, tmp_path)
    assert run.finish(record) == 0
    result = validate(json.loads((tmp_path / "result.json").read_text()))
    throughput = result["throughput"]
    assert throughput["timed_steps"] == 4 and throughput["timed_wall_s"] == pytest.approx(0.046)
    assert throughput["images_per_second"] == pytest.approx(16 * 4 / 0.046)
    assert throughput["rank0_median_images_per_second"] == pytest.approx(statistics.median(
        [16 * 1e3 / ms for ms in (10.0, 11.0, 12.0, 13.0)]))
    assert result["step_time_ms"]["median"] == pytest.approx(11.5) and result["step_time_ms"]["count"] == 4
    assert result["memory"]["peak_allocated_mib"] == 5120.0 and result["memory"]["peak_reserved_mib"] == 6144.0
    assert result["host_lead_ms"]["median"] == pytest.approx(22.0)
    assert result["stability"]["host_ahead"] is True and result["stability"]["reason"] == "halves differ"
    assert result["stability"]["second_half_over_first"] == pytest.approx(21 / 25)
    assert result["efficiency"]["achieved_tflops"] == pytest.approx(4e9 * 16 * 4 / 0.046 / 1e12)
    assert result["efficiency"]["peak_tflops_per_device"] == 989.0
    assert result["efficiency"]["mfu"] == pytest.approx(4e9 * 16 * 4 / 0.046 / 1e12 / 989.0)
    assert result["checks"]["timing_consistent"] and result["checks"]["event_time_over_wall"] == [pytest.approx(1.0)]
    assert "| 5120.0 |" in capsys.readouterr().out


@pytest.mark.parametrize("host_s,gpu_s,ahead,reason", [
    (0.002, 0.010, True, None),  # the host queues in 2 ms what the GPU runs in 10: one run is enough
    (0.010, 0.002, False, "host-bound"),  # the GPU waits for the host: the step measures the host
])
def test_host_ahead_and_host_bound_runs_on_the_gpu(native, monkeypatch, tmp_path, flags, host_s, gpu_s, ahead,
                                                     reason):
    gpu = FakeGpu()
    gpu.install(monkeypatch, native)
    run = make_run(native, monkeypatch, tmp_path, warmup=2, steps=6)
    train(native, run, gpu, [(0.5, 1.0, GiB, GiB)] * 2 + [(host_s, gpu_s, GiB, GiB)] * 6)
    assert run.finish(run.collect_record(parameters())) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["step_time_ms"]["median"] == pytest.approx(max(host_s, gpu_s) * 1e3)
    assert result["stability"]["host_ahead"] is ahead and result["stability"]["reason"] == reason
    assert result["stability"]["noisy"] is (reason is not None)
    if not ahead:
        assert result["host_lead_ms"]["max"] == pytest.approx(0.0, abs=1e-6)


# ----------------------------------------------------------------------------------------- two ranks, one result

def two_rank_result(native, monkeypatch, tmp_path, last=0.0):
    """Rank 1 (slower by 1 ms a step, a larger peak, its last tensor moved by `last`) and rank 0, each on its own
    fake GPU; rank 0 gathers both records and writes the result."""
    _, record1, _ = gpu_bound_record(native, monkeypatch, tmp_path / "rank1", rank=1, world=2, last=last,
                                     extra_ms=1.0, peak=int(5.5 * GiB))
    run0, record0, _ = gpu_bound_record(native, monkeypatch, tmp_path, rank=0, world=2)
    gathered = []

    def all_gather_object(out, obj, group=None):
        gathered.append(obj)
        out[:] = [record0, record1]

    monkeypatch.setattr(torch.distributed, "all_gather_object", all_gather_object)
    code = run0.finish(record0)
    assert gathered == [record0]
    return code, json.loads((tmp_path / "result.json").read_text())


def test_two_ranks_figures_take_every_rank(native, monkeypatch, tmp_path, flags):
    """Throughput over the slowest rank's wall time, step times pooled over both ranks, the larger peak."""
    code, result = two_rank_result(native, monkeypatch, tmp_path)
    assert code == 0 and result["status"] == "ok"
    assert result["throughput"]["timed_wall_s"] == pytest.approx(0.050)
    assert result["throughput"]["images_per_second"] == pytest.approx(32 * 4 / 0.050)
    assert result["throughput"]["images_per_second_per_device"] == pytest.approx(32 * 4 / 0.050 / 2)
    assert result["step_time_ms"]["count"] == 8 and result["step_time_ms"]["max"] == pytest.approx(14.0)
    assert result["memory"]["peak_allocated_mib"] == 5632.0
    assert [rank["peak_allocated_mib"] for rank in result["memory"]["per_rank"]] == [5120.0, 5632.0]
    assert result["efficiency"]["mfu"] == pytest.approx(4e9 * 32 * 4 / 0.050 / 1e12 / (989.0 * 2))
    assert result["checks"]["parameters_synchronized"] is True


def test_two_ranks_a_replica_apart_in_its_last_tensor_is_a_desync(native, monkeypatch, tmp_path, flags):
    code, result = two_rank_result(native, monkeypatch, tmp_path, last=1e-3)
    assert (code, result["status"]) == (3, "desync")
    assert result["checks"]["parameters_synchronized"] is False
    assert result["checks"]["parameter_max_abs_diff"] == pytest.approx(2 * 1e-3, rel=1e-4)  # sum of [1+d, -2+d]


# ------------------------------------------------------------------------------------------- the replica check

def test_every_parameter_tensor_has_its_checksums(native, monkeypatch, tmp_path, flags):
    """collect_record sums each tensor, not the first or the last only, in float64."""
    clock = FakeGpu()
    clock.install(monkeypatch, native)
    run = make_run(native, monkeypatch, tmp_path, warmup=1, steps=1, cuda=False)
    train(native, run, clock, [(0.1, 0, 0, 0)] * 2)
    tensors = parameters()
    checksums = run.collect_record(iter(tensors))["checksums"]  # a generator, as model.parameters() is
    expected = [[t.double().sum().item(), t.double().pow(2).sum().item()] for t in tensors]
    assert checksums.dtype == torch.float64 and checksums.tolist() == expected


def checksums(*changes):
    """Per-tensor (sum, sum of squares) of three tensors; changes: (tensor, column, relative change)."""
    sums = torch.tensor([[15.0, 55.0], [2.0, 1.0], [-1.0, 5.0]], dtype=torch.float64)
    for row, column, change in changes:
        sums[row, column] *= 1 + change
    return sums


def ranks(*sums):
    return {"rank": list(range(len(sums))), "checksums": list(sums), "step_times_ms": [[10.0]] * len(sums),
            "timed_wall_s": [0.01] * len(sums), "losses": [[1.0]] * len(sums), "steps_run": [2] * len(sums)}


@pytest.mark.parametrize("changes", [
    [(2, 0, 1e-6)],  # the last tensor's sum
    [(1, 1, 1e-6)],  # a middle tensor's sum of squares only
    [(0, 0, 1e-6)],  # the first tensor
], ids=["last-tensor", "middle-sum-of-squares", "first-tensor"])
@pytest.mark.parametrize("odd_rank", [1, 2, 3])
def test_any_tensor_of_any_rank_apart_is_a_desync(native, changes, odd_rank):
    sums = [checksums() for _ in range(4)]
    sums[odd_rank] = checksums(*changes)
    checks = native.replica_checks(ranks(*sums))
    assert checks["parameters_synchronized"] is False
    row, column, change = changes[0]
    assert checks["parameter_max_abs_diff"] == pytest.approx(abs(checksums()[row, column].item()) * change)
    assert native.replica_checks(ranks(*[checksums() for _ in range(4)]))["parameters_synchronized"] is True


def test_a_nan_replica_is_out_of_sync_and_the_checksum_covers_every_tensor(native):
    nan = checksums()
    nan[2, 1] = math.nan
    checks = native.replica_checks(ranks(checksums(), nan))
    assert checks["parameters_synchronized"] is False and checks["parameter_max_abs_diff"] == math.inf
    assert native.replica_checks(ranks(nan, nan))["parameters_synchronized"] is True  # NaN on every rank: agree
    assert native.replica_checks(ranks(checksums()))["final_parameter_checksum"] == [16.0, 61.0]


# ------------------------------------------------------------------------------------- stability and throughput

def per_rank(*times, leads=None, batch_walls=None):
    return {"rank": list(range(len(times))), "step_times_ms": [list(t) for t in times],
            "timed_wall_s": batch_walls or [sum(t) / 1e3 for t in times],
            "host_lead_ms": leads or [None] * len(times)}


@pytest.mark.parametrize("times,noisy", [
    ([100.0] * 5 + [101.5] * 5, True),  # the second half 1.5 % slower
    ([101.5] * 5 + [100.0] * 5, True),  # 1.5 % faster
    ([100.0] * 5 + [102.5] * 5, True),  # 2.5 %: still over 1 %
    ([100.0] * 5 + [100.9] * 5, False),  # 0.9 %: within
    ([100.9] * 5 + [100.0] * 5, False),
    ([10.0, 10.0, 50.0, 10.0, 10.0], False),  # an odd count: the middle step is in neither half
])
def test_the_halves_must_agree_within_one_percent(native, times, noisy):
    _, stability, _ = native.throughput_and_stability(per_rank(times), batch=8)
    assert stability["noisy"] is noisy and stability["reason"] == ("halves differ" if noisy else None)
    half = len(times) // 2
    assert stability["second_half_over_first"] == pytest.approx(sum(times[:half]) / sum(times[-half:]))


@pytest.mark.parametrize("lead_ms,ahead", [(0.99, False), (1.0, True), (0.5, False), (30.0, True)])
def test_the_host_must_lead_by_a_millisecond(native, lead_ms, ahead):
    leads = [[lead_ms] * 4]
    _, stability, lead = native.throughput_and_stability(per_rank([10.0] * 4, leads=leads), batch=8)
    assert stability["host_ahead"] is ahead and stability["host_lead_ms_median"] == lead_ms
    assert stability["reason"] == (None if ahead else "host-bound") and stability["noisy"] is not ahead
    assert lead["median"] == lead_ms


def test_both_reasons_and_the_lead_pooled_over_ranks(native):
    """Rank 0 leads by 5 ms, ranks 1 and 2 by 0.2 ms: the pooled median is host-bound."""
    times = [[100.0] * 2 + [103.0] * 2] * 3
    leads = [[5.0] * 4, [0.2] * 4, [0.2] * 4]
    _, stability, lead = native.throughput_and_stability(per_rank(*times, leads=leads), batch=8)
    assert stability["reason"] == "halves differ, host-bound" and stability["host_ahead"] is False
    assert lead["count"] == 12 and lead["median"] == 0.2
    _, stability, _ = native.throughput_and_stability(per_rank([10.0] * 4), batch=8)  # the CPU: no lead at all
    assert stability["host_ahead"] is None and stability["host_lead_ms_median"] is None and not stability["noisy"]


def test_throughput_in_images_per_second(native):
    """Images (global batch x the steps every rank timed) over the slowest wall time, in seconds; rank 0's per-step
    rate from milliseconds."""
    times = ([20.0, 25.0, 30.0], [21.0, 26.0, 31.0, 40.0])
    throughput, _, _ = native.throughput_and_stability(per_rank(*times, batch_walls=[0.075, 0.080]), batch=64)
    assert throughput["timed_steps"] == 3 and throughput["timed_wall_s"] == 0.080
    assert throughput["images_per_second"] == pytest.approx(64 * 3 / 0.080)
    assert throughput["images_per_second_per_device"] == pytest.approx(64 * 3 / 0.080 / 2)
    assert throughput["rank0_median_images_per_second"] == pytest.approx(64 / 0.025)
    assert throughput["rank0_mad_images_per_second"] == pytest.approx(min(64 / 0.020 - 64 / 0.025,
                                                                          64 / 0.025 - 64 / 0.030))
    assert native.throughput_and_stability(per_rank([]), batch=64) == (None, None, None)


@pytest.mark.parametrize("gpu_name,precision,peak", [
    ("NVIDIA H200", "bf16", 989.0), ("NVIDIA H100 80GB HBM3", "fp32", 494.0), ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ("NVIDIA H100 PCIe", "bf16", None), ("NVIDIA H100 NVL", "bf16", None), ("NVIDIA L4", "bf16", None)])
def test_mfu_against_the_datasheet_peak_of_every_device(native, monkeypatch, tmp_path, gpu_name, precision, peak):
    run = object.__new__(native.Run)
    run.config = {"global_batch_size": 16, "precision": precision, "model": "resnet50", "image_size": 32}
    monkeypatch.setattr(native, "flops_per_image", lambda config: 3e9)
    hardware = [{"rank": r, "hostname": "h", "device": f"cuda:{r}", "gpu_name": gpu_name,
                 **({"host": {"cpu": "x"}} if r == 0 else {})} for r in range(4)]
    figures = run.figures({"rank": [0, 1, 2, 3], "step_times_ms": [[10.0] * 4] * 4, "timed_wall_s": [0.04] * 4,
                           "host_lead_ms": [[5.0] * 4] * 4, "peak_allocated_mib": [1.0] * 4,
                           "peak_reserved_mib": [2.0] * 4, "losses": [[1.0]] * 4, "hardware": hardware})
    achieved = 3e9 * 16 * 4 / 0.04 / 1e12
    assert figures["efficiency"]["achieved_tflops"] == pytest.approx(achieved)
    assert figures["efficiency"]["peak_tflops_per_device"] == peak
    assert figures["efficiency"]["mfu"] == (peak and pytest.approx(achieved / (peak * 4)))


# ------------------------------------------------------------------------------------- the result file, atomically

def watch_fsync(monkeypatch, target, fail=False):
    """os.fsync that notes which file it flushes and what the target holds at that moment (or fails: a full disk)."""
    seen, real = [], os.fsync

    def fsync(descriptor):
        seen.append((os.readlink(f"/proc/self/fd/{descriptor}"),
                     target.read_text() if target.exists() else None))
        if fail:
            raise OSError(28, "No space left on device")
        real(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_result_is_written_beside_its_path_then_moved_there(native, tmp_path, monkeypatch, overwrite):
    """While the result is written and flushed, its path holds nothing (or the previous file, whole); the written
    file is a temporary one in the same folder (a rename or link within one file system)."""
    target = tmp_path / "runs" / "result.json"
    if overwrite:
        target.parent.mkdir()
        target.write_text('{"old": true}\n')
    seen = watch_fsync(monkeypatch, target)
    result = {"status": "ok", "values": list(range(100)), "config": {"output": str(target)}}
    native.write_json_atomically(result, str(target), overwrite)
    assert len(seen) == 1
    written, held = seen[0]
    assert written != str(target) and os.path.dirname(written) == str(target.parent)
    assert held == ('{"old": true}\n' if overwrite else None)
    assert json.loads(target.read_text())["values"] == list(range(100))
    assert [p.name for p in target.parent.iterdir()] == ["result.json"]


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_write_that_fails_leaves_the_path_as_it_was(native, tmp_path, monkeypatch, overwrite, capsys):
    target = tmp_path / "result.json"
    if overwrite:
        target.write_text('{"old": true}\n')
    watch_fsync(monkeypatch, target, fail=True)
    result = {"status": "ok", "failure": None, "config": {"output": str(target)}}
    with pytest.raises(OSError, match="No space left"):
        native.write_json_atomically(result, str(target), overwrite)
    assert [p.name for p in tmp_path.iterdir()] == (["result.json"] if overwrite else [])
    assert not overwrite or target.read_text() == '{"old": true}\n'
    run = object.__new__(native.Run)  # the run says so, and fails
    run.config = {"output": str(target), "overwrite": overwrite, "benchmark": "ddp_resnet50.py"}
    run.result, run.wall_start = result, 0.0
    assert run.write_result(0) == 1 and "no result written (OSError" in capsys.readouterr().err


@pytest.mark.parametrize("existing", [False, True])
def test_the_probe_writes_its_file_whole_or_not_at_all(probe, tmp_path, existing):
    """A record that cannot be written half way (json.dump fails on its second key) leaves the path as it was."""
    target = tmp_path / "probe.json"
    if existing:
        target.write_text('{"old": true}\n')
    with pytest.raises(TypeError):
        probe.write_json_atomically(str(target), {"sizes_bytes": list(range(50)), "broken": object()},
                                    overwrite=existing)
    assert [p.name for p in tmp_path.iterdir()] == (["probe.json"] if existing else [])
    assert not existing or target.read_text() == '{"old": true}\n'
    probe.write_json_atomically(str(target), {"sizes_bytes": [1024]}, overwrite=existing)
    assert json.loads(target.read_text()) == {"sizes_bytes": [1024]}
    assert [p.name for p in tmp_path.iterdir()] == ["probe.json"]


# ------------------------------------------------------------------------ oss_benchmark.py's phases, on the GPU

COSTS = {"forward": (0.0010, 0.020), "backward": (0.0020, 0.040), "step": (0.0005, 0.003),
         "broadcast": (0.0003, 0.008), "after": (0.0001, 0.001)}  # (host s, GPU s)


class Timed(torch.nn.Module):
    """A tiny model whose forward and backward cost COSTS on the fake GPU."""

    def __init__(self, gpu):
        super().__init__()
        self.gpu, self.linear = gpu, torch.nn.Linear(4, 3)

    def forward(self, images):
        self.gpu.queue(*COSTS["forward"])
        out = self.linear(images)
        out.register_hook(lambda grad: self.gpu.queue(*COSTS["backward"]))
        return out


class Sharded:
    """An OSS-like optimizer: its step ends with _broadcast_params (which the instrumented pass splits off)."""

    def __init__(self, gpu, params):
        self.gpu, self.param_groups = gpu, [{"params": list(params)}]

    def zero_grad(self, set_to_none=True):
        pass

    def step(self):
        self.gpu.queue(*COSTS["step"])
        self._broadcast_params()
        self.gpu.queue(*COSTS["after"])

    def _broadcast_params(self):
        self.gpu.queue(*COSTS["broadcast"])


def test_phase_times_leave_out_the_wait_for_the_device(oss, monkeypatch):
    """The instrumented pass's two passes over oss_benchmark.py's own train_step: the GPU's time per phase (events),
    then the host's (the device synchronised at each boundary, the wait not counted), in milliseconds; OSS's
    step split at its broadcast, the rest of the step after it added to optimizer_step."""
    gpu = FakeGpu()
    gpu.install(monkeypatch, oss)
    model = Timed(gpu)
    optimizer = Sharded(gpu, model.parameters())
    setup = oss.Setup(model, optimizer, None, sync=(optimizer, "_broadcast_params"))
    config = {"precision": "fp32", "device": "cpu", "phase_steps": 3}
    images, labels = torch.ones(2, 4), torch.tensor([0, 2])
    run = types.SimpleNamespace(device=torch.device("cuda", 0), config=config)
    phases = oss.instrumented_pass(run, setup, lambda marker=None: oss.train_step(setup, images, labels, config,
                                                                                   marker))
    expected = {"forward": "forward", "backward": "backward", "parameter_sync": "broadcast"}
    for which, prefix in ((1, ""), (0, "host_")):
        medians = {phase: value["median"] for phase, value in phases[f"{prefix}phases_ms"].items()}
        want = {phase: COSTS[cost][which] * 1e3 for phase, cost in expected.items()}
        want["optimizer_step"] = (COSTS["step"][which] + COSTS["after"][which]) * 1e3
        assert medians == pytest.approx(want, abs=1e-6), prefix
        assert phases[f"{prefix}step_ms_median"] == pytest.approx(sum(want.values()), abs=1e-6)
        assert all(value["mad"] == pytest.approx(0.0, abs=1e-6) for value in phases[f"{prefix}phases_ms"].values())
    assert "_broadcast_params" not in vars(setup.optimizer)  # the split undone


def test_a_phase_marker_on_the_host_clock_counts_from_the_end_of_the_wait(oss, monkeypatch):
    """PhaseMarker alone: each synchronised phase runs from the moment the device was idle to the host's end of
    queueing, so a long GPU phase before it adds nothing."""
    gpu = FakeGpu()
    gpu.install(monkeypatch, oss)
    marker = oss.PhaseMarker(torch.device("cuda", 0), synchronize=True)
    for _ in range(2):
        marker.end_phase()
        for phase, (host_s, gpu_s) in (("forward", (0.001, 0.5)), ("backward", (0.004, 0.25))):
            gpu.queue(host_s, gpu_s)
            marker.end_phase(phase)
    times = marker.phase_times_ms()
    assert list(times) == ["forward", "backward"]
    assert times["forward"] == pytest.approx([1.0, 1.0], abs=1e-6)
    assert times["backward"] == pytest.approx([4.0, 4.0], abs=1e-6)
    assert gpu.syncs == 6


def test_epoch_throughput_in_images_per_second_of_whole_epochs(oss):
    stats = oss.epoch_throughput([100.0, 100.0, 200.0, 200.0, 50.0], steps_per_epoch=2, images_per_step=32)
    assert stats["images_per_second"] == pytest.approx([32 * 2 / 0.2, 32 * 2 / 0.4])
    assert (stats["count"], stats["steps_left_out"]) == (2, 1)
    assert stats["median"] == pytest.approx(statistics.median([320.0, 160.0]))


# --------------------------------------------------------------------------------------------- the collective probe

def test_a_negative_intercept_is_refitted_through_the_origin(probe):
    """Times that extrapolate to -3 us at size 0: the latency is clamped to 0 and the bandwidth refitted with the
    same 1/t^2 weights through the origin, not the unconstrained slope (10 GB/s) kept."""
    sizes = [4**k * 65536 for k in range(5)]
    times = [-3.0 + size / 1e4 for size in sizes]  # 10 GB/s = 1e4 bytes per us, less 3 us
    weights = [1 / t**2 for t in times]
    slope = sum(w * x * t for w, x, t in zip(weights, sizes, times)) / sum(w * x * x for w, x in zip(weights, sizes))
    refitted = 1e-3 / slope
    assert abs(refitted - 10.0) > 0.5  # the refit is not the unconstrained slope
    fit = probe.summarise("broadcast", sizes, times, 2)["fit"]
    assert fit["latency_us"] == 0.0
    assert fit["bus_bandwidth_gbps"] == pytest.approx(refitted, abs=1e-3)
    assert fit["residuals_us"] == pytest.approx([t - x / (refitted * 1e3) for x, t in zip(sizes, times)], abs=2e-3)
    alpha, bandwidth = probe.fit_latency_bandwidth(sizes, [5.0 + size / 1e4 for size in sizes], 1.0)
    assert (alpha, bandwidth) == (pytest.approx(5.0), pytest.approx(10.0))  # a positive one is kept


def test_bus_bandwidth_per_size_in_gigabytes_per_second(probe):
    sizes, times = [1024, 1048576], [10.0, 100.0]  # us
    summary = probe.summarise("all_reduce", sizes, times, 4)
    assert summary["bus_factor"] == 1.5
    assert summary["bus_bandwidth_gbps_per_size"] == [round(1024 * 1.5 / 10e3, 3), round(1048576 * 1.5 / 100e3, 3)]


def bare_timer(probe, monkeypatch, device):
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(torch.distributed, "barrier", lambda *args, **kwargs: None)
    return probe.Timer(device, None)


@pytest.mark.parametrize("cuda", [False, True], ids=["host-clock", "cuda-events"])
def test_one_call_is_timed_in_microseconds(probe, monkeypatch, cuda):
    """A collective's call, and a local copy's burst of 20 (queued behind a GPU sleep, which is not counted),
    per call in microseconds."""
    gpu = FakeGpu()
    gpu.install(monkeypatch, probe)
    timer = bare_timer(probe, monkeypatch, torch.device("cuda", 0) if cuda else torch.device("cpu"))
    call = lambda: gpu.queue(30e-6, 50e-6) if cuda else gpu.queue(30e-6, 0.0)  # noqa: E731
    assert timer.timed(call, "all_reduce") == pytest.approx(50.0 if cuda else 30.0)
    assert timer.timed(call, "local_copy") == pytest.approx(50.0 if cuda else 30.0)


def test_each_size_takes_the_slowest_ranks_time_and_the_median_of_the_repeats(probe, monkeypatch):
    """This rank's calls take 999 us (warm-up, not timed), then 30, 40, 50; the other rank's 60, 10, 10: the
    slowest per repeat is 60, 40, 50, their median 50."""
    gpu = FakeGpu()
    gpu.install(monkeypatch, probe)
    timer = bare_timer(probe, monkeypatch, torch.device("cpu"))
    durations = iter([999e-6, 30e-6, 40e-6, 50e-6])
    monkeypatch.setattr(timer, "call", lambda name, size: lambda: gpu.queue(next(durations), 0.0))
    other = torch.tensor([60.0, 10.0, 10.0], dtype=torch.float64)
    reduced = []

    def all_reduce(tensor, op=torch.distributed.ReduceOp.SUM, group=None):
        reduced.append(tensor.tolist())
        ReduceOp = torch.distributed.ReduceOp
        combine = torch.maximum if op == ReduceOp.MAX else torch.minimum if op == ReduceOp.MIN else torch.add
        tensor.copy_(combine(tensor, other))

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    assert timer.median_us("all_reduce", 4096, repeats=3, warmup=1) == pytest.approx(50.0)
    assert reduced == [pytest.approx([30.0, 40.0, 50.0])]


# ------------------------------------------------------------------------------- fp16's GradScaler, on the CPU

def one_step(native, scaler=None, loss_scale=None, images=None):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    images = torch.randn(8, 4) if images is None else images
    config = {"precision": "fp32", "device": "cpu", "cuda_graphs": False, "loss_scale": loss_scale}
    loss = native.train_step(model, optimizer, scaler, images, torch.arange(8) % 3, config)
    return [p.detach().clone() for p in model.parameters()], loss, optimizer


def test_a_dynamic_loss_scale_steps_as_plain_sgd_and_skips_an_overflow(native):
    """fp16's branches, never reached by a CPU run (fp16 needs a GPU): the GradScaler's step is the plain step
    (power-of-two scales are exact), and a step whose gradients overflow is skipped and halves the scale."""
    plain, plain_loss, _ = one_step(native)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaled, loss, _ = one_step(native, scaler, "dynamic")
    assert all(torch.equal(a, b) for a, b in zip(plain, scaled)) and torch.equal(loss, plain_loss)
    assert scaler.get_scale() == 1024.0
    torch.manual_seed(0)
    initial = [p.detach().clone() for p in torch.nn.Linear(4, 3).parameters()]  # one_step's weights before its step
    assert not any(torch.equal(a, b) for a, b in zip(initial, plain))
    overflow, loss, optimizer = one_step(native, scaler, "dynamic", images=torch.full((8, 4), math.inf))
    assert all(torch.equal(a, b) for a, b in zip(initial, overflow)) and not optimizer.state
    assert scaler.get_scale() == 512.0 and not math.isfinite(loss.item())


def test_a_fixed_loss_scale_is_undone_before_the_step(native):
    plain, _, _ = one_step(native)
    fixed, _, _ = one_step(native, None, 128.0)
    assert all(torch.allclose(a, b, rtol=1e-6, atol=0) for a, b in zip(plain, fixed))


def test_fused_sgd_only_on_the_gpu_without_a_grad_scaler(native):
    assert [native.sgd_implementation(cuda, scaler) for cuda, scaler in
            ((True, False), (True, True), (False, False), (False, True))] == ["fused", "foreach", "foreach", "foreach"]
