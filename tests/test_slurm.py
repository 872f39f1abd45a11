"""The slurm/ batch scripts on a real Slurm (tests/slurm_cluster.py: munged, slurmctld and slurmd on this host).

Jobs are submitted exactly as a user would, `sbatch --wait slurm/<script>.sbatch`, in the scripts' CPU mode
(BENCH_DEVICE=cpu: gloo, 32 px, 2 tasks of one core on the one node). The test cluster's node also offers two
GPUs that are only names (no device behind them), so that the scripts' GPU checks meet the values Slurm
itself sets when it allocates GPUs. Without Slurm installed (CI installs it: .ci/run) these tests skip
with the reason, except the sweep-composition tests at the end, which replace sbatch by a recorder.
To watch the same cluster by hand: `python tests/slurm_cluster.py /tmp/slurm` (see its docstring).
"""
import os
import re
import stat
import subprocess
import sys

import pytest

from conftest import ROOT, clean_env, read_result
from slurm_cluster import SlurmCluster, missing_reason

CPU_JOB = ["--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=0"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = missing_reason()
    if reason and os.environ.get("BENCH_REQUIRE_SLURM") == "1":  # set by .ci/run once it has installed Slurm
        pytest.fail(f"BENCH_REQUIRE_SLURM=1 but {reason}")
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("results")


def job_env(cluster, results_dir, **settings):
    """A fresh shell's environment pointed at the test cluster, the venv's python and a temporary results folder."""
    return cluster.env(clean_env(**{"BENCH_PYTHON": sys.executable, "BENCH_RESULTS_DIR": str(results_dir), **settings}))


class Job:
    def __init__(self, proc, log):
        self.proc = proc
        self.returncode = proc.returncode
        self.log = log.read_text() if log.exists() else ""
        match = re.search(r"Submitted batch job (\d+)", proc.stdout)
        self.id = match.group(1) if match else None

    def describe(self):
        return f"sbatch exit {self.returncode}\n{self.proc.stdout}{self.proc.stderr}\n--- job log\n{self.log}"


def submit(cluster, results_dir, script, options=(), args=(), timeout=240, **settings):
    """sbatch --wait: returns when the job has ended, with the job's exit code."""
    log = results_dir / f"{script.replace('/', '_')}-{len(list(results_dir.glob('*.log')))}.log"
    proc = subprocess.run(["sbatch", "--wait", f"--output={log}", *options, script, *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=job_env(cluster, results_dir, **settings))
    return Job(proc, log)


def assert_slurm_result(job, path, benchmark, world_size):
    assert job.returncode == 0, job.describe()
    assert path.exists(), job.describe()
    result = read_result(path)  # validates against schema/result.schema.json
    assert result["status"] == "ok" and result["benchmark"] == benchmark
    world = result["world"]
    assert world["launcher"] == "slurm" and world["slurm_job_id"] == job.id
    assert (world["world_size"], world["num_nodes"], world["devices_per_node"]) == (world_size, 1, world_size)
    assert world["backend"] == "gloo" and result["config"]["device"] == "cpu"
    assert result["checks"]["parameters_synchronized"] is True
    assert result["checks"]["steps_run_per_rank"] == [6] * world_size  # 2 warm-up + 4 timed: CPU mode's size
    return result


# ---------------------------------------------------------------------------------------- working jobs

@pytest.fixture(scope="module")
def native_job(cluster, results_dir):
    return submit(cluster, results_dir, "slurm/ddp_resnet50.sbatch", CPU_JOB, BENCH_DEVICE="cpu",
                  BENCH_RUN_NAME="native")


def test_native_sbatch_runs_two_slurm_tasks(native_job, results_dir):
    path = results_dir / "native" / f"ddp_resnet50-1n2cpu-job{native_job.id}.json"
    result = assert_slurm_result(native_job, path, "ddp_resnet50.py", 2)
    assert result["config"]["image_size"] == 32 and result["config"]["batch_size_per_device"] == 4
    # The batch script named the rendezvous host from Slurm's node list; the ranks used it.
    hostname = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    assert f"MASTER_ADDR={hostname}" in native_job.log and result["world"]["master_addr"] == hostname
    assert f"Slurm job {native_job.id} on 1 node(s) x 2 task(s) (cpu)" in native_job.log


def test_lightning_sbatch_runs_two_slurm_tasks(cluster, results_dir):
    job = submit(cluster, results_dir, "slurm/lightning_ddp_resnet50.sbatch", CPU_JOB, BENCH_DEVICE="cpu",
                 BENCH_RUN_NAME="lightning")
    path = results_dir / "lightning" / f"lightning_ddp_resnet50-1n2cpu-job{job.id}.json"
    assert_slurm_result(job, path, "lightning/ddp_resnet50.py", 2)
    # --devices and --num-nodes came from the job's shape.
    assert "--devices 2 --num-nodes 1" in job.log


def test_lightning_tasks_inside_salloc_do_not_look_interactive(cluster, tmp_path):
    # salloc names its job "interactive", and Lightning takes such a job for an interactive session: it
    # ignores Slurm's tasks and each task starts a 2-process world of its own (seen: two result tables).
    # The script renames the step; a stand-in interpreter shows the name every srun task sees.
    interpreter = tmp_path / "show-task"
    interpreter.write_text('#!/bin/sh\n'
                           'echo "task $SLURM_PROCID of $SLURM_STEP_NUM_TASKS in job named $SLURM_JOB_NAME"\n')
    interpreter.chmod(0o755)
    proc = subprocess.run(["salloc", "--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=0", "bash",
                           "slurm/lightning_ddp_resnet50.sbatch"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env=job_env(cluster, tmp_path, BENCH_DEVICE="cpu", BENCH_PYTHON=str(interpreter)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tasks = sorted(line for line in proc.stdout.splitlines() if line.startswith("task "))
    assert tasks == [f"task {rank} of 2 in job named lightning_ddp_resnet50" for rank in (0, 1)], proc.stdout


def test_strong_scaling_sweep_keeps_the_global_batch(cluster, results_dir):
    env = job_env(cluster, results_dir, BENCH_DEVICE="cpu", SWEEP_GPUS="1 2", SWEEP_WAIT="1", SWEEP_POLL_S="1",
                  BENCH_RUN_NAME="strong-sweep")
    proc = subprocess.run(["slurm/scaling_sweep.sh", "strong"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = results_dir / "strong-sweep"
    rows = [line.split("\t") for line in (run_dir / "sweep.tsv").read_text().splitlines()[1:]]
    assert [row[:4] for row in rows] == [["strong", "1", "1", "1"], ["strong", "2", "1", "2"]]
    batches = []
    for _, count, _, _, job_id, _ in rows:
        path = run_dir / f"ddp_resnet50-1n{count}cpu-job{job_id}.json"
        result = read_result(path)
        assert result["status"] == "ok" and result["world"]["launcher"] == "slurm"
        assert result["world"]["slurm_job_id"] == job_id and result["world"]["world_size"] == int(count)
        assert (run_dir / f"ddp_resnet50-strong-{count}-{job_id}.out").exists()  # the job log sits next to it
        config = result["config"]
        batches.append((config["batch_mode"], config["global_batch_size"], config["batch_size_per_device"]))
    # CPU mode's default: 4 images per process at the smallest point, split over more processes.
    assert batches == [("global", 4, 4), ("global", 4, 2)]


def test_oss_sbatch_runs_each_strategy_in_one_job(cluster, results_dir):
    # Two strategies, not the default `all`: every strategy of `all` costs a CPU job's worth of time here,
    # and two already show the sequence of strategies in one Slurm job and the per-strategy result files.
    job = submit(cluster, results_dir, "slurm/oss_benchmark.sbatch", CPU_JOB, timeout=400, BENCH_DEVICE="cpu",
                 BENCH_RUN_NAME="oss", BENCH_STRATEGY="ddp,zero1")
    assert job.returncode == 0, job.describe()
    for strategy in ("ddp", "zero1"):
        path = results_dir / "oss" / f"oss_benchmark-ddp+zero1-1n2cpu-job{job.id}-{strategy}.json"
        result = assert_slurm_result(job, path, "oss_benchmark.py", 2)
        assert result["strategy"] == strategy


# ---------------------------------------------------------------------------------------- bad input

BAD_INPUT = {
    "lightning-devices": ("slurm/lightning_ddp_resnet50.sbatch", CPU_JOB, ["--devices", "1"], {"BENCH_DEVICE": "cpu"},
                          "Lightning --devices 1 but --ntasks-per-node=2"),
    "lightning-num-nodes": ("slurm/lightning_ddp_resnet50.sbatch", CPU_JOB, ["--num-nodes=2"],
                            {"BENCH_DEVICE": "cpu"}, "Lightning --num-nodes 2 but the job has 1 node(s)"),
    "more-tasks-than-gpus": ("slurm/ddp_resnet50.sbatch", ["--ntasks-per-node=2", "--cpus-per-task=1",
                                                           "--gpus-per-node=1"], [], {},
                             "2 tasks per node but only 1 GPU(s) per node"),
    "more-gpus-than-tasks": ("slurm/ddp_resnet50.sbatch", ["--ntasks-per-node=1", "--cpus-per-task=1",
                                                           "--gpus-per-node=2"], [], {},
                             "2 GPUs per node but only 1 task(s) per node"),
    "no-gpu": ("slurm/lightning_ddp_resnet50.sbatch", CPU_JOB, [], {}, "no GPU allocated to this job"),
    "ntasks-not-nodes-times-per-node": ("slurm/ddp_resnet50.sbatch", ["--ntasks=1", *CPU_JOB], [],
                                        {"BENCH_DEVICE": "cpu"},
                                        "--ntasks=1 is not --nodes (1) x --ntasks-per-node (2)"),
    "weak-and-strong": ("slurm/ddp_resnet50.sbatch", CPU_JOB, [],
                        {"BENCH_DEVICE": "cpu", "BENCH_BATCH_SIZE_PER_DEVICE": "4", "BENCH_GLOBAL_BATCH_SIZE": "8"},
                        "set BENCH_BATCH_SIZE_PER_DEVICE (weak scaling) or BENCH_GLOBAL_BATCH_SIZE"),
}


def assert_stopped_before_srun(returncode, output, expected, results):
    lines = [line for line in output.splitlines() if line.strip() and not line.startswith("salloc: ")]
    assert returncode == 2, output
    assert len(lines) == 1 and ": error: " in lines[0] and expected in lines[0], output
    assert not list(results.rglob("*.json"))  # nothing ran, nothing was written


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_job_shape_stops_with_one_line(cluster, tmp_path, case):
    script, options, args, settings, expected = BAD_INPUT[case]
    job = submit(cluster, tmp_path, script, options, args, timeout=60, **settings)
    assert job.id, job.describe()
    assert_stopped_before_srun(job.returncode, job.log, expected, tmp_path)


def test_exclusive_gpu_job_passes_the_checks_and_reaches_srun(cluster, tmp_path):
    # --exclusive hands the job both (name-only) GPUs of the node although it asked for one per node: a
    # 1-GPU baseline on a reserved node is legitimate, so the checks let it through to srun. `echo` stands in
    # for python here: it shows the one task srun started and the arguments the benchmark would have got.
    options = ["--exclusive", "--ntasks-per-node=1", "--cpus-per-task=1", "--gpus-per-node=1"]
    job = submit(cluster, tmp_path, "slurm/ddp_resnet50.sbatch", options, timeout=60, BENCH_PYTHON="echo")
    assert job.returncode == 0, job.describe()
    assert f"Slurm job {job.id} on 1 node(s) x 1 task(s) (cuda)" in job.log, job.describe()
    launched = [line for line in job.log.splitlines() if line.startswith(f"{ROOT}/ddp_resnet50.py ")]
    assert launched == [f"{ROOT}/ddp_resnet50.py --device cuda --output {tmp_path}/ddp_resnet50/"
                        f"ddp_resnet50-1n1gpu-job{job.id}.json"], job.describe()


def test_ntasks_without_ntasks_per_node_stops_with_one_line(cluster, tmp_path):
    # sbatch cannot take away the script's own #SBATCH --ntasks-per-node, and with it Slurm refuses a
    # contradicting --ntasks itself. The case arises when the script runs in an allocation made without it:
    # salloc --ntasks=2, then the script (salloc runs its command here, with the job's Slurm variables).
    proc = subprocess.run(["salloc", "--ntasks=2", "--cpus-per-task=1", "bash", "slurm/ddp_resnet50.sbatch"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=job_env(cluster, tmp_path, BENCH_DEVICE="cpu"))
    assert "Granted job allocation" in proc.stderr, proc.stderr
    assert_stopped_before_srun(proc.returncode, proc.stdout + proc.stderr,
                               "--ntasks=2 without --ntasks-per-node", tmp_path)


def test_outside_slurm_the_script_says_to_submit_it(tmp_path):
    proc = subprocess.run(["bash", "slurm/ddp_resnet50.sbatch"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env=clean_env(BENCH_RESULTS_DIR=str(tmp_path)))
    assert_stopped_before_srun(proc.returncode, proc.stdout + proc.stderr, "not inside a Slurm job", tmp_path)


# ------------------------------------------------------------------- sweep composition (no Slurm needed)

@pytest.fixture
def recording_sbatch(tmp_path):
    """An `sbatch` that records its arguments and the batch settings instead of submitting: the sweep's
    composition of jobs for shapes this one-node cluster cannot run (several nodes, --gres sites)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "submitted.txt"
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f"""#!/bin/bash
set -euo pipefail
echo "$* | global=${{BENCH_GLOBAL_BATCH_SIZE:-}} run=$BENCH_RUN_NAME" >> {record}
echo $(( 100 + $(wc -l < {record}) ))
""")
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IXUSR)

    def sweep(*args, **settings):
        env = clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", BENCH_RESULTS_DIR=str(tmp_path / "results"),
                        BENCH_RUN_NAME="composed", **settings)
        proc = subprocess.run(["slurm/scaling_sweep.sh", *args], capture_output=True, text=True, timeout=60,
                              cwd=ROOT, env=env)
        return proc, record.read_text().splitlines() if record.exists() else []
    return sweep


def test_weak_sweep_fills_whole_nodes_beyond_one(recording_sbatch, tmp_path):
    proc, submitted = recording_sbatch("weak", "slurm/lightning_ddp_resnet50.sbatch", "--precision", "bf16",
                                       SWEEP_GPUS="1 4 8 16", SWEEP_GPUS_PER_NODE="8")
    assert proc.returncode == 0, proc.stderr
    shapes = [re.search(r"--nodes=(\d+) --ntasks-per-node=(\d+) .*--gpus-per-node=(\d+) ", line).groups()
              for line in submitted]
    assert shapes == [("1", "1", "1"), ("1", "4", "4"), ("1", "8", "8"), ("2", "8", "8")]
    assert all(line.endswith("slurm/lightning_ddp_resnet50.sbatch --precision bf16 | global= run=composed")
               for line in submitted), submitted
    manifest = (tmp_path / "results" / "composed" / "sweep.tsv").read_text().splitlines()
    assert manifest[1:] == [f"weak\t{n}\t{nodes}\t{tasks}\t{101 + i}\tslurm/lightning_ddp_resnet50.sbatch"
                            for i, (n, nodes, tasks) in enumerate([(1, 1, 1), (4, 1, 4), (8, 1, 8), (16, 2, 8)])]


def test_strong_sweep_fixes_one_global_batch_and_can_ask_for_gres(recording_sbatch):
    proc, submitted = recording_sbatch("strong", SWEEP_GPUS="2 4 8", BENCH_GPU_REQUEST="gres")
    assert proc.returncode == 0, proc.stderr
    # Default global batch: 256 per GPU at the smallest point (2 GPUs), split by the larger ones.
    assert all(line.endswith("slurm/ddp_resnet50.sbatch | global=512 run=composed") for line in submitted)
    assert [re.search(r"--gres=gpu:(\d+)", line).group(1) for line in submitted] == ["2", "4", "4"]
    assert all("--gpus-per-node" not in line for line in submitted)


@pytest.mark.parametrize("mode,settings,expected", [
    ("strong", {"SWEEP_GPUS": "1 2 4 8", "BENCH_GLOBAL_BATCH_SIZE": "100"}, "does not divide over 8 GPUs"),
    ("weak", {"SWEEP_GPUS": "12", "SWEEP_GPUS_PER_NODE": "8"}, "12 GPUs do not fill whole nodes of 8"),
    ("weak", {"BENCH_GLOBAL_BATCH_SIZE": "64"}, "weak scaling fixes the batch per device"),
    ("both", {}, "first argument: weak"),
])
def test_bad_sweep_stops_before_submitting(recording_sbatch, mode, settings, expected):
    proc, submitted = recording_sbatch(mode, **settings)
    assert proc.returncode == 2 and submitted == []
    assert proc.stderr.count("\n") == 1 and expected in proc.stderr, proc.stderr
