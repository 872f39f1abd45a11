"""tools/harness_cost.py: the training step timed bare and through the benchmark's loop, in interleaved blocks."""
import json
import subprocess
import sys

from conftest import ROOT, SMALL, clean_env

TOOL = ROOT / "tools" / "harness_cost.py"


def test_blocks_alternate_and_the_ratio_is_bare_over_harness_time(tmp_path):
    output = tmp_path / "cost.json"
    proc = subprocess.run([sys.executable, str(TOOL), *SMALL, "--blocks", "2", "--block-steps", "2",
                           "--output", str(output)], capture_output=True, text=True, timeout=300,
                          env=clean_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    cost = json.loads(output.read_text())
    blocks = cost["block_times"]
    assert [b["harness_first"] for b in blocks] == [False, True]  # the order alternates
    assert all(b["bare_ms"] > 0 and b["harness_ms"] > 0 for b in blocks)
    assert cost["ratio_pooled"] == sum(b["bare_ms"] for b in blocks) / sum(b["harness_ms"] for b in blocks)
    assert cost["ratio_min"] <= cost["ratio_median"] <= cost["ratio_max"]
    assert cost["config"]["warmup_steps"] == 2 and cost["block_steps"] == 2 and 0 < cost["harness_host_us_per_step"] < 1e3
    # the harness blocks run the benchmark's own loop: its progress lines, two per block of two steps
    assert proc.stdout.count("measuring step 2/2") == 2 and "own host time" in proc.stdout and "harness / bare throughput: pooled" in proc.stdout


def test_bad_input_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(TOOL), *SMALL, "--blocks", "0"], capture_output=True, text=True,
                          timeout=120, env=clean_env(), cwd=ROOT)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "--blocks must be" in proc.stderr
