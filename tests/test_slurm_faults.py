"""Bad input that one rank alone refuses, under srun as slurm/common.sh starts it (--kill-on-bad-exit=1), on the
tests' one-node Slurm cluster (tests/slurm_cluster.py): the job's code is srun's and the refusing rank's one line
names the cause, as README.md's "Faults and exit codes" says."""
import sys

import pytest

from slurm_cluster import SlurmCluster
from slurm_jobs import CPU_JOB, start_cluster, submit


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(lambda: SlurmCluster(tmp_path_factory.mktemp("slurm-faults")))
    yield cluster
    cluster.stop()


def test_bad_input_on_one_task_ends_the_srun_job_with_143_and_that_tasks_line(cluster, tmp_path):
    """Task 1 alone gets a learning rate it refuses (exit 2); srun then ends task 0, which waits at the meeting,
    with SIGTERM: srun's code is the largest of its tasks', 143. Nothing is written."""
    python = tmp_path / "python"  # the interpreter srun starts: task 1 adds the bad argument
    python.write_text(f'#!/bin/bash\nif [ "$SLURM_PROCID" = 1 ]; then exec {sys.executable} "$@" --lr -1; fi\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    job = submit(cluster, tmp_path, "slurm/ddp_resnet50.sbatch", CPU_JOB, [], timeout=180, BENCH_DEVICE="cpu",
                 BENCH_PYTHON=str(python), BENCH_RESULTS_DIR=str(tmp_path / "runs"))
    lines = [line for line in job.log.splitlines() if line.startswith("ddp_resnet50.py: error: ")]
    assert job.returncode == 143 and len(lines) == 1 and "Traceback" not in job.log, job.describe()
    assert job.closing_files() == ["none"], job.describe()
