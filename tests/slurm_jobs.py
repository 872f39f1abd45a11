"""Jobs of the slurm/ batch scripts on the test clusters (tests/slurm_cluster.py), submitted as a user would with
sbatch, and what they left: their exit code, log and results. Shared by tests/test_slurm.py (one node) and
tests/test_multinode.py (two nodes)."""
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from conftest import ROOT, clean_env, read_result
from slurm_cluster import NetworkRefused, missing_reason

# The scripts' CPU mode: two tasks on the one node, each with Slurm's default of one core; --gpus-per-node=0
# cancels the scripts' GPU request.
CPU_JOB = ["--ntasks-per-node=2", "--gpus-per-node=0"]
ENDED = re.compile(r"\bJobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|"
                   r"PREEMPTED)\b")
# The reasons of a pending job that Slurm will never start.
NEVER_STARTS = re.compile(r"\bReason=(PartitionConfig|PartitionNodeLimit|BadConstraints)\b")


def start_cluster(make, nodes=1):
    """A started cluster, or the test skipped with the reason this host cannot run one; .ci/run sets
    BENCH_REQUIRE_SLURM=1 (once it has installed Slurm), which turns that skip into a failure."""
    required = os.environ.get("BENCH_REQUIRE_SLURM") == "1"
    reason = missing_reason(nodes)
    if reason is None:
        try:
            return make().start()
        except NetworkRefused as refused:  # e.g. no network namespaces in an unprivileged container
            reason = str(refused)
    if required:
        pytest.fail(f"BENCH_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


def job_env(cluster, results_dir=None, **settings):
    """A fresh shell's environment pointed at the test cluster and the venv's python; with results_dir, the
    results go there instead of the default runs/ of the job's working directory.

    OMP_WAIT_POLICY=PASSIVE: the benchmarks give each rank the host's cores divided by its node's ranks, and the
    test nodes share this host's few cores (with each other and with other tests), where OpenMP threads that spin
    while waiting for a descheduled peer make a 32 px step ten times slower; sleeping ones do not."""
    if results_dir is not None:
        settings.setdefault("BENCH_RESULTS_DIR", str(results_dir))
    return cluster.env(clean_env(**{"BENCH_PYTHON": sys.executable, "OMP_WAIT_POLICY": "PASSIVE", **settings}))


def committed_results_state():
    """What git sees in the committed results/ tree (modified and new files alike); outside a git checkout,
    every file there with its size and modification time."""
    proc = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", "results"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    if proc.returncode == 0:
        return proc.stdout
    return sorted((str(path), path.stat().st_size, path.stat().st_mtime_ns)
                  for path in (ROOT / "results").rglob("*") if path.is_file())


def manual_result_name(path):
    """True when the result's path (from runs/ on) fits one of the file-name patterns that slurm/README.md gives."""
    placeholders = {"<run name>": "[A-Za-z0-9._-]+", "<script>": "[a-z0-9_]+", "<strategies>": "[A-Za-z0-9_+]+",
                    "<nodes>": "[0-9]+", "<tasks per node>": "[0-9]+", "<gpu|cpu>": "(gpu|cpu)",
                    "<Slurm job id>": "[0-9]+", "[-<strategy>]": "(-[a-z0-9_]+)?"}
    manual = (ROOT / "slurm" / "README.md").read_text()
    patterns = re.findall(r"^(runs/<run name>/.+\.json)$", manual, flags=re.MULTILINE)
    assert patterns, "slurm/README.md gives no runs/<run name>/... pattern"
    name = "runs/" + pathlib.Path(path).parent.name + "/" + pathlib.Path(path).name
    for pattern in patterns:
        expression = re.escape(pattern)
        for placeholder, replacement in placeholders.items():
            expression = expression.replace(re.escape(placeholder), replacement)
        if re.fullmatch(expression, name):
            return True
    return False


def stand_in(directory, name, body):
    """An executable that srun starts in place of python: it shows what the benchmark would have got."""
    path = directory / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)
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
    number = 0
    while (directory / f"{pathlib.Path(script).name}-{number}.log").exists():
        number += 1
    log = directory / f"{pathlib.Path(script).name}-{number}.log"
    log.touch()  # taken now, although Slurm writes it only once the job starts
    proc = subprocess.run(["sbatch", "--parsable", f"--output={log}", *options, str(script), *args],
                          capture_output=True, text=True, timeout=60, cwd=cwd,
                          env=job_env(cluster, None if default_results else directory, **settings))
    job_id = proc.stdout.strip().split(";")[0] if proc.returncode == 0 else None
    return job_id, log, proc.stdout + proc.stderr


def job_record(cluster, job_id):
    proc = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True,
                          env=cluster.env(), timeout=30)
    if "Invalid job id" in proc.stderr:
        pytest.fail(f"Slurm job {job_id} was purged before its end was seen: {proc.stderr.strip()}")
    return proc.stdout


def wait_for(cluster, job_id, timeout):
    """The job's exit code once Slurm reports it ended (a cancelled job only once its processes are gone: until
    then its state is COMPLETING). Polled every 0.2 s: `sbatch --wait` sleeps at least 2 s between looks, which
    adds up over the many short jobs here. Finished jobs stay listed for MinJobAge (5 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = job_record(cluster, job_id)
        if ENDED.search(record):
            code, signal_number = map(int, re.search(r"\bExitCode=(\d+):(\d+)", record).groups())
            return 128 + signal_number if signal_number else code
        never = NEVER_STARTS.search(record)
        if never and "JobState=PENDING" in record:
            subprocess.run(["scancel", job_id], capture_output=True, env=cluster.env(), timeout=30)
            pytest.fail(f"Slurm job {job_id} would pend for good ({never.group(0)}): {record.strip()}")
        time.sleep(0.2)
    subprocess.run(["scancel", job_id], capture_output=True, env=cluster.env(), timeout=30)
    pytest.fail(f"Slurm job {job_id} did not end within {timeout} s")


def wait_for_line(cluster, job_id, log, pattern, timeout):
    """Waits until the running job's log has a line that matches pattern (a regular expression)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and re.search(pattern, log.read_text(), flags=re.MULTILINE):
            return
        if ENDED.search(job_record(cluster, job_id)):
            break
        time.sleep(0.2)
    text = log.read_text() if log.exists() else "(no log)"
    subprocess.run(["scancel", job_id], capture_output=True, env=cluster.env(), timeout=30)
    pytest.fail(f"Slurm job {job_id}: no line {pattern!r} in its log within {timeout} s\n{text}")


def submit(cluster, directory, script, options=(), args=(), timeout=240, **settings):
    """sbatch, then wait until the job has ended: the Job with its exit code and log."""
    job_id, log, output = sbatch(cluster, directory, script, options, args, **settings)
    returncode = wait_for(cluster, job_id, timeout) if job_id else None
    return Job(job_id, returncode, log, output)


def assert_slurm_result(job, path, benchmark, world_size, steps=6, nodes=1):
    assert job.returncode == 0, job.describe()
    assert path.exists(), job.describe()
    result = read_result(path)  # validates against schema/result.schema.json
    assert result["status"] == "ok" and result["benchmark"] == benchmark
    world = result["world"]
    assert world["launcher"] == "slurm" and world["slurm_job_id"] == job.id
    assert (world["world_size"], world["num_nodes"], world["devices_per_node"]) == (world_size, nodes,
                                                                                    world_size // nodes)
    assert world["backend"] == "gloo" and result["config"]["device"] == "cpu"
    assert result["checks"]["parameters_synchronized"] is True
    assert result["checks"]["steps_run_per_rank"] == [steps] * world_size  # CPU mode's: 2 warm-up + 4 timed
    return result
