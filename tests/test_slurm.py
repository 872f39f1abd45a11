"""The slurm/ batch scripts on a real Slurm (tests/slurm_cluster.py: munged, slurmctld and slurmd on this host).

Jobs are submitted as a user would, `sbatch slurm/<script>.sbatch`, in the scripts' CPU mode (BENCH_DEVICE=cpu:
gloo, 32 px, 2 tasks of one core on the one node), and the test waits until Slurm reports the job ended. The
test cluster's node also offers two GPUs that are only names (no device behind them), so that the scripts' GPU
checks meet the values Slurm itself sets when it allocates GPUs, for --gpus-per-node and for --gres alike; such
jobs start a stand-in for python that shows what srun started. One cluster serves the whole test run. Without
Slurm installed (CI installs it: .ci/run) these tests skip with the reason, except the sweep-composition tests at
the end, which replace sbatch by a recorder. To watch the same cluster by hand: `python tests/slurm_cluster.py
/tmp/slurm` (see its docstring).
"""
import os
import pathlib
import re
import stat
import subprocess
import sys
import time

import pytest

from conftest import ROOT, clean_env, read_result
from slurm_cluster import SlurmCluster, missing_reason

CPU_JOB = ["--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=0"]
ENDED = re.compile(r"\bJobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|"
                   r"PREEMPTED)\b")


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
def results_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("results")


def job_env(cluster, results_dir=None, **settings):
    """A fresh shell's environment pointed at the test cluster and the venv's python; with results_dir, the
    results go there instead of the default runs/ of the job's working directory."""
    if results_dir is not None:
        settings.setdefault("BENCH_RESULTS_DIR", str(results_dir))
    return cluster.env(clean_env(**{"BENCH_PYTHON": sys.executable, **settings}))


def committed_results_state():
    """What git sees in the committed results/ tree (modified and new files alike); outside a git checkout,
    every file there with its size and modification time."""
    proc = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", "results"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    if proc.returncode == 0:
        return proc.stdout
    return sorted((str(path), path.stat().st_size, path.stat().st_mtime_ns)
                  for path in (ROOT / "results").rglob("*") if path.is_file())


def stand_in(directory, name, body):
    """An executable that srun starts in place of python: it shows what the benchmark would have got."""
    path = directory / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)
    return str(path)


# Each srun task prints which GPUs Slurm gave it and the arguments the benchmark would have got.
SHOW_GPUS = ('echo "task $SLURM_PROCID: SLURM_GPUS_ON_NODE=${SLURM_GPUS_ON_NODE-unset} '
             'SLURM_GPUS_PER_NODE=${SLURM_GPUS_PER_NODE-unset} args: $*"')


def gres_site_copy(script, directory):
    """The script as a site that asks for GPUs with --gres runs it: its `#SBATCH --gpus-per-node=N` line
    replaced by `#SBATCH --gres=gpu:N`, as slurm/README.md says. Submitted from the repository root."""
    text = (ROOT / script).read_text()
    changed = re.sub(r"^#SBATCH --gpus-per-node=(\d+)$", r"#SBATCH --gres=gpu:\1", text, flags=re.MULTILINE)
    assert changed != text
    path = directory / f"gres-{pathlib.Path(script).name}"
    path.write_text(changed)
    return str(path)


class Job:
    def __init__(self, job_id, returncode, log, sbatch_output):
        self.id = job_id
        self.returncode = returncode
        self.log = log.read_text() if log.exists() else ""
        self.sbatch_output = sbatch_output

    def describe(self):
        return f"job {self.id}: exit {self.returncode}\n{self.sbatch_output}\n--- job log\n{self.log}"

    def closing_files(self):
        """The files the batch script's closing line names."""
        lines = [line for line in self.log.splitlines() if line.startswith("== srun exit status")]
        assert len(lines) == 1, self.describe()
        return lines[0].split("result file(s): ", 1)[1].split()


def sbatch(cluster, directory, script, options=(), args=(), cwd=ROOT, default_results=False, **settings):
    """Submits the job with its log in directory and its results there too, or with default_results in the
    scripts' default place; returns (job id or None, the log's path, what sbatch printed)."""
    log = directory / f"{pathlib.Path(script).name}-{len(list(directory.glob('*.log')))}.log"
    proc = subprocess.run(["sbatch", "--parsable", f"--output={log}", *options, str(script), *args],
                          capture_output=True, text=True, timeout=60, cwd=cwd,
                          env=job_env(cluster, None if default_results else directory, **settings))
    job_id = proc.stdout.strip().split(";")[0] if proc.returncode == 0 else None
    return job_id, log, proc.stdout + proc.stderr


def wait_for(cluster, job_id, timeout):
    """The job's exit code once Slurm reports it ended. Polled every 0.2 s: `sbatch --wait` sleeps at least 2 s
    between looks, which adds up over the many short jobs here. Finished jobs stay listed for MinJobAge (5 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True,
                              env=cluster.env(), timeout=30)
        record = proc.stdout
        if "Invalid job id" in proc.stderr:
            pytest.fail(f"Slurm job {job_id} was purged before its end was seen: {proc.stderr.strip()}")
        if ENDED.search(record):
            code, signal_number = map(int, re.search(r"\bExitCode=(\d+):(\d+)", record).groups())
            return 128 + signal_number if signal_number else code
        time.sleep(0.2)
    subprocess.run(["scancel", job_id], capture_output=True, env=cluster.env(), timeout=30)
    pytest.fail(f"Slurm job {job_id} did not end within {timeout} s")


def submit(cluster, directory, script, options=(), args=(), timeout=240, **settings):
    """sbatch, then wait until the job has ended: the Job with its exit code and log."""
    job_id, log, output = sbatch(cluster, directory, script, options, args, **settings)
    returncode = wait_for(cluster, job_id, timeout) if job_id else None
    return Job(job_id, returncode, log, output)


def assert_slurm_result(job, path, benchmark, world_size, steps=6):
    assert job.returncode == 0, job.describe()
    assert path.exists(), job.describe()
    result = read_result(path)  # validates against schema/result.schema.json
    assert result["status"] == "ok" and result["benchmark"] == benchmark
    world = result["world"]
    assert world["launcher"] == "slurm" and world["slurm_job_id"] == job.id
    assert (world["world_size"], world["num_nodes"], world["devices_per_node"]) == (world_size, 1, world_size)
    assert world["backend"] == "gloo" and result["config"]["device"] == "cpu"
    assert result["checks"]["parameters_synchronized"] is True
    assert result["checks"]["steps_run_per_rank"] == [steps] * world_size  # CPU mode's: 2 warm-up + 4 timed
    return result


# ---------------------------------------------------------------------------------------- working jobs

@pytest.fixture(scope="session")
def strong_sweep(cluster, tmp_path_factory):
    """A strong-scaling sweep of the native script over 1 and 2 processes, called from a directory outside the
    repository without BENCH_RESULTS_DIR, with an option of benchmark_extras.py for the benchmark; the sweep's
    output, its run folder and what git saw in results/ before."""
    workdir = tmp_path_factory.mktemp("sweep-workdir")
    before = committed_results_state()
    env = job_env(cluster, BENCH_DEVICE="cpu", SWEEP_GPUS="1 2", SWEEP_WAIT="1", SWEEP_POLL_S="0.5",
                  BENCH_RUN_NAME="strong-sweep")
    proc = subprocess.run([ROOT / "slurm" / "scaling_sweep.sh", "strong", "--bucket-cap-mb", "10"],
                          capture_output=True, text=True, timeout=300, cwd=workdir, env=env)
    return proc, workdir / "runs" / "strong-sweep", before


@pytest.fixture(scope="session")
def lightning_job(cluster, tmp_path_factory):
    """The Lightning twin's script submitted from a directory outside the repository (BENCH_ROOT names it)
    without --output or BENCH_RESULTS_DIR; the job, that directory and what git saw in results/ before."""
    workdir = tmp_path_factory.mktemp("lightning-workdir")
    before = committed_results_state()
    job = submit(cluster, workdir, ROOT / "slurm" / "lightning_ddp_resnet50.sbatch", CPU_JOB, cwd=workdir,
                 default_results=True, BENCH_ROOT=str(ROOT), BENCH_DEVICE="cpu", BENCH_RUN_NAME="lightning")
    return job, workdir, before


def sweep_points(strong_sweep):
    """(processes, Job) for each point of the sweep, from its sweep.tsv and the job logs beside it."""
    proc, run_dir, _ = strong_sweep
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split("\t") for line in (run_dir / "sweep.tsv").read_text().splitlines()[1:]]
    assert [row[:4] for row in rows] == [["strong", "1", "1", "1"], ["strong", "2", "1", "2"]]
    return [(int(count), Job(job_id, 0, run_dir / f"ddp_resnet50-strong-{count}-{job_id}.out", proc.stdout))
            for _, count, _, _, job_id, _ in rows]


def test_strong_scaling_sweep_keeps_the_global_batch(strong_sweep):
    _, run_dir, _ = strong_sweep
    batches = []
    for count, job in sweep_points(strong_sweep):
        assert job.log, job.describe()  # the job log sits next to the results
        result = read_result(run_dir / f"ddp_resnet50-1n{count}cpu-job{job.id}.json")
        assert result["status"] == "ok" and result["world"]["launcher"] == "slurm"
        assert result["world"]["slurm_job_id"] == job.id and result["world"]["world_size"] == count
        config = result["config"]
        batches.append((config["batch_mode"], config["global_batch_size"], config["batch_size_per_device"]))
    # CPU mode's default: 4 images per process at the smallest point, split over more processes.
    assert batches == [("global", 4, 4), ("global", 4, 2)]


def test_native_sbatch_runs_two_slurm_tasks(strong_sweep):
    _, run_dir, _ = strong_sweep
    _, job = sweep_points(strong_sweep)[1]  # the 2-process point
    path = run_dir / f"ddp_resnet50-1n2cpu-job{job.id}.json"
    result = assert_slurm_result(job, path, "ddp_resnet50.py", 2)
    assert result["config"]["image_size"] == 32
    # An option of benchmark_extras.py, which the script imports from the repository only when it is given.
    assert result["config"]["bucket_cap_mb"] == 10
    # The batch script named the rendezvous host from Slurm's node list; the ranks used it.
    hostname = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    assert f"MASTER_ADDR={hostname}" in job.log and result["world"]["master_addr"] == hostname
    assert f"Slurm job {job.id} on 1 node(s) x 2 task(s) (cpu)" in job.log
    assert job.closing_files() == [str(path)], job.describe()


def test_lightning_sbatch_runs_two_slurm_tasks(lightning_job):
    job, workdir, _ = lightning_job
    path = workdir / "runs" / "lightning" / f"lightning_ddp_resnet50-1n2cpu-job{job.id}.json"
    assert_slurm_result(job, path, "lightning/ddp_resnet50.py", 2)
    # --devices and --num-nodes came from the job's shape.
    assert "--devices 2 --num-nodes 1" in job.log
    assert job.closing_files() == [str(path)], job.describe()


def test_results_without_output_go_to_runs_not_to_committed_results(lightning_job, strong_sweep):
    # Each was started from a directory of its own, without --output or BENCH_RESULTS_DIR.
    job, workdir, before = lightning_job
    assert job.returncode == 0, job.describe()
    assert [path.relative_to(workdir).as_posix() for path in workdir.rglob("*.json")] == [
        f"runs/lightning/lightning_ddp_resnet50-1n2cpu-job{job.id}.json"]
    assert committed_results_state() == before
    proc, run_dir, before = strong_sweep
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(path.name for path in run_dir.parent.parent.rglob("*.json")) == sorted(
        f"ddp_resnet50-1n{count}cpu-job{point.id}.json" for count, point in sweep_points(strong_sweep))
    assert committed_results_state() == before


def test_lightning_tasks_inside_salloc_do_not_look_interactive(cluster, tmp_path):
    # salloc names its job "interactive", and Lightning takes such a job for an interactive session: it
    # ignores Slurm's tasks and each task starts a 2-process world of its own. The script renames the step;
    # a stand-in interpreter shows the name every srun task sees.
    interpreter = stand_in(tmp_path, "show-task",
                           'echo "task $SLURM_PROCID of $SLURM_STEP_NUM_TASKS in job named $SLURM_JOB_NAME"')
    proc = subprocess.run(["salloc", "--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=0", "bash",
                           "slurm/lightning_ddp_resnet50.sbatch"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env=job_env(cluster, tmp_path, BENCH_DEVICE="cpu", BENCH_PYTHON=interpreter))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tasks = sorted(line for line in proc.stdout.splitlines() if line.startswith("task "))
    assert tasks == [f"task {rank} of 2 in job named lightning_ddp_resnet50" for rank in (0, 1)], proc.stdout


def test_oss_sbatch_runs_each_strategy_in_one_job(cluster, results_dir):
    # Two strategies, not the default `all`, and fewer steps than CPU mode's: every strategy costs a CPU job's
    # worth of time here, and two already show the sequence of strategies in one Slurm job and the
    # per-strategy result files.
    job = submit(cluster, results_dir, "slurm/oss_benchmark.sbatch", CPU_JOB, timeout=400, BENCH_DEVICE="cpu",
                 BENCH_RUN_NAME="oss", BENCH_STRATEGY="ddp,zero1", BENCH_WARMUP_STEPS="1", BENCH_STEPS="2")
    assert job.returncode == 0, job.describe()
    paths = [results_dir / "oss" / f"oss_benchmark-ddp+zero1-1n2cpu-job{job.id}-{strategy}.json"
             for strategy in ("ddp", "zero1")]
    for strategy, path in zip(("ddp", "zero1"), paths):
        result = assert_slurm_result(job, path, "oss_benchmark.py", 2, steps=3)
        assert result["strategy"] == strategy
    assert sorted(job.closing_files()) == [str(path) for path in paths], job.describe()


def test_closing_line_names_only_files_this_job_wrote(cluster, tmp_path):
    # A Slurm job id comes again when the controller starts afresh (this test cluster does, in every test run), and
    # an earlier job's files of that id may still be there. The job is held until they are in place; its
    # stand-in for python rewrites one of them, as a rerun of a sharding strategy would.
    rewrite = stand_in(tmp_path, "rewrite", 'while [ $# -gt 0 ]; do [ "$1" = --output ] && output=$2; shift; done\n'
                       'target=${output%.json}-ddp.json\n'
                       '[ "$SLURM_PROCID" != 0 ] || { echo "{}" >"$target.tmp" && mv "$target.tmp" "$target"; }')
    job_id, log, output = sbatch(cluster, tmp_path, "slurm/ddp_resnet50.sbatch", ["--hold", *CPU_JOB],
                                 BENCH_DEVICE="cpu", BENCH_PYTHON=rewrite, BENCH_RUN_NAME="reused")
    assert job_id, output
    stem = tmp_path / "reused" / f"ddp_resnet50-1n2cpu-job{job_id}"
    older = [pathlib.Path(f"{stem}{suffix}.json") for suffix in ("", "-ddp", "-zero1", ".4242")]
    stem.parent.mkdir()
    for path in older:
        path.write_text("{}")
    subprocess.run(["scontrol", "release", job_id], check=True, capture_output=True, env=cluster.env(), timeout=30)
    job = Job(job_id, wait_for(cluster, job_id, 60), log, output)
    assert job.returncode == 0, job.describe()
    assert job.closing_files() == [f"{stem}-ddp.json"], job.describe()


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


def test_gres_site_job_without_gpu_says_so(cluster, tmp_path):
    # --gres=gpu:0 overrides the site copy's `#SBATCH --gres=gpu:1`: Slurm sets no GPU variable at all.
    job = submit(cluster, tmp_path, gres_site_copy("slurm/ddp_resnet50.sbatch", tmp_path),
                 ["--ntasks-per-node=1", "--cpus-per-task=1", "--gres=gpu:0"], timeout=60)
    assert_stopped_before_srun(job.returncode, job.log, "no GPU allocated to this job", tmp_path)


# Per script: the tasks per node it is submitted with (2, the test node's GPUs) and its srun line's start.
GPU_JOBS = {"slurm/ddp_resnet50.sbatch": "ddp_resnet50.py --device cuda --output",
            "slurm/lightning_ddp_resnet50.sbatch": "lightning/ddp_resnet50.py --devices 2 --num-nodes 1 --device cuda",
            "slurm/oss_benchmark.sbatch": "oss_benchmark.py --strategy all --device cuda"}


@pytest.mark.parametrize("script,request_spelling", [
    ("slurm/ddp_resnet50.sbatch", "gpus-per-node"),
    ("slurm/ddp_resnet50.sbatch", "gres"),
    ("slurm/lightning_ddp_resnet50.sbatch", "gres"),
    ("slurm/oss_benchmark.sbatch", "gres"),
])
def test_gpu_job_passes_the_checks_and_reaches_srun(cluster, tmp_path, script, request_spelling):
    # Both ways of asking for GPUs: --gpus-per-node sets SLURM_GPUS_PER_NODE and SLURM_GPUS_ON_NODE, --gres only
    # the latter (a --gres site replaces the scripts' #SBATCH --gpus-per-node line). A stand-in for python shows
    # the tasks srun started, the GPUs Slurm gave each and the arguments the benchmark would have got.
    if request_spelling == "gres":
        submitted, request = gres_site_copy(script, tmp_path), "--gres=gpu:2"
    else:
        submitted, request = script, "--gpus-per-node=2"
    job = submit(cluster, tmp_path, submitted, ["--ntasks-per-node=2", "--cpus-per-task=1", request], timeout=60,
                 BENCH_PYTHON=stand_in(tmp_path, "show-gpus", SHOW_GPUS))
    assert job.returncode == 0, job.describe()
    assert f"Slurm job {job.id} on 1 node(s) x 2 task(s) (cuda, 2 GPU(s) on the first node)" in job.log, job.describe()
    per_node = "unset" if request_spelling == "gres" else "2"
    tasks = sorted(line.split(f" {ROOT}/")[0] for line in job.log.splitlines() if line.startswith("task "))
    assert tasks == [f"task {rank}: SLURM_GPUS_ON_NODE=2 SLURM_GPUS_PER_NODE={per_node} args:" for rank in (0, 1)], \
        job.describe()
    assert job.log.count(f" {ROOT}/{GPU_JOBS[script]} ") == 2, job.describe()


@pytest.mark.parametrize("request_spelling", ["gpus-per-node", "gres"])
def test_exclusive_gpu_job_passes_the_checks_and_reaches_srun(cluster, tmp_path, request_spelling):
    # --exclusive hands the job both (name-only) GPUs of the node although it asked for one per node: a
    # 1-GPU baseline on a reserved node is legitimate, so the checks let it through to srun, whichever way the
    # GPU was asked for. `echo` stands in for python: it shows the one task srun started and its arguments.
    if request_spelling == "gres":
        script, request = gres_site_copy("slurm/ddp_resnet50.sbatch", tmp_path), "--gres=gpu:1"
    else:
        script, request = "slurm/ddp_resnet50.sbatch", "--gpus-per-node=1"
    options = ["--exclusive", "--ntasks-per-node=1", "--cpus-per-task=1", request]
    job = submit(cluster, tmp_path, script, options, timeout=60, BENCH_PYTHON="echo")
    assert job.returncode == 0, job.describe()
    assert f"Slurm job {job.id} on 1 node(s) x 1 task(s) (cuda, 2 GPU(s) on the first node)" in job.log, \
        job.describe()
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


def test_sweep_that_sbatch_refuses_leaves_no_manifest(cluster, tmp_path):
    env = job_env(cluster, tmp_path, BENCH_DEVICE="cpu", SWEEP_GPUS="1 2", BENCH_RUN_NAME="refused",
                  SBATCH_PARTITION="no-such-partition")
    proc = subprocess.run(["slurm/scaling_sweep.sh", "weak"], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("scaling_sweep.sh: error: sbatch failed for the 1-process point ("), proc.stderr
    assert "partition" in lines[0] and lines[0].endswith("nothing was submitted"), proc.stderr
    assert list(tmp_path.iterdir()) == []  # neither sweep.tsv nor its run folder


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
if [ -n "${{FAIL_AT:-}}" ] && [ "$(cat {record} 2>/dev/null | wc -l)" -ge $(( FAIL_AT - 1 )) ]; then
  echo "sbatch: error: Batch job submission failed: Requested node configuration is not available" >&2
  exit 1
fi
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


def test_sweep_names_the_jobs_it_submitted_before_sbatch_failed(recording_sbatch, tmp_path):
    proc, submitted = recording_sbatch("weak", SWEEP_GPUS="1 2 4", FAIL_AT="2")
    assert proc.returncode == 1 and len(submitted) == 1, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        "scaling_sweep.sh: error: sbatch failed for the 2-GPU point (Batch job submission failed: Requested node "
        f"configuration is not available): already submitted: job(s) 101, listed in {tmp_path}/results/composed/"
        "sweep.tsv (scancel 101 cancels them)"]
    manifest = (tmp_path / "results" / "composed" / "sweep.tsv").read_text().splitlines()
    assert manifest[1:] == ["weak\t1\t1\t1\t101\tslurm/ddp_resnet50.sbatch"]


# ---------------------------------------------------------------------------------------- compare.sbatch

def test_compare_sbatch_runs_both_commands_in_the_job(cluster, tmp_path):
    # Each side's command is an srun line, as in a GPU job; the benchmark is tests/test_compare.py's stand-in,
    # whose two tasks write the same result. A comes from COMPARE_A, B after the script's name.
    from test_compare import FAKE_SCRIPT, read_comparison
    fake = tmp_path / "fake_bench.py"
    fake.write_text(FAKE_SCRIPT)
    side = f"srun python {fake} --calls {tmp_path}/calls.txt --label"
    job = submit(cluster, tmp_path, "slurm/compare.sbatch", CPU_JOB, ["--b", f"{side} b --ips 90"], timeout=120,
                 BENCH_DEVICE="cpu", COMPARE_A=f"{side} a --ips 100", COMPARE_ROUNDS="2")
    assert job.returncode == 0, job.describe()
    path = tmp_path / "compare" / f"compare-job{job.id}.json"
    assert f"== compare.py exit status 0; result file(s): {path}" in job.log.splitlines(), job.describe()
    comparison = read_comparison(path)
    assert comparison["ratio"] == pytest.approx(0.9) and comparison["status"] == "ok"
    assert (tmp_path / "calls.txt").read_text().split() == ["a", "a", "b", "b", "b", "b", "a", "a"]


def test_compare_sbatch_without_a_command_says_so(cluster, tmp_path):
    job = submit(cluster, tmp_path, "slurm/compare.sbatch", CPU_JOB, timeout=60, BENCH_DEVICE="cpu",
                 COMPARE_A="srun python ddp_resnet50.py --device cpu")
    assert_stopped_before_srun(job.returncode, job.log, "no command B: set COMPARE_B=", tmp_path)
