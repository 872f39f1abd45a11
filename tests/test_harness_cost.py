"""tools/harness_cost.py: the training step timed bare and through the benchmark's loop, in interleaved blocks."""
import json
import math
import subprocess
import sys

import pytest

from conftest import ROOT, SMALL, clean_env, load_script

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
    assert cost["config"]["warmup_steps"] == 2 and cost["block_steps"] == 2
    assert math.isfinite(cost["harness_host_us_per_step"]) and abs(cost["harness_host_us_per_step"]) < 1e3
    # the harness blocks run the benchmark's own loop: its progress lines, two per block of two steps
    assert proc.stdout.count("measuring step 2/2") == 2 and "own host time" in proc.stdout
    assert "harness / bare throughput: pooled" in proc.stdout
    assert list(tmp_path.iterdir()) == [output]  # no temporary file left


def test_each_kind_of_block_lands_in_its_own_column(tmp_path, monkeypatch):
    """The bare blocks take 10 ms and the harness blocks 20 here: the ratio must be 0.5, not 2."""
    tool = load_script(TOOL)
    monkeypatch.setattr(tool, "timed_block", lambda run, step, steps, through_harness: (
        20.0 if through_harness else 10.0))  # the blocks' steps themselves run in the test above
    output = tmp_path / "cost.json"
    assert tool.main([*SMALL, "--blocks", "2", "--block-steps", "2", "--output", str(output)]) == 0
    cost = json.loads(output.read_text())
    assert [(b["bare_ms"], b["harness_ms"]) for b in cost["block_times"]] == [(10.0, 20.0)] * 2
    assert cost["ratio_pooled"] == cost["ratio_median"] == 0.5


def test_bad_input_is_one_line_and_exit_2_before_any_work():
    proc = subprocess.run([sys.executable, str(TOOL), *SMALL, "--blocks", "0"], capture_output=True, text=True,
                          timeout=120, env=clean_env(), cwd=ROOT)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("harness_cost.py: error: "), proc.stderr
    assert "--blocks must be" in lines[0] and "measuring" not in proc.stdout


@pytest.mark.parametrize("args,rule", [
    (["--blocks", "abc"], "invalid int value"),
    (["--output", "."], "is not a file path"),
])
def test_each_rule_is_named_before_any_work(args, rule, capsys):
    """In the test's process (the one-line exit path is the test above's): main() returns 2 before measuring."""
    assert load_script(TOOL).main([*SMALL, *args]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("harness_cost.py: error: ") and rule in err, err
    assert "measuring" not in out
