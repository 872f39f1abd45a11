"""Two nodes: without a cluster, and on a two-node Slurm cluster.

Without a cluster: two torchrun "node" processes on loopback, one rank each, the native script on CPU. Each torchrun
is what a user starts on each node of a multi-node job (`--nnodes 2 --node-rank N` with the first node's address);
here both nodes are this host, so the ranks meet over 127.0.0.1 and gloo.

On Slurm: the slurm/ batch scripts submitted with `sbatch --nodes=2` to a private cluster whose two nodes are
network namespaces of this host (tests/slurm_cluster.py), in CPU mode. Without Slurm or root these tests skip with
the reason; .ci/run makes that a failure.
"""
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from conftest import NATIVE, ROOT, SMALL, clean_env, finish, free_port, read_result
from slurm_cluster import TwoNodeCluster
from slurm_jobs import (Job, assert_slurm_result, committed_results_state, job_env, job_record, manual_result_name,
                        sbatch, start_cluster, wait_for, wait_for_line)


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory):
    output = tmp_path_factory.mktemp("multinode") / "result.json"
    port = free_port()
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                               "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
                               str(NATIVE), *SMALL, "--output", str(output)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              # each rank takes every core of its "node", this host's: passive OpenMP threads
                              # do not spin while the other rank's are descheduled
                              env=clean_env(OMP_WAIT_POLICY="PASSIVE"))
             for node in (0, 1)]
    outcomes = finish(nodes, limit_s=300)
    for node, (code, out, err) in enumerate(outcomes):
        assert code == 0, f"node {node} exited {code}\n{out}\n{err}"
    return outcomes, read_result(output)


def test_two_torchrun_nodes_make_one_world(two_node_run):
    outcomes, result = two_node_run
    world = result["world"]
    assert (world["num_nodes"], world["world_size"], world["devices_per_node"]) == (2, 2, 1)
    assert world["launcher"] == "torchrun" and world["backend"] == "gloo" and world["slurm_job_id"] is None
    assert result["status"] == "ok"
    assert [rank["rank"] for rank in result["hardware"]["ranks"]] == [0, 1]
    # Only node 0 holds rank 0, which prints the report; node 1's rank stays quiet.
    assert "| ddp | 2 | 4 |" in outcomes[0][1] and "| ddp |" not in outcomes[1][1]


def test_two_torchrun_nodes_keep_parameters_synchronised(two_node_run):
    _, result = two_node_run
    checks = result["checks"]
    assert checks["parameters_synchronized"] is True and checks["parameter_max_abs_diff"] == 0.0
    assert checks["steps_run_per_rank"] == [6, 6] and checks["loss_finite"]
    assert result["config"]["global_batch_size"] == 8  # 4 per rank over both nodes


# ------------------------------------------------------------------------------ two Slurm nodes (network namespaces)
# tests/slurm_cluster.py's TwoNodeCluster: node1 and node2, each with its own hostname, address and slurmd; the
# ranks on the two nodes meet over the link between them. The jobs are the tiniest CPU runs (32 px, 4 images,
# 1 warm-up + 2 timed steps, one task per node) and are all submitted at once when the first test needs them;
# Slurm runs two side by side (each node has two cores). The tests that end a job come first: their jobs hold
# cores until they are ended.

TWO_NODES = ["--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=0"]
TINY = {"BENCH_DEVICE": "cpu", "BENCH_WARMUP_STEPS": "1", "BENCH_STEPS": "2"}
ENDLESS = {**TINY, "BENCH_STEPS": "100000"}
PROMPTLY_S = 20  # a job step that Slurm ends (not waiting out --timeout, 300 s, or KillWait, 30 s)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    cluster = start_cluster(lambda: TwoNodeCluster(tmp_path_factory.mktemp("slurm-two-nodes")), nodes=2)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def two_node_jobs(two_nodes, tmp_path_factory):
    """Every two-node job, submitted at once: {name: (job id, log, sbatch's output)}, the sweep's process, the
    folders of both and what git saw in results/ before."""
    directory = tmp_path_factory.mktemp("two-node-jobs")
    workdir = tmp_path_factory.mktemp("two-node-sweep-workdir")
    before = committed_results_state()

    def submit_job(name, script, args=(), **settings):
        job_id, log, output = sbatch(two_nodes, directory, script, TWO_NODES, args, BENCH_RUN_NAME=name, **settings)
        assert job_id, output
        return job_id, log, output

    jobs = {"killed": submit_job("killed", "slurm/ddp_resnet50.sbatch", **ENDLESS),
            "cancelled": submit_job("cancelled", "slurm/ddp_resnet50.sbatch", **ENDLESS)}
    # A strong-scaling sweep of the native script at 1, 2 and 4 processes (the last over both nodes), each
    # multi-process point probing its link (--collective-probe, an option of the package), called from a directory
    # outside the repository without BENCH_RESULTS_DIR. A global batch of 8 leaves 2 images per process at 4 (batch
    # norm needs more than one value per channel).
    sweep = subprocess.Popen([ROOT / "slurm" / "scaling_sweep.sh", "strong"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=workdir,
                             env=job_env(two_nodes, SWEEP_GPUS="1 2 4", SWEEP_GPUS_PER_NODE="2", SWEEP_WAIT="1",
                                         SWEEP_PROBE="1", SWEEP_POLL_S="0.5", BENCH_GLOBAL_BATCH_SIZE="8",
                                         BENCH_RUN_NAME="strong-sweep", **TINY))
    jobs["lightning"] = submit_job("lightning", "slurm/lightning_ddp_resnet50.sbatch", **TINY)
    # Two strategies show the sequence of strategies in one job and the per-strategy files; one instrumented step
    # (CPU mode's default is 2) keeps each short.
    jobs["oss"] = submit_job("oss", "slurm/oss_benchmark.sbatch", ["--phase-steps", "1"], BENCH_STRATEGY="ddp,zero1",
                             **TINY)
    yield jobs, sweep, directory, workdir, before
    if sweep.poll() is None:
        sweep.kill()
        sweep.wait()


def ended(cluster, job, timeout=300):
    job_id, log, output = job
    return Job(job_id, wait_for(cluster, job_id, timeout), log, output)


def task_pid(job_id, rank):
    """The process of a running job's task (srun's, not the batch shell) of that rank, found through /proc."""
    wanted = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURM_PROCID={rank}".encode()}
    for entry in pathlib.Path("/proc").iterdir():
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:  # not a process, or gone
            continue
        if wanted <= environ and any(item.startswith(b"SLURM_STEP_NUM_TASKS=") for item in environ):
            return int(entry.name)
    pytest.fail(f"no task of rank {rank} of Slurm job {job_id} in /proc")


def node_result(run_dir, job):
    """The job's one result in its run folder, whatever its shape's part of the name."""
    paths = sorted(run_dir.glob(f"*-job{job.id}.json"))
    assert len(paths) == 1, job.describe()
    return paths[0], read_result(paths[0])


def assert_two_nodes(job, result, hosts=True, per_node=1):
    """The result of a job on node1 and node2: the Slurm job, both nodes, each rank's own host (hosts: a result
    that gathered every rank's record), and the rendezvous host that the batch script derived from the node list
    (node[1-2]) and the ranks used."""
    world = result["world"]
    assert world["launcher"] == "slurm" and world["slurm_job_id"] == job.id, job.describe()
    assert (world["num_nodes"], world["world_size"], world["devices_per_node"]) == (2, 2 * per_node, per_node), \
        job.describe()
    if hosts:
        ranks = [(rank["rank"], rank["hostname"]) for rank in result["hardware"]["ranks"]]
        assert ranks == [(rank, f"node{1 + rank // per_node}") for rank in range(2 * per_node)], job.describe()
    assert "MASTER_ADDR=node1" in job.log and world["master_addr"] == "node1", job.describe()
    assert f"Slurm job {job.id} on 2 node(s) x {per_node} task(s) (cpu)" in job.log, job.describe()


def test_a_killed_task_ends_the_job_step_even_its_hung_peer(two_nodes, two_node_jobs):
    """Rank 0 hangs (SIGSTOP: it would never notice anything), then rank 1 is killed: srun --kill-on-bad-exit=1
    ends the whole step at once, and the run, which did not finish, writes nothing."""
    jobs, _, directory, _, _ = two_node_jobs
    job_id, log, _ = jobs["killed"]
    wait_for_line(two_nodes, job_id, log, r"measuring step 1/", 300)
    os.kill(task_pid(job_id, 0), signal.SIGSTOP)  # rank 0, on node1
    os.kill(task_pid(job_id, 1), signal.SIGKILL)  # rank 1, on node2
    killed_at = time.monotonic()
    job = ended(two_nodes, jobs["killed"], timeout=PROMPTLY_S + 60)
    assert time.monotonic() - killed_at < PROMPTLY_S and job.returncode != 0, job.describe()
    assert job.closing_files() == ["none"] and not list((directory / "killed").glob("*.json")), job.describe()


def test_scancel_ends_every_task_at_once(two_nodes, two_node_jobs):
    # A plain scancel, as the time limit does: SIGTERM to every process of the job on both nodes, the batch
    # shell and srun included; the tasks take its default action (SIGKILL would follow after KillWait, 30 s).
    jobs, _, directory, _, _ = two_node_jobs
    job_id, log, _ = jobs["cancelled"]
    wait_for_line(two_nodes, job_id, log, r"measuring step 1/", 300)
    subprocess.run(["scancel", job_id], check=True, capture_output=True, env=two_nodes.env(), timeout=30)
    cancelled_at = time.monotonic()
    job = ended(two_nodes, jobs["cancelled"], timeout=PROMPTLY_S + 60)
    assert time.monotonic() - cancelled_at < PROMPTLY_S, job.describe()
    assert "JobState=CANCELLED" in job_record(two_nodes, job_id), job.describe()
    assert not list((directory / "cancelled").glob("*.json")), job.describe()


@pytest.fixture(scope="module")
def sweep_points(two_node_jobs):
    """The sweep's run folder and (processes, nodes, Job) for each of its points, from its sweep.tsv and the job
    logs beside it, once the sweep has waited for its jobs."""
    _, sweep, _, workdir, _ = two_node_jobs
    out, err = sweep.communicate(timeout=400)
    assert sweep.returncode == 0, out + err
    run_dir = workdir / "runs" / "strong-sweep"
    rows = [line.split("\t") for line in (run_dir / "sweep.tsv").read_text().splitlines()[1:]]
    assert [row[:4] for row in rows] == [["strong", "1", "1", "1"], ["strong", "2", "1", "2"],
                                         ["strong", "4", "2", "2"]]
    return run_dir, [(int(count), int(nodes), Job(job_id, 0, run_dir / f"ddp_resnet50-strong-{count}-{job_id}.out",
                                                  out)) for _, count, nodes, _, job_id, _ in rows]


def test_strong_scaling_sweep_over_one_and_two_nodes_keeps_the_global_batch(sweep_points):
    run_dir, points = sweep_points
    batches = []
    for count, nodes, job in points:
        assert job.log, job.describe()  # the job log sits next to the results
        path, result = node_result(run_dir, job)
        assert path.name == f"ddp_resnet50-{nodes}n{count // nodes}cpu-job{job.id}.json"
        assert result["status"] == "ok" and result["world"]["world_size"] == count, job.describe()
        config = result["config"]
        batches.append((config["batch_mode"], config["global_batch_size"], config["batch_size_per_device"]))
        # SWEEP_PROBE=1: every point of more than one process probed its own link after its timed steps
        assert bool(result.get("collective_probe")) == (count > 1), job.describe()
    assert batches == [("global", 8, 8), ("global", 8, 4), ("global", 8, 2)]


def test_native_sbatch_runs_on_two_nodes(sweep_points):
    run_dir, points = sweep_points
    _, _, job = points[2]  # the two-node point
    path = run_dir / f"ddp_resnet50-2n2cpu-job{job.id}.json"
    result = assert_slurm_result(job, path, "ddp_resnet50.py", 4, steps=3, nodes=2)
    assert_two_nodes(job, result, per_node=2)
    assert manual_result_name(path), f"{path.name} fits no file-name pattern of slurm/README.md"
    # An option of the package, which the script imports only when one of its options is given.
    assert result["config"]["collective_probe"] is True
    assert job.closing_files() == [str(path)], job.describe()


def test_sweep_results_go_to_runs_not_to_committed_results(two_node_jobs, sweep_points):
    # Started from a directory of its own, without --output or BENCH_RESULTS_DIR.
    run_dir, points = sweep_points
    *_, workdir, before = two_node_jobs
    assert sorted(path.relative_to(workdir).as_posix() for path in workdir.rglob("*.json")) == sorted(
        f"runs/strong-sweep/ddp_resnet50-{nodes}n{count // nodes}cpu-job{job.id}.json" for count, nodes, job in points)
    assert committed_results_state() == before


def test_the_sweeps_report_prints_a_ceiling_for_each_probed_count(sweep_points):
    """The sweep -> report path of README's two commands: report.py on the run folder prints, for 2 and 4 processes,
    the measured efficiency, the ceiling at the link each point probed and the points lost below it."""
    run_dir, _ = sweep_points
    proc = subprocess.run([sys.executable, str(ROOT / "report.py"), str(run_dir)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {int(cells[2]): cells for cells in (line.split("|") for line in proc.stdout.splitlines())
            if len(cells) == 9 and cells[1].strip() == "strong"}
    assert sorted(rows) == [2, 4], proc.stdout
    for count, cells in rows.items():
        measured, ceiling, lost = (float(cells[i].strip(" %")) for i in (4, 5, 6))
        assert 0 < ceiling <= 100 and lost == pytest.approx(ceiling - measured, abs=0.11), cells
        assert f"probe (gloo, {count} ranks)" in cells[7], cells


def test_lightning_sbatch_runs_on_two_nodes(two_nodes, two_node_jobs):
    jobs, _, directory, _, _ = two_node_jobs
    job = ended(two_nodes, jobs["lightning"])
    path = directory / "lightning" / f"lightning_ddp_resnet50-2n1cpu-job{job.id}.json"
    result = assert_slurm_result(job, path, "lightning/ddp_resnet50.py", 2, steps=3, nodes=2)
    assert_two_nodes(job, result)
    assert "--devices 1 --num-nodes 2" in job.log  # from the job's shape
    assert job.closing_files() == [str(path)], job.describe()


def test_oss_sbatch_runs_each_strategy_on_two_nodes_in_one_job(two_nodes, two_node_jobs):
    jobs, _, directory, _, _ = two_node_jobs
    job = ended(two_nodes, jobs["oss"])
    paths = [directory / "oss" / f"oss_benchmark-ddp+zero1-2n1cpu-job{job.id}-{strategy}.json"
             for strategy in ("ddp", "zero1")]
    for strategy, path in zip(("ddp", "zero1"), paths):
        result = assert_slurm_result(job, path, "oss_benchmark.py", 2, steps=3, nodes=2)
        assert result["strategy"] == strategy
        assert_two_nodes(job, result)
        assert manual_result_name(path), f"{path.name} fits no file-name pattern of slurm/README.md"
    assert sorted(job.closing_files()) == [str(path) for path in paths], job.describe()
