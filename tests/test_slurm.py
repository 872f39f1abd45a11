"""The slurm/ batch scripts on a real Slurm (tests/slurm_cluster.py: munged, slurmctld and slurmd on this host).

Jobs are submitted as a user would, `sbatch slurm/<script>.sbatch`, in the scripts' CPU mode (BENCH_DEVICE=cpu:
gloo, 32 px, 2 tasks of one core on the one node), and the test waits until Slurm reports the job ended. The
test cluster's node also offers two GPUs that are only names (no device behind them), so that the scripts' GPU
checks meet the values Slurm itself sets when it allocates GPUs, for --gpus-per-node and for --gres alike; such
jobs start a stand-in for python that shows what srun started, as do the jobs that only need the batch script's
own behaviour. One cluster serves the whole test run; jobs over two nodes, the sweep and the sharding script run
on the two-node cluster of tests/test_multinode.py. Without Slurm installed (CI installs it: .ci/run) these tests
skip with the reason, except the sweep-composition tests at the end, which replace sbatch by a recorder. To watch
the same cluster by hand: `python tests/slurm_cluster.py /tmp/slurm` (see its docstring).
"""
import os
import pathlib
import re
import stat
import subprocess

import pytest

from conftest import ROOT, clean_env, read_result
from slurm_cluster import SlurmCluster
from slurm_jobs import (CPU_JOB, Job, assert_slurm_result, committed_results_state, job_env, sbatch, stand_in,
                        start_cluster, submit, wait_for, wait_for_line)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    cluster = start_cluster(lambda: SlurmCluster(tmp_path_factory.mktemp("slurm")))
    yield cluster
    cluster.stop()


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


# ---------------------------------------------------------------------------------------- working jobs
# The sweep, the sharding script and more than one node: tests/test_multinode.py, on two nodes.

@pytest.fixture(scope="session")
def lightning_job(cluster, tmp_path_factory):
    """The Lightning twin's script with the CPU mode's defaults, submitted from a directory outside the repository
    (BENCH_ROOT names it) without --output or BENCH_RESULTS_DIR; the job, that directory and what git saw in
    results/ before."""
    workdir = tmp_path_factory.mktemp("lightning-workdir")
    before = committed_results_state()
    job = submit(cluster, workdir, ROOT / "slurm" / "lightning_ddp_resnet50.sbatch", CPU_JOB, cwd=workdir,
                 default_results=True, BENCH_ROOT=str(ROOT), BENCH_DEVICE="cpu", BENCH_RUN_NAME="lightning")
    return job, workdir, before


def test_lightning_sbatch_runs_two_slurm_tasks(lightning_job):
    job, workdir, _ = lightning_job
    path = workdir / "runs" / "lightning" / f"lightning_ddp_resnet50-1n2cpu-job{job.id}.json"
    result = assert_slurm_result(job, path, "lightning/ddp_resnet50.py", 2)
    # --devices and --num-nodes came from the job's shape.
    assert "--devices 2 --num-nodes 1" in job.log
    assert job.closing_files() == [str(path)], job.describe()
    # CPU mode sets the size of the run (32 px, 4 images, 2 + 4 steps) and nothing else: the learning rate is
    # the script's own default (0.1, its --help), as the srun line shows.
    srun_line = next(line for line in job.log.splitlines() if line.startswith("== ") and "--device cpu" in line)
    assert "--lr" not in srun_line and result["config"]["lr"] == 0.1, job.describe()
    assert result["config"]["image_size"] == 32 and result["config"]["batch_size_per_device"] == 4


def test_results_without_output_go_to_runs_not_to_committed_results(lightning_job):
    # Started from a directory of its own, without --output or BENCH_RESULTS_DIR.
    job, workdir, before = lightning_job
    assert job.returncode == 0, job.describe()
    assert [path.relative_to(workdir).as_posix() for path in workdir.rglob("*.json")] == [
        f"runs/lightning/lightning_ddp_resnet50-1n2cpu-job{job.id}.json"]
    assert committed_results_state() == before


def test_lightning_tasks_inside_salloc_do_not_look_interactive(cluster, tmp_path):
    # salloc names its job "interactive", and Lightning takes such a job for an interactive session: it
    # ignores Slurm's tasks and each task starts a 2-process world of its own. The script renames the step;
    # a stand-in interpreter shows the name every srun task sees.
    interpreter = stand_in(tmp_path, "show-task",
                           'echo "task $SLURM_PROCID of $SLURM_STEP_NUM_TASKS in job named $SLURM_JOB_NAME"')
    proc = subprocess.run(["salloc", "--ntasks-per-node=2", "--gpus-per-node=0", "bash",
                           "slurm/lightning_ddp_resnet50.sbatch"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env=job_env(cluster, tmp_path, BENCH_DEVICE="cpu", BENCH_PYTHON=interpreter))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tasks = sorted(line for line in proc.stdout.splitlines() if line.startswith("task "))
    assert tasks == [f"task {rank} of 2 in job named lightning_ddp_resnet50" for rank in (0, 1)], proc.stdout


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


@pytest.mark.parametrize("script,options", [
    ("slurm/ddp_resnet50.sbatch", []),
    ("slurm/lightning_ddp_resnet50.sbatch", []),
    ("slurm/oss_benchmark.sbatch", ["--ntasks-per-node=2", "--gpus-per-node=2"]),  # its 4 GPUs: the node has 2
])
def test_default_submission_fits_a_small_node(cluster, tmp_path, script, options):
    # `sbatch slurm/<script>` with nothing else, on a node of few cores (and two name-only GPUs): the job must
    # start, not pend for good because the script asks for more cores per task than the node has. The test node
    # has as many cores as this host, which may be more than such a request: the scripts' own lines are read too.
    request = re.findall(r"^#SBATCH +(?:--cpus-per-task|--cpus-per-gpu|--mincpus|-c)\b.*", (ROOT / script).read_text(),
                         flags=re.MULTILINE)
    assert request == [], f"{script} asks for a fixed number of cores: {request}"
    job = submit(cluster, tmp_path, script, options, timeout=60, BENCH_PYTHON="echo")
    assert job.returncode == 0, job.describe()
    tasks, gpus = (2, 2) if options else (1, 1)
    assert f"Slurm job {job.id} on 1 node(s) x {tasks} task(s) (cuda, {gpus} GPU(s) on the first node)" in job.log, \
        job.describe()


# ---------------------------------------------------------------------------------------- bad input

BAD_INPUT = {
    "lightning-devices": ("slurm/lightning_ddp_resnet50.sbatch", CPU_JOB, ["--devices", "1"], {"BENCH_DEVICE": "cpu"},
                          "Lightning --devices 1 but --ntasks-per-node=2"),
    "lightning-num-nodes": ("slurm/lightning_ddp_resnet50.sbatch", CPU_JOB, ["--num-nodes=2"],
                            {"BENCH_DEVICE": "cpu"}, "Lightning --num-nodes 2 but the job has 1 node(s)"),
    "more-tasks-than-gpus": ("slurm/ddp_resnet50.sbatch", ["--ntasks-per-node=2", "--gpus-per-node=1"], [], {},
                             "2 tasks per node but only 1 GPU(s) per node"),
    "more-gpus-than-tasks": ("slurm/ddp_resnet50.sbatch", ["--ntasks-per-node=1", "--gpus-per-node=2"], [], {},
                             "2 GPUs per node but only 1 task(s) per node"),
    "no-gpu": ("slurm/lightning_ddp_resnet50.sbatch", CPU_JOB, [], {}, "no GPU allocated to this job"),
    "ntasks-not-nodes-times-per-node": ("slurm/ddp_resnet50.sbatch", ["--ntasks=1", *CPU_JOB], [],
                                        {"BENCH_DEVICE": "cpu"},
                                        "--ntasks=1 is not --nodes (1) x --ntasks-per-node (2)"),
    "weak-and-strong": ("slurm/ddp_resnet50.sbatch", CPU_JOB, [],
                        {"BENCH_DEVICE": "cpu", "BENCH_BATCH_SIZE_PER_DEVICE": "4", "BENCH_GLOBAL_BATCH_SIZE": "8"},
                        "set BENCH_BATCH_SIZE_PER_DEVICE (weak scaling) or BENCH_GLOBAL_BATCH_SIZE"),
    # Run folders that would leave the results folder, or be filed under another name than the one given. `echo`
    # stands in for python: such a job must stop before srun.
    "run-name-parent": ("slurm/ddp_resnet50.sbatch", CPU_JOB, [], {"BENCH_DEVICE": "cpu", "BENCH_RUN_NAME": "..",
                                                                   "BENCH_PYTHON": "echo"},
                        "BENCH_RUN_NAME '..' cannot name the run folder"),
    "run-name-path": ("slurm/ddp_resnet50.sbatch", CPU_JOB, [], {"BENCH_DEVICE": "cpu", "BENCH_RUN_NAME": "a/b",
                                                                 "BENCH_PYTHON": "echo"},
                      "BENCH_RUN_NAME 'a/b' cannot name the run folder"),
    "job-name-parent": ("slurm/ddp_resnet50.sbatch", ["--job-name=..", *CPU_JOB], [],
                        {"BENCH_DEVICE": "cpu", "BENCH_PYTHON": "echo"},
                        "the job name (--job-name; BENCH_RUN_NAME overrides it) '..' cannot name the run folder"),
}


def assert_stopped_before_srun(returncode, output, expected, directory):
    lines = [line for line in output.splitlines() if line.strip() and not line.startswith("salloc: ")]
    assert returncode == 2, output
    assert len(lines) == 1 and ": error: " in lines[0] and expected in lines[0], output
    # Nothing ran, nothing was written or made: no result, no run folder (the results go to directory/results).
    assert not [path for path in directory.rglob("*") if path.is_dir() or path.suffix == ".json"], output


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_job_shape_stops_with_one_line(cluster, tmp_path, case):
    script, options, args, settings, expected = BAD_INPUT[case]
    job = submit(cluster, tmp_path, script, options, args, timeout=60,
                 **{"BENCH_RESULTS_DIR": str(tmp_path / "results"), **settings})
    assert job.id, job.describe()
    assert_stopped_before_srun(job.returncode, job.log, expected, tmp_path)


def test_refused_benchmark_arguments_leave_no_run_folder(cluster, tmp_path):
    # The benchmark itself refuses the strategy, before it makes its result's folder; the batch script must not
    # have made that folder for it either.
    job = submit(cluster, tmp_path, "slurm/oss_benchmark.sbatch", ["--ntasks-per-node=1", "--gpus-per-node=0"],
                 ["--strategy", "bogus"], timeout=120, BENCH_DEVICE="cpu", BENCH_RESULTS_DIR=str(tmp_path / "runs"))
    assert job.returncode == 2 and "bogus" in job.log, job.describe()
    assert job.closing_files() == ["none"], job.describe()
    assert not (tmp_path / "runs").exists(), job.describe()


def test_gres_site_job_without_gpu_says_so(cluster, tmp_path):
    # --gres=gpu:0 overrides the site copy's `#SBATCH --gres=gpu:1`: Slurm sets no GPU variable at all.
    job = submit(cluster, tmp_path, gres_site_copy("slurm/ddp_resnet50.sbatch", tmp_path),
                 ["--ntasks-per-node=1", "--gres=gpu:0"], timeout=60)
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
    job = submit(cluster, tmp_path, submitted, ["--ntasks-per-node=2", request], timeout=60,
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
    options = ["--exclusive", "--ntasks-per-node=1", request]
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


# ------------------------------------------------------------------- the manual, the sweep's composition (no Slurm)

def test_manual_shows_cpu_mode_for_every_script_and_how_to_start_a_private_cluster():
    manual = (ROOT / "slurm" / "README.md").read_text()
    cpu_mode = manual.split("\n## CPU mode\n", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in cpu_mode.splitlines() if line.startswith("BENCH_DEVICE=cpu ")]
    for script in sorted((ROOT / "slurm").glob("*.sbatch")):
        assert [line for line in commands if f"--gpus-per-node=0 slurm/{script.name}" in line], script.name
    assert "python3 tests/slurm_cluster.py " in manual and "export SLURM_CONF=" in manual



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
        env = clean_env(**{"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                           "BENCH_RESULTS_DIR": str(tmp_path / "results"), "BENCH_RUN_NAME": "composed", **settings})
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
    ("weak", {"BENCH_RUN_NAME": ".."}, "BENCH_RUN_NAME '..' cannot name the run folder"),
])
def test_bad_sweep_stops_before_submitting(recording_sbatch, tmp_path, mode, settings, expected):
    proc, submitted = recording_sbatch(mode, **settings)
    assert proc.returncode == 2 and submitted == []
    assert proc.stderr.count("\n") == 1 and expected in proc.stderr, proc.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "sweep.tsv").exists()


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


def test_compare_sbatch_cancelled_keeps_the_comparison_and_the_closing_line(cluster, tmp_path):
    # scancel, as the time limit does: SIGTERM to every process of the job, the batch shell, compare.py and the
    # round under way alike. compare.py writes the comparison so far (interrupted); the batch shell must live on
    # to write the closing line that names it.
    from test_compare import FAKE_SCRIPT, read_comparison
    fake = tmp_path / "fake_bench.py"
    fake.write_text(FAKE_SCRIPT)
    side = f"python {fake} --calls {tmp_path}/calls.txt --sleep 60 --label"
    job_id, log, output = sbatch(cluster, tmp_path, "slurm/compare.sbatch", ["--gpus-per-node=0"], [],
                                 BENCH_DEVICE="cpu", COMPARE_A=f"{side} a", COMPARE_B=f"{side} b",
                                 COMPARE_ROUNDS="2")
    assert job_id, output
    calls = tmp_path / "calls.txt"
    wait_for_line(cluster, job_id, calls, r"^a$", 60)  # round 1 under way
    subprocess.run(["scancel", job_id], check=True, capture_output=True, env=cluster.env(), timeout=30)
    job = Job(job_id, wait_for(cluster, job_id, 60), log, output)
    path = tmp_path / "compare" / f"compare-job{job.id}.json"
    closing = [line for line in job.log.splitlines() if line.startswith("== compare.py exit status")]
    assert closing == [f"== compare.py exit status 130; result file(s): {path}"], job.describe()
    assert "== compare: SIGTERM received while compare.py ran" in job.log.splitlines(), job.describe()
    assert read_comparison(path)["status"] == "interrupted", job.describe()


def test_compare_sbatch_without_a_command_says_so(cluster, tmp_path):
    job = submit(cluster, tmp_path, "slurm/compare.sbatch", CPU_JOB, timeout=60, BENCH_DEVICE="cpu",
                 COMPARE_A="srun python ddp_resnet50.py --device cpu")
    assert_stopped_before_srun(job.returncode, job.log, "no command B: set COMPARE_B=", tmp_path)
