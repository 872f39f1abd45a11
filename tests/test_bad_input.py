"""Bad input: one line naming the broken rule, exit code 2, no traceback, nothing written."""
import pytest
import torch

from conftest import NATIVE, SMALL, clean_env, expect_usage_error, pretend_gpus, run_script

TWO_RANKS = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
SRUN = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "7",
        "SLURM_STEP_NODELIST": "localhost"}
FAKE_GPU = {"count": 1, "bf16": True}

CASES = {
    "conflicting batch options": (["--batch-size-per-device", "4", "--global-batch-size", "8"], {}, None,
                                  "not allowed with argument"),
    "missing batch value": (["--global-batch-size"], {}, None, "expected one argument"),
    "zero batch": (["--batch-size-per-device", "0"], {}, None, "must be a positive integer"),
    "negative steps": (["--steps", "-1"], {}, None, "must be a positive integer"),
    "zero warm-up": (["--warmup-steps", "0"], {}, None, "must be a positive integer"),
    "zero image size": (["--image-size", "0"], {}, None, "must be a positive integer"),
    "negative momentum": (["--momentum", "-0.5"], {}, None, "must be a finite number >= 0"),
    "NaN momentum": (["--momentum", "nan"], {}, None, "must be a finite number >= 0"),
    "infinite learning rate": (["--lr", "inf"], {}, None, "must be a positive finite number"),
    "unknown precision": (["--precision", "fp8"], {}, None, "invalid choice"),
    "global batch not divisible": (["--global-batch-size", "3"], TWO_RANKS, None, "not divisible by the world size 2"),
    "cuda without CUDA": (["--device", "cuda"], {}, {"count": 0, "bf16": False}, "needs a CUDA GPU"),
    "bf16 on a GPU without it": (["--device", "cuda", "--precision", "bf16"], {}, {"count": 1, "bf16": False},
                                 "bf16 is not supported"),
    "fp16 on the CPU": (["--precision", "fp16"], {}, None, "fp16 needs a GPU"),
    "more ranks than GPUs": (["--device", "cuda"], TWO_RANKS, FAKE_GPU, "2 ranks on this node but only 1 GPUs"),
    "contradicting Slurm variables": ([], {**SRUN, "SLURM_PROCID": "2"}, None, "Slurm variables disagree"),
    "Slurm tasks beyond the GPUs": (["--device", "cuda"], {**SRUN, "SLURM_GPUS_ON_NODE": "1"}, FAKE_GPU,
                                    "only 1 GPUs allocated"),
    "a Slurm variable missing": ([], {k: v for k, v in SRUN.items() if k != "SLURM_LOCALID"}, None,
                                 "SLURM_LOCALID is not set"),
    "RANK without WORLD_SIZE": ([], {"RANK": "1"}, None, "RANK is set without WORLD_SIZE"),
    "a port out of range": ([], {**TWO_RANKS, "MASTER_PORT": "99999"}, None, "MASTER_PORT=99999 is not a port"),
    "one value per BatchNorm channel": (["--batch-size-per-device", "1", "--image-size", "32"], {}, None,
                                        "leaves BatchNorm one value per channel"),
    "a seed beyond 64 bits": (["--seed", str(2**64)], {}, None, "argument --seed: must be an integer from 0"),
    "cuDNN autotuning on the CPU": (["--cudnn-benchmark"], {}, None, "--cudnn-benchmark needs --device cuda"),
    "a cuDNN autotuning limit on the CPU": (["--cudnn-benchmark-limit", "0"], {}, None,
                                            "--cudnn-benchmark-limit needs cuDNN's autotuning"),
    "a cuDNN autotuning limit without autotuning": (["--device", "cuda", "--no-cudnn-benchmark",
                                                     "--cudnn-benchmark-limit", "4"], {}, FAKE_GPU,
                                                    "--cudnn-benchmark-limit needs cuDNN's autotuning"),
    "a negative cuDNN autotuning limit": (["--cudnn-benchmark-limit", "-1"], {}, None,
                                          "argument --cudnn-benchmark-limit: must be zero or a positive integer"),
    "fewer than three epochs": (["--steps-per-epoch", "3", "--steps", "8"], {}, None,
                                "--steps-per-epoch 3 needs --steps >= 9 (got 8)"),
    "a timeout beyond a week": (["--timeout", "100000000"], {}, None, "argument --timeout: must be at most 604800"),
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
    assert proc.returncode == 2 and "--device cuda needs a CUDA GPU" in proc.stderr


def test_unwritable_output_directory(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = run_script(NATIVE, [*SMALL, "--output", str(blocker / "sub" / "r.json")])
    assert proc.returncode == 2 and "cannot be written" in proc.stderr and "Traceback" not in proc.stderr
