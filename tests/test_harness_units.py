"""The harness's parts that need no process group: statistics, launch detection, config resolution, the output
rules, the result file, and the figures computed from the ranks' records (stability, peak memory, checks)."""
import json
import math
import os
import random
import statistics
import subprocess
import sys
import threading

import pytest
import torch

from conftest import LIGHTNING, NATIVE, OSS, clean_env, load_script, resolve_config

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "head",
            "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "x"}
SRUN = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_NTASKS": "8",
        "SLURM_JOB_ID": "123456", "SLURM_STEP_NODELIST": "gpu[007-008]", "SLURM_NTASKS_PER_NODE": "4",
        "MASTER_ADDR": "gpu007"}  # slurm/common.sh exports it


def test_statistics_match_the_textbook_definitions(native):
    rng = random.Random(1)
    values = [rng.uniform(1, 100) for _ in range(101)]
    stats = native.summarize(values)
    assert stats["median"] == statistics.median(values)
    assert stats["mean"] == pytest.approx(statistics.fmean(values))
    assert stats["p90"] == pytest.approx(statistics.quantiles(values, n=10, method="inclusive")[-1])
    assert stats["p99"] == pytest.approx(statistics.quantiles(values, n=100, method="inclusive")[-1])
    assert stats["mad"] == statistics.median([abs(v - stats["median"]) for v in values])
    assert (stats["min"], stats["max"], stats["count"]) == (min(values), max(values), 101)
    assert native.summarize([]) is None
    assert native.summarize([2.0])["p99"] == 2.0 and native.summarize([2.0])["count"] == 1


def test_launch_detection(native):
    assert native.detect_launch({})["launcher"] == "single"
    torchrun = native.detect_launch(TORCHRUN)
    assert (torchrun["launcher"], torchrun["rank"], torchrun["world_size"], torchrun["num_nodes"]) == \
        ("torchrun", 1, 4, 2)
    slurm = native.detect_launch(SRUN)
    assert slurm == {**slurm, "launcher": "slurm", "rank": 5, "local_rank": 1, "world_size": 8,
                     "local_world_size": 4, "num_nodes": 2, "master_addr": "gpu007",
                     "master_port": 15000 + 123456 % 20000, "slurm_job_id": "123456"}
    one_node = {**SRUN, "SLURM_STEP_NUM_NODES": "1", "MASTER_ADDR": ""}
    assert native.detect_launch(one_node)["master_addr"] == "127.0.0.1"
    # torchrun's variables win over Slurm's (srun torchrun: SLURM_PROCID is the node rank)
    both = native.detect_launch({**SRUN, **TORCHRUN})
    assert both["launcher"] == "torchrun" and both["slurm_job_id"] == "123456"
    assert native.detect_launch({**TORCHRUN, "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": ""})["master_addr"] == "127.0.0.1"
    # The batch step of an sbatch script (no srun) is one process, not rank 0 of 8.
    assert native.detect_launch({k: v for k, v in SRUN.items() if not k.startswith("SLURM_STEP")})["launcher"] == \
        "single"


@pytest.mark.parametrize("override,rule", [
    ({"SLURM_PROCID": "8"}, "inconsistent"), ({"SLURM_LOCALID": "4"}, "inconsistent"),
    ({"SLURM_STEP_NUM_TASKS": "7"}, "inconsistent"),  # tasks that do not fill every node alike
    ({"SLURM_PROCID": "x"}, "is not an integer from 0"), ({"SLURM_LOCALID": None}, "SLURM_LOCALID is not set"),
    ({"MASTER_ADDR": None}, "MASTER_ADDR is not set for several nodes"),
])
def test_contradicting_slurm_variables(native, override, rule):
    env = {k: v for k, v in {**SRUN, **override}.items() if v is not None}
    with pytest.raises(native.UsageError, match=rule):
        native.detect_launch(env)


@pytest.mark.parametrize("override,rule", [
    ({"RANK": "4"}, "inconsistent launcher variables"), ({"WORLD_SIZE": None}, "WORLD_SIZE is not set"),
    ({"MASTER_PORT": "99999"}, "MASTER_PORT='99999' is not an integer from 0 to 65535"),
    ({"LOCAL_WORLD_SIZE": "3"}, "inconsistent"),
])
def test_contradicting_torchrun_variables(native, override, rule):
    env = {k: v for k, v in {**TORCHRUN, **override}.items() if v is not None}
    with pytest.raises(native.UsageError, match=rule):
        native.detect_launch(env)


def test_resolved_config_records_requested_and_resolved_values(native, tmp_path):
    out = ["--output", str(tmp_path / "r.json")]
    config = resolve_config(native, out)
    assert (config["precision_requested"], config["precision"]) == ("auto", "bf16")
    assert (config["memory_format_requested"], config["memory_format"]) == ("auto", "channels_last")
    assert (config["batch_mode"], config["batch_size_per_device"], config["global_batch_size"]) == \
        ("per_device", 256, 256)
    assert config["compile"] is False and config["grad_scaler"] is False and config["cudnn_benchmark"] is True
    assert resolve_config(native, [*out, "--precision", "fp16"])["grad_scaler"] is True
    assert resolve_config(native, [*out], bf16=False)["precision"] == "fp16"
    compiled = resolve_config(native, [*out, "--compile"], env=TORCHRUN)
    assert compiled["compile_mode"] == "default" and compiled["compiled_ddp"] == "ddp_optimizer"
    strong = resolve_config(native, [*out, "--global-batch-size", "1024"], env=TORCHRUN)
    assert (strong["batch_mode"], strong["batch_size_per_device"], strong["global_batch_size"]) == \
        ("global", 256, 1024)
    cpu = resolve_config(native, [*out, "--device", "cpu"], cuda=False, count=0, bf16=False)
    assert (cpu["precision"], cpu["memory_format"], cpu["batch_size_per_device"], cpu["backend"]) == \
        ("fp32", "contiguous", 8, "gloo")


def test_output_rules(native, tmp_path):
    existing = tmp_path / "exists.json"
    existing.write_text("{}")
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere.json")

    def refused(path, rule, *extra, env=None):
        with pytest.raises(native.UsageError, match=rule):
            resolve_config(native, ["--output", str(path), *extra], env=env)

    refused(existing, "exists: pass --overwrite")
    refused(dangling, "exists: pass --overwrite")  # a link to nowhere is not replaced without --overwrite
    refused(f"{tmp_path}/newdir/", "is not a file path")  # a trailing slash means a folder
    refused(tmp_path, "is not a file path")
    refused(tmp_path / "made" / "r.json", "power of two", "--precision", "fp16", "--loss-scale", "3")
    with pytest.raises(native.UsageError, match="is not a file path"):  # not the default name: refused
        resolve_config(native, ["--device", "cpu", "--output", ""], cuda=False, count=0, bf16=False)
    assert resolve_config(native, ["--output", str(existing), "--overwrite"])["overwrite"] is True
    assert resolve_config(native, ["--output", str(tmp_path / "new" / "deeper" / "r.json")])
    # Every rank checks, before anything starts (rank 0 writes only at the end of the run).
    refused(existing, "exists: pass --overwrite", env=TORCHRUN)
    # the checks make nothing: no folder, no file
    assert sorted(path.name for path in tmp_path.iterdir()) == ["dangling.json", "exists.json"]
    # a Slurm job id names the default output only when it is one
    assert [native.detect_launch({"SLURM_JOB_ID": job})["slurm_job_id"] for job in ("4242", "../../x", "")] == [
        "4242", None, None]


def test_versions_of_packages_that_are_not_installed_are_none(native, monkeypatch):
    """The repository's lightning/ folder is not the lightning package: a missing package is recorded as None."""
    def not_installed(name):
        raise native.importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(native.importlib.metadata, "version", not_installed)
    monkeypatch.setattr(native.importlib.metadata, "distributions", lambda **kwargs: iter(()))
    software, _, _ = native.collect_environment(torch.device("cpu"), 1)
    assert software["lightning"] is None and software["fairscale"] is None


def bare_run(native, tmp_path, **config):
    """A Run without its constructor (no device, no process group): enough for the parts under test."""
    run = object.__new__(native.Run)
    run.config = {"output": str(tmp_path / "result.json"), "overwrite": False, "benchmark": "ddp_resnet50.py",
                  **config}
    run.result = {"status": "ok", "failure": None, "loss": [1.5, math.nan, math.inf], "config": run.config}
    run.rank, run.world_size, run.on_result, run.wall_start = 0, 1, None, 0.0
    return run


def test_the_result_file_is_whole_readable_and_never_replaces_another_runs(native, tmp_path, capsys):
    run = bare_run(native, tmp_path)
    old = os.umask(0o022)
    try:
        assert run.write_result(0) == 0
    finally:
        os.umask(old)
    target = tmp_path / "result.json"
    assert json.loads(target.read_text())["loss"] == [1.5, None, None]  # NaN and infinity are not JSON
    assert oct(target.stat().st_mode & 0o777) == "0o644"  # colleagues on a shared file system can read it
    # Another run wrote the same --output meanwhile: it stays as that run left it, and this run fails.
    run.result = {"status": "ok", "failure": None, "second": True, "config": run.config}
    assert run.write_result(0) == 1
    assert "loss" in json.loads(target.read_text())
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    run.config["overwrite"] = True
    assert run.write_result(0) == 0 and json.loads(target.read_text())["second"] is True
    run.result = {"status": "ok", "failure": None, "not serialisable": object(), "config": run.config}
    assert run.write_result(0) == 1 and json.loads(target.read_text())["second"] is True  # no partial file
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # no temporary file left


def test_a_folder_that_cannot_be_written_ends_the_run_with_one_line_and_exit_1(native, tmp_path, capsys):
    """Found at the end (no probe before the run): rank 0 says so in one line and the run fails; nothing written."""
    (tmp_path / "a-file").write_text("")
    run = bare_run(native, tmp_path / "a-file" / "below")
    assert run.write_result(0) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert [path.name for path in tmp_path.iterdir()] == ["a-file"]


def test_of_two_writers_of_one_output_one_writes_it_whole_and_the_other_fails(native, tmp_path):
    """The existence check and the write are one step (a hard link): of two runs finishing together, one
    writes --output and the other fails, leaving it."""
    codes, barrier = [], threading.Barrier(2)

    def writer(index):
        run = bare_run(native, tmp_path / "shared")
        run.result = {"status": "ok", "failure": None, "writer": index, "config": run.config}
        barrier.wait()
        codes.append(run.write_result(0))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(codes) == [0, 1]
    files = sorted((tmp_path / "shared").iterdir())
    assert len(files) == 1 and json.loads(files[0].read_text())["writer"] in (0, 1)


def record(rank, times, lead=None, losses=(2.0, 1.0), peak=None, checksum=1.0):
    return {"rank": rank, "steps_run": len(times) + 1, "timed_wall_s": sum(times) / 1e3,
            "step_times_ms": list(times), "host_lead_ms": lead, "losses": list(losses), "peak_allocated_mib": peak,
            "peak_reserved_mib": peak and peak * 2, "checksums": torch.tensor([[checksum, checksum ** 2]]),
            "hardware": {"rank": rank, "hostname": "h", "device": "cpu", **({"host": {
                "cpu": "x", "cpu_count": 2, "interconnect": None}} if rank == 0 else {})}}


def finished(native, tmp_path, rank_record):
    """Rank 0's finish() of a one-rank run from a made-up record: the result as it would be written."""
    run = bare_run(native, tmp_path, global_batch_size=8, warmup_steps=1, steps=len(rank_record["step_times_ms"]),
                   precision="fp32", image_size=32, strategy="ddp", batch_size_per_device=8, model="resnet18")
    code = run.finish(rank_record)
    return run, code


def test_stability_peak_memory_and_checks_from_the_records(native, tmp_path, capsys):
    steady = [50.0] * 10
    run, code = finished(native, tmp_path, record(0, steady, lead=[30.0] * 10, peak=100.0))
    result = run.result
    assert code == 0 and result["status"] == "ok"
    assert result["stability"] == {"second_half_over_first": 1.0, "host_lead_ms_median": 30.0, "host_ahead": True,
                                   "noisy": False, "reason": None}
    assert result["throughput"]["images_per_second"] == pytest.approx(8 / 0.05)
    assert result["memory"]["peak_allocated_mib"] == 100.0 and "after the first" in result["memory"]["window"]
    assert result["checks"]["parameters_synchronized"] and result["checks"]["timing_consistent"]
    # The second half 5 % slower than the first: one run is not enough; so is a host that never got ahead.
    drifting = [50.0] * 5 + [52.5] * 5
    run, _ = finished(native, tmp_path / "b", record(0, drifting, lead=[0.2] * 10))
    stability = run.result["stability"]
    assert stability["second_half_over_first"] == pytest.approx(50 / 52.5)
    assert stability["noisy"] and stability["host_ahead"] is False
    assert stability["reason"] == "halves differ, host-bound"
    assert "noisy: repeat or interleave (halves differ, host-bound)" in capsys.readouterr().out
    run, _ = finished(native, tmp_path / "c", record(0, steady))  # CPU: no host lead, steady halves
    assert run.result["stability"]["noisy"] is False and run.result["stability"]["host_ahead"] is None
    run, code = finished(native, tmp_path / "d", record(0, steady, losses=(2.0, math.nan)))
    assert code == 1 and "not finite from step 2" in run.result["failure"]["message"]
    # The timed region's wall time 10 % longer than its steps: the step times do not account for it.
    gappy = record(0, steady)
    gappy["timed_wall_s"] *= 1.1
    run, _ = finished(native, tmp_path / "e", gappy)
    assert run.result["checks"]["event_time_over_wall"] == [pytest.approx(1 / 1.1)]
    assert run.result["checks"]["timing_consistent"] is False


def test_peak_memory_is_reset_after_the_first_step_not_at_the_timed_start(native, tmp_path, monkeypatch):
    """The first step autotunes cuDNN and compiles; every later one (the rest of the warm-up, a CUDA graph's
    capture, the timed steps) counts, so a captured step's private pool, allocated at the capture, is seen."""
    resets, synchronized = [], []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: resets.append(device))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synchronized.append(device))
    run = bare_run(native, tmp_path, warmup_steps=3, steps=2)

    class Event:
        def record(self):
            pass

    run.device, run.events, run.marks, run.world_size = "gpu", [Event() for _ in range(3)], [], 1
    for index in range(5):
        run.before_step(index)
        assert resets == ([] if index == 0 else ["gpu"]), index
    assert synchronized == ["gpu"] and len(run.marks) == 1  # the timed steps start synchronised, once


def test_extra_defaults_are_benchmark_extras_defaults(native, tmp_path):
    """What a result records for the DDP options and the package's without them is what those options default to
    (the package's joined here, by one of them at its default)."""
    config = resolve_config(native, ["--comm-hook", "none", "--output", str(tmp_path / "r.json")])
    assert {key: config[key] for key in native.EXTRA_DEFAULTS} == native.EXTRA_DEFAULTS


@pytest.mark.parametrize("script", [NATIVE, OSS], ids=["native", "oss"])
def test_help_shows_each_default_once_and_no_none(script, capsys):
    module = load_script(script)
    with pytest.raises(SystemExit):
        module.parse_arguments(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "None" not in text and "default: " not in text
    assert "images per device (256 on GPU, 8 on CPU)" in text and "timed steps (50)" in text
    assert ("learning rate (0.1)" in text) == (script == NATIVE)  # oss_benchmark.py: each optimizer's own


HELP_OF_EACH = """import runpy, sys
for index, path in enumerate(sys.argv[1:]):
    if index < 3:  # the copies: a machine without the repository's package
        sys.modules["resnet50_ddp_benchmarks"] = None
    else:
        sys.modules.pop("resnet50_ddp_benchmarks", None)
    sys.argv = [path, "--help"]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as done:
        print(f"== exit {done.code or 0}", flush=True)  # None: 0, as the process exits
"""


def test_help_of_a_script_copied_alone_shows_its_own_options(tmp_path):
    """A script copied alone answers --help with its own options, DDP's included; in the repository the package's
    join the native script's and the twin's. The three copies first, then the repository's scripts, as __main__ in
    one process (torch imported once)."""
    copies = []
    for script, folder in ((NATIVE, "native"), (LIGHTNING, "lightning"), (OSS, "oss")):
        (tmp_path / folder).mkdir()
        copies.append(tmp_path / folder / script.name)
        copies[-1].write_text(script.read_text())
    done = subprocess.run([sys.executable, "-c", HELP_OF_EACH, *map(str, copies), str(NATIVE), str(LIGHTNING),
                           str(OSS)], capture_output=True, text=True, timeout=180, env=clean_env(), cwd=tmp_path)
    helps = done.stdout.split("== exit ")
    assert [text.split("\n", 1)[0] for text in helps[1:]] == ["0"] * 6, done.stdout + done.stderr
    for alone, text in enumerate(helps[:6]):
        assert "--steps STEPS" in text and "--output OUTPUT" in text, text
        assert ("  --comm-hook" in text) == (alone in (3, 4)), text  # the package's options in full, in the clone
        assert "  --bucket-cap-mb" in text and "  --static-graph" in text  # DDP's: the script's own


def test_slurm_job_ids_of_federated_clusters(native):
    env = {"SLURM_JOB_ID": "4227858433", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
           "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_TASKS_PER_NODE": "1"}
    launch = native.detect_launch(env)
    assert launch["slurm_job_id"] == "4227858433" and launch["launcher"] == "slurm"
    assert 15000 <= launch["master_port"] < 35000


def gathered(walls, times, checksums):
    """Two ranks' records as finish() gathers them, per field."""
    return {"rank": [0, 1], "timed_wall_s": walls, "step_times_ms": times, "host_lead_ms": [None, None],
            "losses": [[1.0], [1.0]], "steps_run": [3, 3], "checksums": checksums}


def test_throughput_is_taken_over_the_slowest_ranks_wall_time(native):
    """Every rank's images count once the last rank has finished: the slowest rank's wall time."""
    per_rank = gathered([1.0, 2.0], [[400.0, 600.0], [900.0, 1100.0]], None)
    throughput, _, _ = native.throughput_and_stability(per_rank, batch=8)
    assert throughput["images_per_second"] == pytest.approx(8 * 2 / 2.0)
    assert throughput["images_per_second_per_device"] == pytest.approx(8 * 2 / 2.0 / 2)


def test_replicas_a_millionth_apart_are_out_of_sync(native):
    """DDP keeps the replicas bit-identical: a relative difference far under a thousandth is already a desync."""
    reference = torch.tensor([[1000.0, 1e6]], dtype=torch.float64)
    per_rank = gathered([1.0, 1.0], [[1.0], [1.0]], [reference, reference * (1 + 1e-6)])
    checks = native.replica_checks(per_rank)
    assert checks["parameters_synchronized"] is False and checks["parameter_max_abs_diff"] == pytest.approx(1.0)
    per_rank["checksums"] = [reference, reference.clone()]
    assert native.replica_checks(per_rank)["parameters_synchronized"] is True

