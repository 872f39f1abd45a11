"""Helpers for running the real benchmark scripts on the CPU (gloo, 32 px, tiny batches)."""
import importlib.util
import json
import os
import pathlib
import socket
import subprocess
import sys
from unittest import mock

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NATIVE = ROOT / "ddp_resnet50.py"
LIGHTNING = ROOT / "lightning" / "ddp_resnet50.py"
OSS = ROOT / "oss_benchmark.py"
SCHEMA = json.loads((ROOT / "schema" / "result.schema.json").read_text())
# Small enough for 2 CPU cores: every test still runs the whole script end to end.
SMALL = ["--device", "cpu", "--image-size", "32", "--batch-size-per-device", "4", "--warmup-steps", "2",
         "--steps", "4", "--lr", "0.01"]


def load_script(path, name=None):
    """Import a single-file script as a module (for its pure functions)."""
    spec = importlib.util.spec_from_file_location(name or path.stem + "_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(**extra):
    """The environment of a fresh shell: no launcher or Slurm variables leaking in from outside."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "TORCHELASTIC_", "PET_")) and k not in
           {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"}}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **extra)
    return env


def run_script(script, args, nproc=1, nnodes=1, timeout=300, env=None, cwd=None):
    """Run a script as a user would: plain python for one process, torchrun --standalone for several."""
    if nproc > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                   str(script), *args]
    else:
        command = [sys.executable, str(script), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env or clean_env(),
                          cwd=cwd or ROOT)


def validate(result):
    import jsonschema
    jsonschema.validate(result, SCHEMA)
    return result


def read_result(path):
    return validate(json.loads(pathlib.Path(path).read_text()))


def pretend_gpus(monkeypatch, count, bf16=True):
    """Make the scripts see `count` GPUs (or none): nothing reaches a GPU before the argument checks."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)


def expect_usage_error(script, argv, rule, output, monkeypatch, capsys):
    """Run a loaded script's main as the command line would, in this process: exit code 2, one line naming
    the rule, no file. Returns that line."""
    monkeypatch.setattr(sys, "argv", [script.SCRIPT, *argv, "--output", str(output)])
    with pytest.raises(SystemExit) as exit_info:
        script.run_guarded(script.main, script.SCRIPT)
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and rule in lines[0], lines
    assert not output.exists()
    return lines[0]


def resolve_config(script, argv, env=None, cuda=True, count=8, bf16=True):
    """A loaded script's config for a command line, as main() resolves it before any GPU work, and the verdict
    on --output (a refusal raises UsageError, as the run would end)."""
    args = script.parse_arguments(list(argv))
    launch = script.detect_launch(env or {})
    with mock.patch.dict(os.environ):  # --cuda-graphs sets an NCCL variable for the run: not for the tests
        config = script.resolve_harness_config(args, launch, script.SCRIPT, "ddp", cuda, count, bf16)
    refusal = script.output_refusal(config)
    if refusal:
        raise script.UsageError(refusal)
    return config


def one_error_line(stderr):
    """The non-empty lines a failing run printed: bad input must give exactly one, and no traceback."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    return lines


@pytest.fixture(scope="session")
def native():
    return load_script(NATIVE, "ddp_resnet50_under_test")


@pytest.fixture(scope="session")
def native_two_rank(tmp_path_factory):
    """One 2-process torchrun run of the native script, shared by the tests that read its result; the collectives
    probed after its timed steps (which they do not change)."""
    output = tmp_path_factory.mktemp("native") / "result.json"
    proc = run_script(NATIVE, [*SMALL, "--collective-probe", "--output", str(output)], nproc=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, read_result(output)


def launch_env(script, rank, world_size, port):
    """What a launcher gives each rank: torchrun-style variables for the native and sharding scripts;
    Lightning's own style (LOCAL_RANK, NODE_RANK, WORLD_SIZE) for the Lightning twin."""
    common = dict(WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if script == LIGHTNING:
        return clean_env(NODE_RANK="0", **common)
    return clean_env(RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size), **common)


def finish(procs, limit_s=90):
    """(exit code, stdout, stderr) of each process; none is left running, even when one overruns the limit."""
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=limit_s)
            outputs.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outputs


def launch_by_hand(script, args, world_size=2, timeout=60, rank_args=None, env=None):
    """Start the ranks as a launcher would, but with no agent in between, so that each rank's own output and exit
    code are seen. rank_args: {rank: further arguments of that rank only}, e.g. another --lr desynchronises the
    replicas."""
    port = free_port()
    extra = ["--devices", str(world_size)] if script == LIGHTNING else []
    return [subprocess.Popen([sys.executable, str(script), *args, *extra, "--timeout", str(timeout),
                              *(rank_args or {}).get(rank, [])],
                             env={**launch_env(script, rank, world_size, port), **(env or {})},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
            for rank in range(world_size)]
