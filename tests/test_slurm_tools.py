"""The tools around the Slurm batch scripts: slurm/compare.sbatch's documented commands, run as written on a real
one-node Slurm (tests/slurm_cluster.py); slurm/scaling_sweep.sh's run folder when nothing is submitted (sbatch
replaced by a stand-in); collective_probe.py's rendezvous without a master and its output file."""
import json
import os
import pathlib
import re
import shlex
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
