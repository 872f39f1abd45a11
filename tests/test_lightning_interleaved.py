"""docs/diagnostics/lightning-interleaved/: Lightning and native blocks interleaved in one process (CPU, gloo)."""
import json
import math
import re
import subprocess
import sys

import pytest

from conftest import ROOT, clean_env, load_script

SCRIPT = ROOT / "docs" / "diagnostics" / "lightning-interleaved" / "interleave.py"


def test_interleaves_the_real_twin_with_natives_step(tmp_path):
    """Two processes started by Lightning itself (gloo): native's step gets the twin's launch, so a global batch
    means the same per-device batch in both."""
    output = tmp_path / "interleaved.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--precision", "fp32", "--image-size",
                           "32", "--devices", "2", "--global-batch-size", "4", "--warmup-steps", "2",
                           "--block-steps", "2", "--blocks", "3", "--output-json", str(output)],
                          capture_output=True, text=True, timeout=180, env=clean_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(output.read_text())
    kinds = [block["kind"] for block in result["block_times"]]
    assert kinds == ["native", "lightning"] * 3 + ["native"]  # N0 L1 N1 L2 N2 L3 N3
    assert all(block["steps"] == 2 and block["seconds"] > 0 for block in result["block_times"])
    assert (result["world_size"], result["batch_size_per_device"], result["native_batch_size_per_device"]) == (2, 2, 2)
    summary = result["summary"]
    assert len(summary["ratios"]) == 3 and all(math.isfinite(r) and r > 0 for r in summary["ratios"])
    low, high = summary["median_ratio_95pct_interval"]
    assert low <= summary["median_ratio"] <= high
    assert "Lightning/native, 3 Lightning blocks of 2 steps" in proc.stdout
    # native blocks run native's timed loop (TimedLoop), its progress lines included: they count the 8 steps of
    # the 4 native blocks (a line a step at this size), the twin's lines its own 6 timed steps
    assert [line.strip() for line in proc.stdout.splitlines() if line.strip().endswith("/8 (queued)")] == [
        f"measuring step {i}/8 (queued)" for i in range(1, 9)]
    assert result["native_block"].startswith("native's timed loop")


@pytest.mark.parametrize("argv, rule", [
    (["--cuda-graphs"], "--cuda-graphs is not interleaved: the uncaptured loop is the question"),
    (["--blocks", "0"], "argument --blocks: must be a positive integer, got 0"),
    (["--output-json", "{file}/x.json"], "--output-json directory {file} cannot be written"),
])
def test_bad_input_is_refused_before_the_run(tmp_path, argv, rule):
    """In this process (the scripts' imports are already paid for): the twin's UsageError, which its run_guarded
    turns into one line and exit 2 on the command line, before anything runs; nothing written."""
    interleave = load_script(SCRIPT, "interleave_under_test")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    argv = [arg.format(file=a_file) for arg in argv]
    with pytest.raises(interleave.twin.UsageError, match=rule.format(file=a_file)):
        interleave.main(["--output-json", str(tmp_path / "x.json"), *argv])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a-file"]


POOL = SCRIPT.parent / "pool.py"


@pytest.mark.parametrize("pattern", ["interleave-1gpu-bf16-32*.json", "interleave-2gpu-bf16-32*.json",  # first version
                                     "interleave-v2-1gpu-bf16-32*.json", "interleave-v2-2gpu-bf16-32*.json",  # v2
                                     "interleave-*1gpu-bf16-32*.json", "interleave-*2gpu-bf16-32*.json"])  # both
def test_pool_reproduces_the_committed_pooled_figures(capsys, pattern):
    """pool.py on the committed device runs (automatic optimization) prints the pooled median and block interval
    that the README's pooled row for those runs quotes: each version's runs, and both versions' together."""
    pool = load_script(POOL, "interleave_pool")
    results = [str(path) for path in (SCRIPT.parent / "results").glob(pattern) if "manual" not in path.name]
    assert pool.main(results) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    match = re.fullmatch(rf"pooled: {len(results)} runs, (\d+) blocks, median (\S+); 95 % interval (\S+) resampling "
                         r"blocks, (\S+) resampling runs; median of the run medians \S+", line)
    assert match, line
    blocks, median, by_block, by_run = match.groups()
    rows = [row for row in (SCRIPT.parent / "README.md").read_text().splitlines() if f"pooled, {blocks} blocks**" in row]
    assert len(rows) == 1, rows
    assert f"**{median}**: {by_block.replace('-', '–')} resampling blocks" in rows[0], (line, rows[0])
    if len(results) > 3:  # the run interval is quoted only where there are runs enough to resample
        assert f"{by_run.replace('-', '–')} resampling runs" in rows[0], (line, rows[0])


@pytest.mark.parametrize("text", ["not json", "{}", '{"summary": {}}', '{"summary": {"ratios": [], "median_ratio": 1}}',
                                  '{"summary": {"ratios": ["x"], "median_ratio": 1}}'])
def test_pool_refuses_a_file_that_is_not_a_result(tmp_path, capsys, text):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    assert load_script(POOL, "interleave_pool").main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"pool.py: error: {bad} is not an interleave.py result" in err


def test_hook_profile_times_the_loops_without_a_profiler(tmp_path):
    """hook_profile.py --timing: the plain loop and the Trainer (automatic and manual) timed in turn on the CPU,
    Lightning's cost a step as the medians' differences, in an atomically written JSON."""
    output = tmp_path / "loop-cost.json"
    proc = subprocess.run([sys.executable, str(SCRIPT.with_name("hook_profile.py")), "--timing", "--repeats", "1",
                           "--output-json", str(output)], capture_output=True, text=True, timeout=300,
                          env=clean_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(output.read_text())
    assert (result["device"], result["precision"], result["repeats"]) == ("cpu", "fp32", 1)
    medians = result["median_step_us"]
    assert all(len(result["step_us"][kind]) == 1 and medians[kind] > 0 for kind in ("plain", "automatic", "manual"))
    assert result["lightning_cost_us"] == {"automatic": medians["automatic"] - medians["plain"],
                                           "manual": medians["manual"] - medians["plain"]}
    assert "cpu fp32, 1 repeats, median us a step: plain loop" in proc.stdout
    assert sorted(path.name for path in tmp_path.iterdir()) == ["loop-cost.json"]


@pytest.mark.parametrize("argv, rule", [
    (["--timing", "--repeats", "0"], "argument --repeats: must be a positive integer, got 0"),
    (["--repeats", "3"], "--repeats only with --timing"),
    (["--timing", "--output-json", "{file}/x.json"], "--output-json directory {file} cannot be written"),
    (["--timing", "--precision", "fp16"], "argument --precision: invalid choice"),
])
def test_hook_profile_refuses_bad_input_before_timing(tmp_path, argv, rule):
    """hook_profile.py's bad input: the harness's UsageError (one line, exit 2 through run_guarded) before
    anything runs; nothing written."""
    profile = load_script(SCRIPT.with_name("hook_profile.py"), "hook_profile_under_test")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(profile.bench.UsageError, match=re.escape(rule.format(file=a_file))):
        profile.main([arg.format(file=a_file) for arg in argv])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a-file"]


def test_hook_profile_refuses_a_gpu_it_does_not_have(tmp_path):
    """On the command line: one line on stderr and exit 2 (CI has no CUDA GPU)."""
    proc = subprocess.run([sys.executable, str(SCRIPT.with_name("hook_profile.py")), "--timing", "--device", "cuda"],
                          capture_output=True, text=True, timeout=120, env=clean_env(), cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == "hook_profile.py: error: --device cuda needs a CUDA GPU and none is visible\n"
