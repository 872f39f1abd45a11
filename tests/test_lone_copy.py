"""Each script copied alone into an empty folder, on a machine where the repository's package cannot be imported (a
folder on PYTHONPATH whose resnet50_ddp_benchmarks raises ModuleNotFoundError, as a missing package would): it runs
README's "Options people change" and every DDP option, its --help shows them and names the package's options in one
line, and a package option exits 2 with one line. CPU, gloo, 32 px, tiny batches, 2 processes."""
import re
import shutil
import subprocess
import sys

import pytest

from conftest import LIGHTNING, NATIVE, OSS, clean_env, read_result, run_script

# torch.compile's path through the copy, without compiling (30 s and more a process on 2 cores): Dynamo, disabled,
# runs the model eagerly. Compiling for real: tests/test_speed_options.py.
NO_DYNAMO = {"TORCHDYNAMO_DISABLE": "1"}
TINY = ["--device", "cpu", "--image-size", "32", "--warmup-steps", "2", "--steps", "3", "--lr", "0.01"]
DDP = ["--bucket-cap-mb", "10", "--no-broadcast-buffers", "--static-graph", "--no-gradient-as-bucket-view",
       "--no-cudnn-benchmark"]
TABLE = ["--batch-size-per-device", "--global-batch-size", "--warmup-steps", "--steps", "--precision", "--compile",
         "--bucket-cap-mb", "--broadcast-buffers", "--no-broadcast-buffers", "--static-graph",
         "--gradient-as-bucket-view", "--no-gradient-as-bucket-view", "--cudnn-benchmark", "--output", "--overwrite",
         "--timeout"]
OWN = {NATIVE: [], LIGHTNING: ["--lightning-matched", "--devices"], OSS: ["--strategy", "--optimizer"]}
PACKAGE = ["--cuda-graphs", "--loss-scale", "--compile-mode", "--coordinate-descent-tuning", "--space-to-depth-stem",
           "--dense-max-pool-backward", "--sums-batch-norm", "--fused-batch-norm", "--comm-hook", "--collective-probe"]


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """{script: its copy, alone in a folder of its own}, and the environment without the package."""
    root = tmp_path_factory.mktemp("alone")
    (root / "no-package" / "resnet50_ddp_benchmarks").mkdir(parents=True)
    (root / "no-package" / "resnet50_ddp_benchmarks" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'resnet50_ddp_benchmarks'\", name='resnet50_ddp_benchmarks')\n")
    copies = {}
    for script, folder in ((NATIVE, "native"), (LIGHTNING, "twin"), (OSS, "oss")):
        (root / folder).mkdir()
        copies[script] = shutil.copy(script, root / folder / script.name)
    return copies, clean_env(PYTHONPATH=str(root / "no-package"), **NO_DYNAMO)


def run_alone(alone, script, args, nproc=1):
    copies, env = alone
    copy = copies[script]
    return run_script(copy, args, nproc=nproc, env=env, cwd=copy.parent, timeout=400)


def test_native_runs_the_options_table_and_every_ddp_option(alone, tmp_path):
    """Strong scaling over 2 ranks, bf16, compiled (Dynamo disabled: see NO_DYNAMO), every DDP option off its
    default; then one rank, weak scaling, replacing that result with --overwrite."""
    output = tmp_path / "native.json"
    proc = run_alone(alone, NATIVE, [*TINY, "--global-batch-size", "6", "--precision", "bf16", "--compile", *DDP,
                                     "--timeout", "60", "--output", str(output)], nproc=2)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = read_result(output)
    config = result["config"]
    assert (config["batch_mode"], config["batch_size_per_device"], config["global_batch_size"]) == ("global", 3, 6)
    assert (config["precision"], config["compile"], config["timeout_s"], config["steps"]) == ("bf16", True, 60, 3)
    assert (config["bucket_cap_mb"], config["broadcast_buffers"], config["static_graph"],
            config["gradient_as_bucket_view"], config["cudnn_benchmark"]) == (10.0, False, True, False, False)
    assert result["status"] == "ok" and result["checks"]["parameters_synchronized"] is True
    assert result["world"]["world_size"] == 2 and result["throughput"]["timed_steps"] == 3
    proc = run_alone(alone, NATIVE, [*TINY, "--batch-size-per-device", "2", "--steps", "1", "--output", str(output),
                                     "--overwrite"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    config = read_result(output)["config"]
    assert (config["batch_mode"], config["global_batch_size"], config["precision"]) == ("per_device", 2, "fp32")


def test_the_twin_runs_the_options_table_and_every_ddp_option(alone, tmp_path):
    """Lightning's own launcher starts the copy's 2 processes: matched, strong scaling, bf16, compiled (Dynamo
    disabled), every DDP option off its default."""
    output = tmp_path / "twin.json"
    proc = run_alone(alone, LIGHTNING, [*TINY, "--devices", "2", "--lightning-matched", "--global-batch-size", "6",
                                        "--precision", "bf16", "--compile", *DDP, "--timeout", "60", "--output",
                                        str(output)])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = read_result(output)
    config = result["config"]
    assert (config["lightning_variant"], config["global_batch_size"], config["trainer_precision"],
            config["compile"]) == ("matched", 6, "bf16-mixed", True)
    assert (config["bucket_cap_mb"], config["broadcast_buffers"], config["static_graph"],
            config["gradient_as_bucket_view"], config["cudnn_benchmark"]) == (10.0, False, True, False, False)
    assert result["status"] == "ok" and result["checks"]["parameters_synchronized"] is True


def test_the_sharding_script_runs_the_options_table_and_every_ddp_option(alone, tmp_path):
    """Two strategies with Adam over 2 ranks, strong scaling, bf16, every DDP option off its default."""
    output = tmp_path / "oss.json"
    proc = run_alone(alone, OSS, [*TINY, "--strategy", "ddp,zero1", "--optimizer", "adam", "--model", "resnet18",
                                  "--global-batch-size", "4", "--precision", "bf16", *DDP, "--phase-steps", "0",
                                  "--profile-steps", "0", "--timeout", "60", "--output", str(output)], nproc=2)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for strategy in ("ddp", "zero1"):
        result = read_result(tmp_path / f"oss-{strategy}.json")
        config = result["config"]
        assert (config["optimizer"], config["global_batch_size"], config["precision"]) == ("adam", 4, "bf16")
        assert (config["bucket_cap_mb"], config["broadcast_buffers"], config["static_graph"],
                config["gradient_as_bucket_view"], config["cudnn_benchmark"]) == (10.0, False, True, False, False)
        assert result["status"] == "ok" and result["checks"]["parameters_synchronized"] is True


EACH = """import runpy, sys
for line in sys.argv[1:]:
    sys.argv, code = line.split(" "), 0
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as done:
        code = done.code or 0
    print(f"== exit {code}", flush=True)
    print("== exit", file=sys.stderr, flush=True)
"""


def test_help_shows_the_options_and_names_the_packages_in_one_line_which_exit_2_alone(alone, tmp_path):
    """--help of each copy, then each package option given to the native copy and the twin's: exit 2, one line
    naming the option, nothing written. In one process (torch imported once), each script run as __main__."""
    copies, env = alone
    output = tmp_path / "never.json"
    commands = [f"{copies[script]} --help" for script in (NATIVE, LIGHTNING, OSS)]
    commands += [f"{copies[script]} --device cpu {option} --output {output}" for script in (NATIVE, LIGHTNING)
                 for option in PACKAGE]
    done = subprocess.run([sys.executable, "-c", EACH, *commands], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)
    runs, errs = re.findall(r"(.*?)== exit (\d+)\n", done.stdout, re.DOTALL), done.stderr.split("== exit\n")[:-1]
    assert len(runs) == len(errs) == len(commands), done.stdout[-2000:] + done.stderr[-2000:]
    for script, (text, code) in zip((NATIVE, LIGHTNING, OSS), runs):
        flags = {word.strip(",[]") for word in text.split() if word.startswith(("--", "[--"))}
        assert code == "0" and set(TABLE + OWN[script]) <= flags, (script.name, set(TABLE + OWN[script]) - flags)
        naming = [line for line in text.splitlines() if all(option in line for option in PACKAGE)]
        assert len(naming) == (script != OSS), naming  # nothing of the sharding script's needs the package
        offered = [line for line in text.splitlines() if line.startswith(tuple(f"  {o}" for o in PACKAGE))]
        assert not offered, offered
    for command, (_, code), err in zip(commands[3:], runs[3:], errs[3:]):
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == "2" and len(lines) == 1 and "Traceback" not in err, (command, code, err)
        assert command.split()[3] in lines[0], (command, lines)  # it names the option
    assert not output.exists()
