"""experiments/: the probes behind findings in docs/ run on the CPU, check what their READMEs claim of them, and
refuse bad input in one line."""
import json
import re
import subprocess
import sys
import types

import pytest

from conftest import ROOT, clean_env, load_script, pretend_gpus, run_script

EXPERIMENTS = ROOT / "experiments"
STEM, BATCHNORM = EXPERIMENTS / "stem" / "stem_probe.py", EXPERIMENTS / "batchnorm" / "bn_probe.py"
PROFILE = EXPERIMENTS / "step-profile" / "probe.py"
INTERLEAVED = EXPERIMENTS / "lightning-interleaved"
POOL, HOOK_PROFILE = INTERLEAVED / "pool.py", INTERLEAVED / "hook_profile.py"
INTERLEAVE = INTERLEAVED / "interleave.py"


def test_the_stem_replacements_give_the_modules_results():
    """experiments/stem/README.md: the space-to-depth convolution and the dense max pool give the module's output and
    gradient (ties included, both memory layouts, odd sizes), on the CPU in float64."""
    probe = load_script(STEM, "stem_probe_under_test")
    probe.check()  # asserts equal outputs and gradients
    import torch
    images = torch.tensor([[[[1.0, 5.0, 5.0], [0.0, 2.0, 5.0], [3.0, 1.0, 4.0]]]], requires_grad=True)
    probe.extras.DenseMaxPool()(images).sum().backward()
    # a 2x2 output over a 3x3 input (3x3 windows, stride 2, padding 1): the top windows both pick the first 5 in scan
    # order, (0, 1), although the top-right window holds three 5s; the bottom ones pick 3 and the 5 at (1, 2)
    assert images.grad.tolist() == [[[[0.0, 2.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]]]


def test_the_sums_batch_norm_is_pytorchs():
    """experiments/batchnorm/README.md: output, gradients and running statistics are PyTorch's (float64, eager and
    compiled, both layouts); in float32 at a mean of 1000 the shifted sums keep their digits."""
    probe = load_script(BATCHNORM, "bn_probe_under_test")
    probe.check()  # raises SystemExit on any difference
    import torch
    with pytest.raises(ValueError, match="replaces BatchNorm2d with affine parameters"):
        probe.extras.SumsBatchNorm2d.replacing(torch.nn.BatchNorm2d(4, affine=False))


@pytest.mark.parametrize("script,argv,rule", [
    (STEM, ["--batch", "0"], "argument --batch: must be a positive integer, got 0"),
    (STEM, ["--maxpool", "scatter"], "argument --maxpool: invalid choice"),
    (STEM, [], "times the stem on a CUDA GPU and none is visible (--check runs on the CPU)"),
    (BATCHNORM, ["--iterations", "-3"], "argument --iterations: must be a positive integer, got -3"),
    (BATCHNORM, ["--json", "{file}/out.json"], "--json directory {file} cannot be written"),
])
def test_the_timing_probes_refuse_bad_input_before_measuring(script, argv, rule, tmp_path, monkeypatch):
    pretend_gpus(monkeypatch, count=0)  # the same on a machine with a GPU
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    probe = load_script(script)
    with pytest.raises(probe.common.UsageError, match=re.escape(rule.format(file=a_file))):
        probe.main([arg.format(file=a_file) for arg in argv])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a-file"]


def test_bad_input_is_one_line_and_exit_2_on_the_command_line(tmp_path):
    proc = run_script(STEM, ["--batch", "0", "--json", str(tmp_path / "out.json")])
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == "stem_probe.py: error: argument --batch: must be a positive integer, got 0\n"


def test_iterations_are_timed_one_by_one(monkeypatch):
    """probe_common.time_iterations on the CPU times each iteration with the host clock (here a fake one that the
    iterations advance by 20, 40 and 60 ms)."""
    common = load_script(EXPERIMENTS / "probe_common.py", "probe_common_under_test")
    import torch
    clock, calls = [100.0], []
    monkeypatch.setattr(common, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def iteration():
        calls.append(1)
        clock[0] += 0.02 * len(calls)

    stats = common.time_iterations(iteration, 3, torch.device("cpu"))
    assert len(calls) == stats["count"] == 3
    assert (stats["min"], stats["median"], stats["max"]) == pytest.approx((20, 40, 60))


def test_the_step_profile_builds_the_scripts_step_and_summarises_it(tmp_path):
    """experiments/step-profile/probe.py on 2 gloo processes: the native script's own step (its options), warmed up
    and profiled; each rank writes its summary, rank 0 keeps its trace."""
    proc = run_script(PROFILE, ["--out", str(tmp_path), "--name", "cpu", "--device", "cpu", "--image-size", "32",
                                "--batch-size-per-device", "4", "--warmup-steps", "2", "--steps", "1"], nproc=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["cpu-rank0.json", "cpu-rank0.trace.json",
                                                               "cpu-rank1.json"]
    summary = json.loads((tmp_path / "cpu-rank0.json").read_text())
    assert (summary["name"], summary["rank"], summary["world_size"]) == ("cpu", 0, 2)
    assert "--image-size" in summary["argv"]


def test_the_step_profile_comparisons_come_from_the_committed_summaries(capsys):
    """The two comparisons in experiments/step-profile/data/ are probe.py --compare of the summaries beside them."""
    probe = load_script(PROFILE, "step_profile_under_test")
    data = PROFILE.parent / "data"
    for first, second, kept in (("profile-1gpu", "profile-2gpu", "profile-compare.txt"),
                                ("profile-2gpu-nobb", "profile-2gpu-nobb-bf16hook", "profile-compare-bf16hook.txt")):
        probe.main(["--compare", str(data / f"{first}-rank0.json"), str(data / f"{second}-rank0.json")])
        assert capsys.readouterr().out == (data / kept).read_text()


@pytest.mark.parametrize("pattern", ["interleave-1gpu-bf16-32*.json", "interleave-v2-1gpu-bf16-32*.json",
                                     "interleave-*1gpu-bf16-32*.json", "interleave-*2gpu-bf16-32*.json"])
def test_pool_reproduces_the_pooled_figures_of_the_readme(capsys, pattern):
    results = sorted(str(path) for path in (INTERLEAVED / "data").glob(pattern))
    assert load_script(POOL, "interleave_pool").main(results) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    match = re.fullmatch(rf"pooled: {len(results)} runs, \d+ blocks, median (\S+); 95 % interval (\S+)-(\S+) "
                         r"resampling blocks, (\S+)-(\S+) resampling runs; median of the run medians \S+", line)
    assert match, line
    median, *bounds = match.groups()
    assert f"{median} ({bounds[0]}–{bounds[1]}; {bounds[2]}–{bounds[3]})" in (INTERLEAVED / "README.md").read_text()


def test_interleave_alternates_native_and_lightning_blocks_on_two_processes(tmp_path):
    """interleave.py on 2 gloo processes (Lightning starts the second): N0 L1 N1 L2 N2, each Lightning block against
    the native blocks around it, in a file pool.py reads; --cuda-graphs and an unwritable file refused at once."""
    output = tmp_path / "run.json"
    proc = run_script(INTERLEAVE, ["--device", "cpu", "--image-size", "32", "--batch-size-per-device", "4",
                                   "--warmup-steps", "1", "--block-steps", "2", "--blocks", "2", "--devices", "2",
                                   "--output-json", str(output)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(output.read_text())
    kinds = [block["kind"] for block in result["block_times"]]
    assert kinds == ["native", "lightning", "native", "lightning", "native"] and result["world_size"] == 2
    rates = [block["images_per_second"] for block in result["block_times"]]
    assert result["summary"]["ratios"] == pytest.approx([rates[1] / ((rates[0] + rates[2]) / 2),
                                                         rates[3] / ((rates[2] + rates[4]) / 2)])
    assert load_script(POOL, "interleave_pool").main([str(output)]) == 0
    proc = run_script(INTERLEAVE, ["--device", "cpu", "--output-json", "/proc/none/x.json", "--cuda-graphs"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--cuda-graphs is not interleaved" in proc.stderr


@pytest.mark.parametrize("text", ["not json", "{}", '{"summary": {"ratios": [], "median_ratio": 1}}'])
def test_pool_refuses_a_file_that_is_not_an_interleaved_result(tmp_path, capsys, text):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    assert load_script(POOL, "interleave_pool").main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"pool.py: error: {bad} is not an interleave.py result" in err


def test_hook_profile_times_the_loops_without_a_profiler(tmp_path):
    """hook_profile.py --timing: the plain loop and the Trainer (automatic and manual) timed in turn on the CPU,
    Lightning's cost a step as the medians' differences, in a JSON written whole."""
    output = tmp_path / "loop-cost.json"
    proc = subprocess.run([sys.executable, str(HOOK_PROFILE), "--timing", "--repeats", "1", "--output-json",
                           str(output)], capture_output=True, text=True, timeout=300, env=clean_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(output.read_text())
    assert (result["device"], result["precision"], result["repeats"]) == ("cpu", "fp32", 1)
    medians = result["median_step_us"]
    assert result["lightning_cost_us"] == {"automatic": medians["automatic"] - medians["plain"],
                                           "manual": medians["manual"] - medians["plain"]}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["loop-cost.json"]


@pytest.mark.parametrize("argv, rule", [
    (["--timing", "--repeats", "0"], "argument --repeats: must be a positive integer, got 0"),
    (["--repeats", "3"], "--repeats only with --timing"),
    (["--timing", "--output-json", "{file}/x.json"], "--output-json directory {file} cannot be written"),
    (["--timing", "--device", "cuda"], "--device cuda needs a CUDA GPU and none is visible"),
])
def test_hook_profile_refuses_bad_input_before_timing(tmp_path, argv, rule, monkeypatch):
    pretend_gpus(monkeypatch, count=0)
    profile = load_script(HOOK_PROFILE, "hook_profile_under_test")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(profile.common.UsageError, match=re.escape(rule.format(file=a_file))):
        profile.main([arg.format(file=a_file) for arg in argv])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a-file"]

