"""compare.py end to end: the real ddp_resnet50.py on the CPU in ABBA rounds, then a stand-in script for the rules
(statistics, machines, stop rules, failures), whose result and img/s each call sets."""
import errno
import json
import math
import os
import re
import shlex
import signal
import stat
import statistics
import subprocess
import sys
import time

import jsonschema
import pytest
import scipy.stats

from conftest import NATIVE, ROOT, SMALL, clean_env, load_script, read_result

COMPARE = ROOT / "compare.py"
SCHEMA = json.loads((ROOT / "schema" / "compare.schema.json").read_text())
FIXTURE = ROOT / "tests" / "fixtures" / "results" / "native-strong-1proc.json"
# A stand-in for a benchmark script: it writes the fixture's result with what its N-th call (counted per --label
# in the --calls file, which also records the order of the calls) is told: img/s (JSON), GPU UUIDs, status; --touch
# names a file that it writes as another program would, --wait-for one whose making it waits for (a minute at most).
FAKE_SCRIPT = f'''
import argparse, json, pathlib, sys, time
parser = argparse.ArgumentParser()
for name in ("--label", "--calls", "--ips", "--uuids", "--host", "--torch", "--status", "--noisy", "--touch",
             "--wait-for", "--output"):
    parser.add_argument(name)
parser.add_argument("--sleep", type=float, default=0)
args = parser.parse_args()
calls = pathlib.Path(args.calls)
call = calls.read_text().split().count(args.label) if calls.exists() else 0
with calls.open("a") as log:
    log.write(args.label + "\\n")
time.sleep(args.sleep)
deadline = time.monotonic() + 60
while args.wait_for and not pathlib.Path(args.wait_for).exists() and time.monotonic() < deadline:
    time.sleep(0.02)
def nth(values, default):
    values = (values or default).split(",")
    return values[call % len(values)]
result = json.loads(pathlib.Path({str(FIXTURE)!r}).read_text())
result["throughput"]["images_per_second"] = json.loads(nth(args.ips, "100"))
uuids = nth(args.uuids, "GPU-0").split("+")
result["hardware"]["ranks"] = [{{"rank": rank, "hostname": args.host or "vm", "device": f"cuda:{{rank}}",
                                "gpu_uuid": uuid, "gpu_name": "NVIDIA H200"}} for rank, uuid in enumerate(uuids)]
result["hardware"]["hostnames"] = [args.host or "vm"]
result["software"]["torch"] = args.torch or result["software"]["torch"]
result["status"] = nth(args.status, "ok")
noisy = nth(args.noisy, "no") == "yes"
result["stability"] = {{"second_half_over_first": 1.0, "host_lead_ms_median": None, "host_ahead": None,
                       "noisy": noisy, "reason": "host-bound: the stand-in's" if noisy else None}}
if result["status"] != "ok":
    result["failure"] = {{"kind": result["status"], "rank": 0, "message": "the stand-in was told to fail"}}
pathlib.Path(args.output).write_text(json.dumps(result))
if args.touch:
    pathlib.Path(args.touch).write_text('{{"written by": "another program"}}')
print("stand-in: wrote", args.output)
sys.exit(0 if result["status"] == "ok" else 1)
'''


@pytest.fixture(scope="module")
def compare():
    return load_script(COMPARE)


@pytest.fixture
def fake(tmp_path):
    """fake(label, **options): the command line of the stand-in for one side."""
    script = tmp_path / "fake_bench.py"
    script.write_text(FAKE_SCRIPT)

    def command(label, **options):
        words = [sys.executable, str(script), "--label", label, "--calls", str(tmp_path / "calls.txt")]
        for name, value in options.items():
            words += [f"--{name.replace('_', '-')}", str(value)]
        return shlex.join(words)
    return command


def run_compare(tmp_path, a, b, *options, name="cmp.json"):
    return subprocess.run([sys.executable, str(COMPARE), "--a", a, "--b", b, "--output", str(tmp_path / name),
                           *map(str, options)], capture_output=True, text=True, timeout=300, env=clean_env(),
                          cwd=tmp_path)


def read_comparison(path):
    comparison = json.loads(path.read_text())
    jsonschema.validate(comparison, SCHEMA, cls=jsonschema.Draft202012Validator)
    return comparison


def calls(tmp_path):
    return (tmp_path / "calls.txt").read_text().split()


def paired_summary(ratios):
    """The 95 % interval of the geometric mean of paired ratios, computed here independently of compare.py."""
    logs = [math.log(ratio) for ratio in ratios]
    t = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706}[len(logs) - 1]  # a textbook's table
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    mean = statistics.fmean(logs)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def test_real_script_rounds_in_abba_order(tmp_path):
    a = shlex.join([sys.executable, str(NATIVE), *SMALL, "--warmup-steps", "1", "--steps", "2"])
    b = shlex.join([sys.executable, str(NATIVE), *SMALL, "--warmup-steps", "1", "--steps", "3"])
    proc = run_compare(tmp_path, a, b, "--rounds", 2)
    assert proc.returncode == 0, proc.stderr
    comparison = read_comparison(tmp_path / "cmp.json")
    assert comparison["status"] == "ok" and comparison["stop_reason"] == "rounds"
    assert comparison["commands"] == {"a": a, "b": b}
    rounds = comparison["rounds"]
    assert [(r["order"], r["pair"], r["side"]) for r in rounds] == [(1, 1, "a"), (2, 1, "b"), (3, 2, "b"), (4, 2, "a")]
    results = [read_result(tmp_path / r["result"]) for r in rounds]
    # each round ran its own side's command (B times 3 steps), one after another in that order
    assert [result["config"]["steps"] for result in results] == [2, 3, 3, 2]
    assert [r["result"] for r in rounds] == ["cmp.rounds/a-1.json", "cmp.rounds/b-1.json", "cmp.rounds/b-2.json",
                                             "cmp.rounds/a-2.json"]
    starts = [result["started_at"] for result in results]
    assert starts == sorted(starts)
    ips = [result["throughput"]["images_per_second"] for result in results]
    assert [r["images_per_second"] for r in rounds] == ips
    ratios = [ips[1] / ips[0], ips[2] / ips[3]]
    assert [pair["ratio"] for pair in comparison["pairs"]] == pytest.approx(ratios)
    assert [pair["order"] for pair in comparison["pairs"]] == ["AB", "BA"]
    ratio, low, high = paired_summary(ratios)
    assert comparison["ratio"] == pytest.approx(ratio)
    assert comparison["interval_95"] == pytest.approx([low, high], rel=1e-5)
    assert comparison["machine"]["a"] == comparison["machine"]["b"]
    assert comparison["machine"]["a"]["hostnames"] == results[0]["hardware"]["hostnames"]
    assert comparison["git"]["a"] == results[0]["git"] and comparison["software"]["b"]["torch"] == results[1][
        "software"]["torch"]
    assert comparison["like_for_like"] and comparison["differences"] == []
    progress = [line for line in proc.stdout.splitlines() if line.startswith("pair ")]
    assert [line.split(":")[0] for line in progress] == ["pair 1/2 A", "pair 1/2 B", "pair 2/2 B", "pair 2/2 A"]
    assert comparison["verdict"] in proc.stdout


def test_pairs_cancel_a_drift_that_unpaired_rounds_would_not(tmp_path, fake):
    # The machine's pace doubles and halves between pairs; B is 10 % slower within each pair.
    a = fake("a", ips="100,200,100,200")
    b = fake("b", ips="90,181,89.5,180")
    proc = run_compare(tmp_path, a, b, "--rounds", 4)
    assert proc.returncode == 0, proc.stderr
    assert calls(tmp_path) == ["a", "b", "b", "a", "a", "b", "b", "a"]
    comparison = read_comparison(tmp_path / "cmp.json")
    ratios = [90 / 100, 181 / 200, 89.5 / 100, 180 / 200]
    assert [pair["ratio"] for pair in comparison["pairs"]] == pytest.approx(ratios)
    ratio, low, high = paired_summary(ratios)
    assert comparison["ratio"] == pytest.approx(ratio)
    assert comparison["interval_95"] == pytest.approx([low, high], rel=1e-5)
    assert high < 1  # unpaired, the drift would make the interval contain 1
    assert figures(comparison["verdict"]) == [f"{100 * (1 - ratio):.1f}", "95", f"{100 * (1 - high):.1f}",
                                              f"{100 * (1 - low):.1f}", "4"]
    assert comparison["verdict"] in proc.stdout.splitlines()


def test_statistics(compare):
    # Student's t with n - 1 degrees of freedom at 0.975, against a textbook's table: the wrong quantile (0.95) or
    # the wrong degrees of freedom (n) would be off by 4 % or more
    for ratios in ([1.02, 0.98], [1.02, 0.98, 1.05], [1.02, 0.98, 1.05, 1.01, 0.99, 1.0]):
        ratio, interval, half_width = compare.summarize(ratios)
        expected = paired_summary(ratios)
        assert (ratio, *interval) == pytest.approx(expected, rel=1e-5)
        assert half_width == pytest.approx(100 * (expected[2] / expected[0] - 1), rel=1e-4)
    assert compare.summarize([0.9]) == (pytest.approx(0.9), None, None)
    assert compare.summarize([]) == (None, None, None)


def figures(text):
    return re.findall(r"\d+(?:[.,]\d+)*", text)


def test_verdict_names_the_interval_and_the_noise(compare):
    assert figures(compare.verdict(1.041, [1.020, 1.062], 5)) == ["4.1", "95", "2.0", "6.2", "5"]
    assert figures(compare.verdict(0.959, [0.938, 0.980], 5)) == ["4.1", "95", "2.0", "6.2", "5"]
    assert "faster" in compare.verdict(1.041, [1.020, 1.062], 5) and "slower" in compare.verdict(0.959, [0.9, 0.98], 5)
    # an interval that holds 1: both ends, nothing clipped, however wide
    assert figures(compare.verdict(1.002, [0.535, 1.288], 4, 3, 8)) == ["46.5", "28.8", "95", "4", "3", "8"]
    assert figures(compare.verdict(2.0, [0.001, 4546.862], 4)) == ["99.9", "454586.2", "95", "4"]


def test_below_four_pairs_no_interval_and_the_pairs_to_run(compare):
    """2 pairs on a noisy CPU gave "between 100.0 % slower and 454586.2 % faster": t with 1 degree of freedom."""
    for ratios in ([0.9, 1.12], [1.02, 0.98, 1.0]):
        ratio, interval, _ = compare.summarize(ratios)
        text = compare.verdict(ratio, interval, len(ratios), ratios=ratios)
        assert "slower" not in text and "faster" not in text and f"--rounds {compare.MIN_PAIRS}" in text
        needed = int(figures(text.split("about ")[1])[0].replace(",", ""))
        spread = statistics.stdev(map(math.log, ratios))

        def half(n):
            return scipy.stats.t.ppf(0.975, n - 1) * spread / math.sqrt(n)
        assert needed >= compare.MIN_PAIRS and half(needed) <= math.log(1.01) < half(needed - 1)
    assert "about" not in compare.verdict(1.1, None, 1, ratios=[1.1])  # one pair: no spread to go by


@pytest.mark.parametrize("a_options,b_options,refused", [
    ({"uuids": "GPU-0"}, {"uuids": "GPU-1"}, "compare on one machine"),               # the other GPU
    ({"host": "node1"}, {"host": "node2"}, "compare on one machine"),                 # another host
    ({"uuids": "GPU-0,GPU-7"}, {"uuids": "GPU-0"}, "A's first round on"),             # A moved in pair 2
    ({"uuids": "GPU-0"}, {"uuids": "GPU-0+GPU-1"}, None),                             # one GPU against both
])
def test_rounds_on_another_machine_are_refused(tmp_path, fake, a_options, b_options, refused):
    proc = run_compare(tmp_path, fake("a", **a_options), fake("b", **b_options), "--rounds", 2)
    if refused is None:
        assert proc.returncode == 0, proc.stderr
        comparison = read_comparison(tmp_path / "cmp.json")
        assert comparison["machine"]["b"]["gpu_uuids"] == ["GPU-0", "GPU-1"]
        assert comparison["machine"]["b"]["gpu_names"] == ["NVIDIA H200"]
        return
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and refused in proc.stderr, proc.stderr
    assert proc.stderr.startswith("compare.py: error: round ") and "Traceback" not in proc.stderr
    assert not (tmp_path / "cmp.json").exists()


def test_a_different_software_is_recorded(tmp_path, fake):
    proc = run_compare(tmp_path, fake("a"), fake("b", torch="2.99.0"), "--rounds", 2)
    assert proc.returncode == 0, proc.stderr
    comparison = read_comparison(tmp_path / "cmp.json")
    assert not comparison["like_for_like"]
    assert comparison["differences"] == ["software torch: A 2.14.1+cu130, B 2.99.0"]
    assert "not like for like: software torch: A 2.14.1+cu130, B 2.99.0" in proc.stdout


def test_until_interval_stops_at_the_first_narrow_enough_pair(tmp_path, fake, compare):
    ips_b = [100, 100, 94, 100, 99, 101, 100, 100]  # two equal pairs first: an interval of width 0, no answer yet
    proc = run_compare(tmp_path, fake("a"), fake("b", ips=",".join(map(str, ips_b))), "--rounds", 8,
                       "--until-interval", 5)
    assert proc.returncode == 0, proc.stderr
    comparison = read_comparison(tmp_path / "cmp.json")
    assert comparison["stop_reason"] == "until_interval" and comparison["status"] == "ok"
    first = compare.MIN_PAIRS  # no interval before it: no stop either
    widths = [compare.summarize([ips / 100 for ips in ips_b[:n]])[2] for n in range(first, len(ips_b) + 1)]
    stop = first + next(n for n, width in enumerate(widths) if width < 5)
    assert first < stop < len(ips_b)  # the data make it stop neither at once nor never
    assert len(comparison["pairs"]) == stop and len(comparison["rounds"]) == 2 * stop
    assert comparison["interval_half_width_percent"] < 5


def test_max_minutes_starts_no_new_pair(tmp_path, fake):
    proc = run_compare(tmp_path, fake("a", sleep=0.3), fake("b", sleep=0.3), "--rounds", 5, "--max-minutes", 0.01)
    assert proc.returncode == 0, proc.stderr
    comparison = read_comparison(tmp_path / "cmp.json")
    assert comparison["stop_reason"] == "max_minutes"
    assert len(comparison["pairs"]) == 1 and comparison["interval_95"] is None
    assert calls(tmp_path) == ["a", "b"]
    assert figures(comparison["verdict"]) == ["1.000", "1", "4", "4"]


def test_a_failing_round_stops_and_keeps_the_pairs_so_far(tmp_path, fake):
    proc = run_compare(tmp_path, fake("a"), fake("b", status="ok,error"), "--rounds", 3)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "round 3" in proc.stderr  # one line naming the round that failed
    comparison = read_comparison(tmp_path / "cmp.json")
    assert (comparison["status"], comparison["stop_reason"]) == ("failed", "failed")
    assert comparison["failure"] == proc.stderr.split(": ", 1)[1].strip()
    assert [(r["side"], r["status"]) for r in comparison["rounds"]] == [("a", "ok"), ("b", "ok"), ("b", "error")]
    assert len(comparison["pairs"]) == 1 and comparison["ratio"] == pytest.approx(1)


def test_a_round_without_a_result_names_its_last_line(tmp_path, fake):
    silent = shlex.join([sys.executable, "-c", "import sys; print('no GPU here', file=sys.stderr); sys.exit(3)"])
    proc = run_compare(tmp_path, silent, fake("b"), "--rounds", 2)
    assert proc.returncode == 1
    assert proc.stderr.startswith("compare.py: round 1 (pair 1, A) failed: exit 3, no result at ")
    assert proc.stderr.endswith(": no GPU here\n") and proc.stderr.count("\n") == 1
    assert read_comparison(tmp_path / "cmp.json")["rounds"][0]["status"] is None


def test_a_signal_ends_the_comparison_with_what_it_has(tmp_path, fake):
    command = [sys.executable, str(COMPARE), "--a", fake("a", sleep=30), "--b", fake("b"), "--rounds", "2",
               "--output", str(tmp_path / "cmp.json")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    deadline = time.monotonic() + 30
    while not (tmp_path / "calls.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == 130
    comparison = read_comparison(tmp_path / "cmp.json")
    assert (comparison["status"], comparison["rounds"], comparison["ratio"]) == ("interrupted", [], None)


PYTHON_NATIVE = shlex.join([sys.executable, str(NATIVE)])


@pytest.mark.parametrize("a,options,rule", [
    (f"{PYTHON_NATIVE} --output r.json", [], "has --output: compare.py gives each round its own --output"),
    (f"{PYTHON_NATIVE} --output=r.json", [], "has --output"),
    (f"{PYTHON_NATIVE} 'ddp_resnet50.py", [], "No closing quotation"),
    ("no-such-command-here --steps 4", [], "no-such-command-here is not a command found here"),
    ("NCCL_DEBUG=INFO", [], "has no command"),
    (PYTHON_NATIVE, ["--rounds", "1"], "--rounds 1: an interval needs at least 2 pairs"),
    (PYTHON_NATIVE, ["--output", "cmp.txt"], "name a .json file"),
    (PYTHON_NATIVE, ["--until-interval", "0"], "--until-interval 0.0: give a number above 0"),
    (PYTHON_NATIVE, ["--max-minutes", "-1"], "--max-minutes -1.0: give a number above 0"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, a, options, rule):
    proc = run_compare(tmp_path, a, PYTHON_NATIVE, "--rounds", 2, *options)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("compare.py: error: ") and proc.stderr.count("\n") == 1 and rule in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_existing_comparison_needs_overwrite(tmp_path, fake):
    assert run_compare(tmp_path, fake("a"), fake("b"), "--rounds", 3).returncode == 0
    proc = run_compare(tmp_path, fake("a"), fake("b"), "--rounds", 2)
    assert proc.returncode == 2 and "exists: pass --overwrite to replace it" in proc.stderr
    (tmp_path / "cmp.json").unlink()
    proc = run_compare(tmp_path, fake("a"), fake("b"), "--rounds", 2)
    assert proc.returncode == 2 and "holds another comparison's rounds" in proc.stderr
    proc = run_compare(tmp_path, fake("a"), fake("b"), "--rounds", 2, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert len(read_comparison(tmp_path / "cmp.json")["rounds"]) == 4
    assert sorted(path.name for path in (tmp_path / "cmp.rounds").glob("*.json")) == [
        "a-1.json", "a-2.json", "b-1.json", "b-2.json"]  # the third pair of the old comparison is gone


def test_noisy_rounds_are_counted_and_named(tmp_path, fake):
    proc = run_compare(tmp_path, fake("a", noisy="no,yes"), fake("b", noisy="yes,no,no"), "--rounds", 3)
    assert proc.returncode == 0, proc.stderr
    comparison = read_comparison(tmp_path / "cmp.json")
    # A's calls: no, yes, no; B's: yes, no, no (each side's own count of calls)
    assert [(r["side"], r["noisy"]) for r in comparison["rounds"]] == [
        ("a", False), ("b", True), ("b", False), ("a", True), ("a", False), ("b", False)]
    assert comparison["noisy_rounds"] == 2
    assert comparison["rounds"][1]["noise_reason"] == "host-bound: the stand-in's"
    assert figures(comparison["verdict"])[-2:] == ["2", "6"] and comparison["verdict"] in proc.stdout


def test_umask_sets_the_comparison_mode(tmp_path, fake):
    proc = subprocess.run([sys.executable, str(COMPARE), "--a", fake("a"), "--b", fake("b"), "--rounds", "2",
                           "--output", str(tmp_path / "cmp.json")], capture_output=True, text=True, timeout=300,
                          env=clean_env(), preexec_fn=lambda: os.umask(0o027))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((tmp_path / "cmp.json").stat().st_mode) == 0o640


def assert_refused_before_any_round(proc, tmp_path, rule):
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.startswith("compare.py: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert rule in proc.stderr
    assert not (tmp_path / "calls.txt").exists()  # no round ran


def test_an_output_that_cannot_be_written_is_refused_before_the_first_round(tmp_path, fake):
    # A name that fits the folder but not the comparison's temporary file beside it: a folder that refuses the
    # write, found by trying it before the rounds (also as root, whom permissions do not stop)
    name = "c" * 245 + ".json"
    proc = run_compare(tmp_path, fake("a"), fake("b"), "--rounds", 2, name=name)
    assert_refused_before_any_round(proc, tmp_path, f"cannot write in {tmp_path}: File name too long")
    assert not (tmp_path / name).exists() and list((tmp_path / name).with_suffix(".rounds").iterdir()) == []


@pytest.fixture
def read_only(tmp_path):
    """read_only(folder): no file can be made in the folder any more (for root too, where chattr works), or skip."""
    frozen = []

    def freeze(folder):
        folder.chmod(0o555)
        frozen.append(folder)
        if os.geteuid() == 0:
            subprocess.run(["chattr", "+i", str(folder)], capture_output=True)
        try:
            (folder / "probe").touch()
        except OSError:
            return
        pytest.skip("cannot make a read-only folder here")
    yield freeze
    for folder in frozen:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
        folder.chmod(0o755)


@pytest.mark.parametrize("rounds_folder_exists", [False, True])
def test_an_unwritable_folder_is_refused_before_the_first_round(tmp_path, fake, read_only, rounds_folder_exists):
    folder = tmp_path / "out"
    (folder / "cmp.rounds").mkdir(parents=True)
    if not rounds_folder_exists:
        (folder / "cmp.rounds").rmdir()
    read_only(folder)
    proc = run_compare(tmp_path, fake("a"), fake("b"), "--rounds", 2, name="out/cmp.json")
    assert_refused_before_any_round(proc, tmp_path, "cannot write in ")
    assert "Traceback" not in proc.stderr and not (folder / "cmp.json").exists()


def test_a_full_disk_at_the_end_still_tells_the_verdict(tmp_path, fake, compare, monkeypatch, capsys):
    def full_disk(descriptor):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", full_disk)  # the writer's sync, as on a disk that filled during the rounds
    output = tmp_path / "cmp.json"
    code = compare.main(["--a", fake("a"), "--b", fake("b", ips="110"), "--rounds", "2", "--output", str(output)])
    out, err = capsys.readouterr()
    assert code == 1
    assert "B/A 1.100 from 2 pairs" in out and "B/A per pair: 1.100, 1.100" in out
    assert err.count("\n") == 1 and f"cannot write {output}: No space left on device" in err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["calls.txt", "cmp.rounds", "fake_bench.py"]
    assert sorted(path.name for path in (tmp_path / "cmp.rounds").iterdir()) == [
        "a-1.json", "a-1.log", "a-2.json", "a-2.log", "b-1.json", "b-1.log", "b-2.json", "b-2.log"]


def test_missing_scipy_is_one_line_before_any_round(tmp_path, fake, compare, monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy", None)  # import scipy fails
    with pytest.raises(compare.UsageError, match=r"needs scipy: pip install scipy"):
        compare.main(["--a", fake("a"), "--b", fake("b"), "--rounds", "2", "--output", str(tmp_path / "cmp.json")])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["fake_bench.py"]


@pytest.mark.parametrize("bad,shown", [("0", "0"), ("null", "None"), ("-5", "-5"), ("Infinity", "inf"),
                                       ('"fast"', "'fast'")])
def test_a_result_that_says_ok_without_a_positive_throughput_fails_its_round(tmp_path, fake, bad, shown):
    proc = run_compare(tmp_path, fake("a"), fake("b", ips=bad), "--rounds", 2)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("compare.py: round 2 (pair 1, B) failed: exit 0, its result ")
    assert "throughput.images_per_second" in proc.stderr and shown in proc.stderr.split("images_per_second")[1]
    comparison = read_comparison(tmp_path / "cmp.json")
    assert (comparison["status"], comparison["pairs"], comparison["ratio"]) == ("failed", [], None)
    assert comparison["rounds"][-1]["images_per_second"] is None and comparison["failure"] in proc.stderr


def test_a_folder_named_like_a_round_file_is_refused_before_any_round(tmp_path, fake):
    rounds = tmp_path / "cmp.rounds"
    (rounds / "a-1.json").mkdir(parents=True)
    old = ["a-1.log", "a-2.json", "b-1.json", "b-1.log", "b-2.json", "b-2.log", "a-2.log"]
    for name in old:
        (rounds / name).write_text("an old round\n")
    proc = run_compare(tmp_path, fake("a"), fake("b"), "--rounds", 2, "--overwrite")
    assert_refused_before_any_round(proc, tmp_path, f"{rounds / 'a-1.json'} is a folder")
    assert sorted(path.name for path in rounds.iterdir()) == sorted([*old, "a-1.json"])  # nothing removed


def test_a_leftover_lock_is_named(tmp_path, fake):
    lock = tmp_path / "cmp.rounds" / ".lock"
    lock.parent.mkdir()
    lock.touch()  # left by a run that was killed (SIGKILL), or held by one that runs
    proc = run_compare(tmp_path, fake("a"), fake("b"), "--rounds", 2, "--overwrite")
    assert_refused_before_any_round(proc, tmp_path, f"another compare.py holds it (remove {lock} if none runs)")


def test_two_runs_with_one_output_the_second_is_refused_at_once(tmp_path, fake):
    go = tmp_path / "go"
    a1, b1 = fake("a1", wait_for=go), fake("b1")
    first = subprocess.Popen([sys.executable, str(COMPARE), "--a", a1, "--b", b1, "--rounds", "2", "--output",
                              str(tmp_path / "cmp.json")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=clean_env())
    deadline = time.monotonic() + 60
    while not (tmp_path / "calls.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    # the second run, even with --overwrite, while the first one's round 1 waits
    second = run_compare(tmp_path, fake("a2"), fake("b2"), "--rounds", 2, "--overwrite")
    go.touch()
    out, err = first.communicate(timeout=120)
    assert second.returncode == 2 and second.stdout == "" and second.stderr.count("\n") == 1, second.stderr
    assert "another compare.py holds it" in second.stderr
    assert first.returncode == 0, err
    assert calls(tmp_path) == ["a1", "b1", "b1", "a1"]
    comparison = read_comparison(tmp_path / "cmp.json")
    assert comparison["commands"] == {"a": a1, "b": b1} and len(comparison["pairs"]) == 2
    assert sorted(path.name for path in (tmp_path / "cmp.rounds").iterdir()) == [
        "a-1.json", "a-1.log", "a-2.json", "a-2.log", "b-1.json", "b-1.log", "b-2.json", "b-2.log"]  # no lock left


def test_a_comparison_that_another_program_wrote_meanwhile_is_kept(tmp_path, fake):
    output = tmp_path / "cmp.json"
    proc = run_compare(tmp_path, fake("a"), fake("b", ips="110", touch=output), "--rounds", 2)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{output} exists (another run may have written it meanwhile): not replaced" in proc.stderr
    assert "B/A 1.100 from 2 pairs" in proc.stdout
    assert json.loads(output.read_text()) == {"written by": "another program"}
