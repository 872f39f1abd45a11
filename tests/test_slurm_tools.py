"""The tools around the Slurm batch scripts: slurm/compare.sbatch's documented commands, run as written on a real
one-node Slurm (tests/slurm_cluster.py); slurm/scaling_sweep.sh's run folder when nothing is submitted (sbatch
replaced by a stand-in); collective_probe.py's rendezvous without a master and its output file."""
import json
import os
import pathlib
import re
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from conftest import ROOT, clean_env
from slurm_cluster import SlurmCluster
from slurm_jobs import start_cluster, submit

MANUAL = ROOT / "slurm" / "README.md"
COMPARE_SBATCH = "slurm/compare.sbatch"
ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# The smallest run of a benchmark: what the GPU commands run with on this host, which has no GPU.
TINY = ["--device", "cpu", "--image-size", "32", "--batch-size-per-device", "2", "--warmup-steps", "1", "--steps", "2"]


def logical_lines(lines):
    """Lines with their backslash continuations joined."""
    joined, current = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
        else:
            joined.append(current + line)
            current = ""
    return joined


def manual_compare_commands():
    """Every compare.sbatch command in slurm/README.md's bash blocks, as words."""
    blocks = re.findall(r"^```bash\n(.*?)^```", MANUAL.read_text(), flags=re.MULTILINE | re.DOTALL)
    return [shlex.split(line, comments=True) for block in blocks for line in logical_lines(block.splitlines())
            if COMPARE_SBATCH in line]


def header_compare_commands():
    """The commands of compare.sbatch's own header (its `#   ...` example lines), as words."""
    header = (ROOT / COMPARE_SBATCH).read_text().split("\n#SBATCH", 1)[0]
    lines = [line[1:].strip() for line in header.splitlines() if line.startswith("#   ")]
    return [shlex.split(line, comments=True) for line in logical_lines(lines) if COMPARE_SBATCH in line]


def test_compare_sbatch_header_shows_the_manuals_commands():
    # The test below runs the manual's commands; the script's header must not show others.
    manual, header = manual_compare_commands(), header_compare_commands()
    assert header and all(command in manual for command in header), (header, manual)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(lambda: SlurmCluster(tmp_path_factory.mktemp("slurm-tools")))
    yield cluster
    cluster.stop()


def gpu_free_python(directory):
    """`python` for the GPU commands on this host: each benchmark on the CPU at the smallest size (these options
    come last, so they win), torch.compile off (it compiles ResNet-50 for minutes on a CPU); anything else, such as
    compare.py, as it is."""
    bin_dir = directory / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.write_text(f"""#!/bin/bash
case "${{1:-}}" in
  ddp_resnet50.py | lightning/ddp_resnet50.py | oss_benchmark.py)
    TORCH_COMPILE_DISABLE=1 exec {shlex.quote(sys.executable)} "$@" {shlex.join(TINY)} ;;
esac
exec {shlex.quote(sys.executable)} "$@"
""")
    python.chmod(0o755)
    return str(python)


@pytest.mark.parametrize("words", manual_compare_commands(), ids=lambda words: shlex.join(words)[:60])
def test_documented_compare_sbatch_command_runs_as_written(cluster, tmp_path, words):
    # The manual's command with its environment, sbatch options and compare.py arguments as written, from the
    # repository root; two pairs instead of the command's (--rounds given last wins). The test node has two
    # name-only GPUs, so a GPU command's job passes its checks as on a GPU node, and its benchmarks run on the CPU
    # through gpu_free_python(); a CPU command runs with the venv's python as it is.
    settings = {}
    while ENV_WORD.match(words[0]):
        name, value = words[0].split("=", 1)
        settings[name] = value
        words = words[1:]
    assert words[0] == "sbatch" and COMPARE_SBATCH in words, words
    at = words.index(COMPARE_SBATCH)
    options, args = words[1:at], words[at + 1:]
    if settings.get("BENCH_DEVICE") != "cpu":
        settings["BENCH_PYTHON"] = gpu_free_python(tmp_path)
    job = submit(cluster, tmp_path, COMPARE_SBATCH, options, [*args, "--rounds", "2"], timeout=600, **settings)
    path = tmp_path / "compare" / f"compare-job{job.id}.json"
    assert job.returncode == 0, job.describe()
    assert f"== compare.py exit status 0; result file(s): {path}" in job.log.splitlines(), job.describe()
    comparison = json.loads(path.read_text())
    assert comparison["status"] == "ok" and len(comparison["pairs"]) == 2, job.describe()



@pytest.mark.parametrize("settings,args,expected", [
    ({"BENCH_RUN_NAME": ".."}, [], "compare: error: BENCH_RUN_NAME '..' cannot name the run folder"),
    ({}, ["--rounds", "1"], "compare.py: error: --rounds 1: an interval needs at least 2 pairs"),
])
def test_compare_sbatch_refuses_bad_input_before_making_a_folder(cluster, tmp_path, settings, args, expected):
    # A run folder that would leave the results folder, and arguments compare.py refuses: exit 2 with the line that
    # says why, no round run, no folder made (the comparison would go to tmp_path/compare/).
    job = submit(cluster, tmp_path, COMPARE_SBATCH, ["--gpus-per-node=0"], args, timeout=60, BENCH_DEVICE="cpu",
                 COMPARE_A="python -c pass", COMPARE_B="python -c pass", **settings)
    assert job.returncode == 2, job.describe()
    errors = [line for line in job.log.splitlines() if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith(expected), job.describe()
    assert not [path for path in tmp_path.rglob("*") if path.is_dir()], job.describe()  # the job log only


# ------------------------------------------------------------------------------ the sweep that submits nothing

def failing_sbatch(directory, body='echo "sbatch: error: Batch job submission failed: Invalid partition name '
                                   'specified" >&2\nexit 1'):
    """A PATH folder whose `sbatch` refuses every job (or does what body says)."""
    bin_dir = directory / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/bash\n{body}\n")
    (bin_dir / "sbatch").chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def sweep_from(workdir, path, *args, **settings):
    return subprocess.run([str(ROOT / "slurm" / "scaling_sweep.sh"), *args], capture_output=True, text=True,
                          timeout=60, cwd=workdir, env=clean_env(PATH=path, SWEEP_GPUS="1 2", **settings))


def everything_under(folder):
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*"))


@pytest.mark.parametrize("results_dir", [None, "deep/er/results"])
def test_a_sweep_that_submits_nothing_leaves_no_folder(tmp_path, results_dir):
    # The default runs/ of the directory the sweep is called from, and a results folder several levels down: each
    # folder the sweep made for its jobs goes again when sbatch refuses the first one.
    workdir = tmp_path / "work"
    workdir.mkdir()
    settings = {"BENCH_RESULTS_DIR": results_dir} if results_dir else {}
    proc = sweep_from(workdir, failing_sbatch(tmp_path), "weak", **settings)
    assert proc.returncode == 1 and "nothing was submitted" in proc.stderr, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert everything_under(workdir) == [], proc.stdout + proc.stderr


def test_a_sweep_that_submits_nothing_keeps_the_folders_it_found(tmp_path):
    workdir = tmp_path / "work"
    (workdir / "runs" / "mine").mkdir(parents=True)  # there before: not the sweep's to remove
    proc = sweep_from(workdir, failing_sbatch(tmp_path), "weak", BENCH_RUN_NAME="mine")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert everything_under(workdir) == ["runs", "runs/mine"]


def test_a_sweep_stopped_before_its_first_job_leaves_no_folder(tmp_path):
    # Ctrl-C or a closed terminal while sbatch still waits for the controller.
    workdir = tmp_path / "work"
    workdir.mkdir()
    ready = tmp_path / "sbatch-started"
    path = failing_sbatch(tmp_path, f"touch {shlex.quote(str(ready))}\nsleep 60")
    proc = subprocess.Popen([str(ROOT / "slurm" / "scaling_sweep.sh"), "weak"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=workdir,
                            env=clean_env(PATH=path, SWEEP_GPUS="1 2"), start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists() and (workdir / "runs").is_dir()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert everything_under(workdir) == []


@pytest.mark.parametrize("settings,expected", [
    ({"BENCH_DEVICE": "gpu"}, "BENCH_DEVICE=gpu: use cuda or cpu"),
    ({"BENCH_GPU_REQUEST": "gpus"}, "BENCH_GPU_REQUEST=gpus: use gpus-per-node or gres"),
    ({"SWEEP_WAIT": "yes"}, "SWEEP_WAIT=yes: use 1"),
    ({"BENCH_DEVICE": "cpu", "BENCH_CPUS_PER_TASK": "0"}, "BENCH_CPUS_PER_TASK=0 is not a positive integer"),
])
def test_a_sweep_refuses_bad_settings_before_making_anything(tmp_path, settings, expected):
    workdir = tmp_path / "work"
    workdir.mkdir()
    submitted = tmp_path / "submitted"
    proc = sweep_from(workdir, failing_sbatch(tmp_path, f"touch {shlex.quote(str(submitted))}\necho 1"), "weak",
                      **settings)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and f"scaling_sweep.sh: error: {expected}" in proc.stderr, proc.stderr
    assert not submitted.exists() and everything_under(workdir) == []


def test_a_sweep_that_cannot_make_its_folder_says_so_in_one_line(tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "taken").write_text("a file where the results folder would go\n")
    proc = sweep_from(workdir, failing_sbatch(tmp_path), "weak", BENCH_RESULTS_DIR="taken/results")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "cannot make the run folder" in proc.stderr, proc.stderr
    assert everything_under(workdir) == ["taken"]


# ------------------------------------------------------------------------------ collective_probe.py

# The probe, run by its path as the documents say
PROBE = ROOT / "resnet50_ddp_benchmarks" / "collective_probe.py"
TINY_PROBE = ["--device", "cpu", "--sizes", "1K,4K", "--repeats", "1", "--warmup", "0"]


def unused_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again: nothing listens there


def run_probe(args, umask=0o022, **launcher):
    began = time.monotonic()
    proc = subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=clean_env(**launcher), preexec_fn=lambda: os.umask(umask))
    return proc, time.monotonic() - began


@pytest.mark.parametrize("rank,expected", [
    ("1", "collective_probe.py: error: rank 1: no answer from the master (rank 0) at 127.0.0.1:{port} in "),
    ("0", "collective_probe.py: error: rank 0: the 2 ranks did not all meet at 127.0.0.1:{port} in "),
])
def test_a_probe_whose_ranks_never_meet_says_so_in_one_line(rank, expected):
    # Rank 1 whose master never answers (nothing listens at its port), and a master whose other rank never comes:
    # one line naming the cause, exit 1, within a few --timeout (torch's client tries twice), no C++ stack.
    port = unused_port()
    proc, took = run_probe([*TINY_PROBE, "--timeout", "2"], RANK=rank, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(expected.format(port=port)), proc.stderr
    assert proc.stdout == "" and took < 60, (took, proc.stdout)


def test_the_probe_file_has_the_umasks_mode(tmp_path):
    for umask, mode in ((0o022, 0o644), (0o027, 0o640)):
        output = tmp_path / f"probe-{umask:o}.json"
        proc, _ = run_probe([*TINY_PROBE, "--output", str(output)], umask=umask)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert stat.S_IMODE(output.stat().st_mode) == mode and json.loads(output.read_text())["world_size"] == 1
    assert sorted(path.name for path in tmp_path.iterdir()) == ["probe-22.json", "probe-27.json"]  # no temporary


def test_the_probe_file_replaces_nothing_that_appeared_meanwhile(tmp_path):
    # Between check_output() before the probe and the write after it another run wrote the file: it stays, in
    # one line and exit 1; with --overwrite it is replaced, whole, with the umask's mode.
    from conftest import load_script
    probe = load_script(PROBE, "collective_probe_writer_under_test")
    output = tmp_path / "probe.json"
    output.write_text("another run's\n")
    with pytest.raises(probe.ProbeError, match="appeared while the probe ran"):
        probe.write_json_atomically(str(output), {"schema": "new"}, overwrite=False)
    assert output.read_text() == "another run's\n"
    umask = os.umask(0o002)
    try:
        probe.write_json_atomically(str(output), {"schema": "new"}, overwrite=True)
    finally:
        os.umask(umask)
    assert json.loads(output.read_text()) == {"schema": "new"} and stat.S_IMODE(output.stat().st_mode) == 0o664
    assert [path.name for path in tmp_path.iterdir()] == ["probe.json"]


def test_the_probe_imports_no_analysis_code():
    # Measurement code stands alone: scaling_model.py (analysis) may change without touching the probe.
    assert not re.search(r"^\s*(from|import)\s+scaling_model\b", PROBE.read_text(), flags=re.MULTILINE)
