"""Bad input: one line naming the broken rule, exit code 2, no traceback, nothing written."""
import re
import subprocess
import sys
import time

import pytest
import torch

from conftest import (LIGHTNING, NATIVE, ROOT, SMALL, clean_env, expect_usage_error, load_script, pretend_gpus,
                      run_script)

TWO_RANKS = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
SRUN = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NUM_NODES": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "7"}
FAKE_GPU = {"count": 1, "bf16": True}

CASES = {
    "conflicting batch options": (["--batch-size-per-device", "4", "--global-batch-size", "8"], {}, None,
                                  "not allowed with argument"),
    "missing batch value": (["--global-batch-size"], {}, None, "expected one argument"),
    "a batch size that is no number": (["--batch-size-per-device", "four"], {}, None, "invalid int value"),
    "zero batch": (["--batch-size-per-device", "0"], {}, None, "the batch sizes must be positive"),
    "negative steps": (["--steps", "-1"], {}, None, "--steps, --image-size and the batch sizes must be positive"),
    "zero warm-up": (["--warmup-steps", "0"], {}, None, "--warmup-steps, --steps"),
    "zero image size": (["--image-size", "0"], {}, None, "--image-size and the batch sizes must be positive"),
    "negative momentum": (["--momentum", "-0.5"], {}, None, "--momentum finite and not negative"),
    "NaN momentum": (["--momentum", "nan"], {}, None, "--momentum finite and not negative"),
    "infinite learning rate": (["--lr", "inf"], {}, None, "--lr must be positive"),
    "unknown precision": (["--precision", "fp8"], {}, None, "invalid choice"),
    "an unknown option": (["--no-such-option"], {}, None, "unrecognized arguments: --no-such-option"),
    "global batch not divisible": (["--global-batch-size", "3"], TWO_RANKS, None, "not divisible by the world size 2"),
    "cuda without CUDA": (["--device", "cuda"], {}, {"count": 0, "bf16": False}, "needs a CUDA GPU"),
    "bf16 on a GPU without it": (["--device", "cuda", "--precision", "bf16"], {}, {"count": 1, "bf16": False},
                                 "this GPU has no bf16"),
    "fp16 on the CPU": (["--precision", "fp16"], {}, None, "fp16 needs a GPU"),
    "more ranks than GPUs": (["--device", "cuda"], TWO_RANKS, FAKE_GPU, "2 ranks on this node but only 1 GPUs"),
    "contradicting Slurm variables": ([], {**SRUN, "SLURM_PROCID": "2"}, None, "inconsistent launcher variables"),
    "several srun nodes without MASTER_ADDR": ([], {**SRUN, "SLURM_STEP_NUM_NODES": "2", "SLURM_LOCALID": "0"}, None,
                                               "MASTER_ADDR is not set for several nodes"),
    "a Slurm variable missing": ([], {k: v for k, v in SRUN.items() if k != "SLURM_LOCALID"}, None,
                                 "SLURM_LOCALID is not set"),
    "RANK without WORLD_SIZE": ([], {"RANK": "1"}, None, "WORLD_SIZE is not set"),
    "a port out of range": ([], {**TWO_RANKS, "MASTER_PORT": "99999"}, None,
                            "MASTER_PORT='99999' is not an integer from 0 to 65535"),
    "one value per BatchNorm channel": (["--batch-size-per-device", "1", "--image-size", "32"], {}, None,
                                        "leaves BatchNorm one value per channel"),
    "a seed beyond 62 bits": (["--seed", str(2**64)], {}, None, "--seed must be from 0 to 2**62 - 1"),
    "a timeout beyond a week": (["--timeout", "100000000"], {}, None, "--timeout from 1 to 604800 seconds"),
    "cuDNN autotuning on the CPU": (["--cudnn-benchmark"], {}, None, "--cudnn-benchmark needs --device cuda"),
    "a bucket of no bytes": (["--bucket-cap-mb", "0"], {}, None, "--bucket-cap-mb must be above 0"),
    "a fixed loss scale that is no power of two": (["--device", "cuda", "--precision", "fp16", "--loss-scale", "1000"],
                                                   {}, FAKE_GPU, "--loss-scale must be dynamic or a power of two"),
    "a fixed loss scale without fp16": (["--loss-scale", "1024"], {}, None, "with --precision fp16"),
    "CUDA graphs on the CPU": (["--cuda-graphs"], {}, None, "--cuda-graphs needs --device cuda"),
    "CUDA graphs with the dynamic fp16 scale": (["--device", "cuda", "--precision", "fp16", "--cuda-graphs"], {},
                                                FAKE_GPU, "needs a fixed --loss-scale"),
    "CUDA graphs with DDP and few eager steps": (["--device", "cuda", "--cuda-graphs", "--warmup-steps", "5"],
                                                 TWO_RANKS, {"count": 2, "bf16": True}, "--warmup-steps >= 12"),
    "CUDA graphs inside a compile mode that captures": (["--device", "cuda", "--cuda-graphs", "--compile-mode",
                                                         "reduce-overhead"], {}, FAKE_GPU, "captures CUDA graphs"),
    "coordinate-descent tuning without compiling": (["--coordinate-descent-tuning"], {}, None, "needs --compile"),
    "a collective probe of one rank": (["--collective-probe"], {}, None, "--collective-probe needs several ranks"),
    "a compressing hook inside a CUDA graph": (["--device", "cuda", "--cuda-graphs", "--comm-hook", "bf16_compress"],
                                              {}, FAKE_GPU, "--comm-hook does not combine with --cuda-graphs"),
}


def cpu_args(argv):
    """SMALL, with the case's own options taking the place of the defaults they collide with."""
    base = list(SMALL)
    for flag in ("--device", "--batch-size-per-device", "--steps", "--warmup-steps", "--image-size"):
        if flag in argv or (flag == "--batch-size-per-device" and "--global-batch-size" in argv):
            index = base.index(flag)
            del base[index:index + 2]
    return base + argv


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_in_process(native, case, tmp_path, monkeypatch, capsys):
    argv, env, gpu, rule = CASES[case]
    output = tmp_path / "result.json"
    for name in list(TWO_RANKS) + list(SRUN) + ["TORCHELASTIC_RUN_ID"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if gpu is not None:
        pretend_gpus(monkeypatch, gpu["count"], gpu["bf16"])
    line = expect_usage_error(native, cpu_args(argv), rule, output, monkeypatch, capsys)
    assert "ddp_resnet50.py: error: " in line
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("case", ["conflicting batch options", "fp16 on the CPU", "contradicting Slurm variables"])
def test_bad_input_as_a_user_sees_it(case, tmp_path):
    argv, env, _, rule = CASES[case]
    output = tmp_path / "result.json"
    proc = run_script(NATIVE, [*cpu_args(argv), "--output", str(output)], env=clean_env(**env))
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and rule in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not output.exists()


def test_cuda_without_a_gpu_for_real(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the in-process test covers the rule")
    index = SMALL.index("--device")
    proc = run_script(NATIVE, [*SMALL[:index], *SMALL[index + 2:], "--output", str(tmp_path / "r.json")])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "--device cuda needs a CUDA GPU" in lines[0], proc.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.fixture(scope="module")
def twin():
    return load_script(LIGHTNING, "lightning_twin_bad_input")


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_the_twins_devices_must_match_its_launchers_layout(twin, launcher, tmp_path, monkeypatch, capsys):
    """torchrun --nproc-per-node 2 or srun's 2 tasks with --devices 1: one line, exit 2, before Lightning starts
    (which would end each rank with its own error, exit 1)."""
    env = {**TWO_RANKS, "TORCHELASTIC_RUN_ID": "x"} if launcher == "torchrun" else SRUN
    for name in list(TWO_RANKS) + list(SRUN) + ["TORCHELASTIC_RUN_ID", "NODE_RANK", "SLURM_JOB_NAME"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    expect_usage_error(twin, [*SMALL, "--devices", "1"], "--devices 2 --num-nodes 1", tmp_path / "r.json",
                       monkeypatch, capsys)


def test_bad_input_on_one_rank_ends_the_torchrun_job_with_1_and_that_ranks_line(tmp_path):
    """Rank 1 alone gets a learning rate it refuses (exit 2): torchrun's agent ends rank 0, which waits at the
    meeting, at once (not after --timeout) and exits 1; its summary names rank 1 with exit code 2, and the log has
    that rank's one line. Nothing is written."""
    output = tmp_path / "r.json"
    rank_command = (f"exec {sys.executable} {NATIVE} {' '.join(SMALL)} --output {output} "
                    '$([ "$RANK" = 1 ] && echo --lr -1)')
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "--no-python", "bash", "-c", rank_command], capture_output=True, text=True,
                          env=clean_env(), cwd=ROOT, timeout=240)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("ddp_resnet50.py: error: ")]
    assert proc.returncode == 1 and len(lines) == 1 and time.monotonic() - started < 120, proc.stderr[-3000:]
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)\s+exitcode\s*: 2\b", proc.stderr), proc.stderr[-3000:]
    assert not output.exists()
