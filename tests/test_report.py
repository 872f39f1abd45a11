"""report.py on real result files: tables, plots, the regression check, the generated Markdown file (docs/results.md)
and bad inputs.

The fixtures under tests/fixtures/results/ were written by ddp_resnet50.py, lightning/ddp_resnet50.py and
oss_benchmark.py in CPU runs, the one under tests/fixtures/harness-results/ by the current harness
(tests/fixtures/make_report_fixtures.sh). No benchmark runs here: every test reads files.
"""
import copy
import json
import re
import statistics
import subprocess
import sys

import pytest

from conftest import ROOT, clean_env, load_script, one_error_line, read_result

REPORT = ROOT / "report.py"
FIXTURES = ROOT / "tests" / "fixtures" / "results"
# A result of the current harness: its stability verdict, its memory window, every DDP option and --timeout recorded.
HARNESS_RESULT = ROOT / "tests" / "fixtures" / "harness-results" / "native-weak-1proc.json"


@pytest.fixture(scope="module")
def report():
    return load_script(REPORT, "report_under_test")


def run_report(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(REPORT), *map(str, args)], capture_output=True, text=True,
                          timeout=120, env=clean_env(), cwd=cwd)


def fixture(name):
    return json.loads((FIXTURES / f"{name}.json").read_text())


def write(path, result):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    return path


def table_rows(markdown, title):
    """The cells of the Markdown table that follows a bold title."""
    block = markdown.split(f"**{title}**", 1)[1].split("\n\n", 2)[1]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in block.splitlines()[2:]]


def shown(value, like=None):
    """A rate as the report prints it: decimals only for small numbers (CPU runs)."""
    scale = value if like is None else like
    return f"{value:,.0f}" if scale >= 100 else f"{value:,.1f}" if scale >= 10 else f"{value:.2f}"


def with_memory(result, allocated_mib):
    """A CPU result given GPU-like peak memory figures: what the memory comparisons need and the CPU, which
    has no memory counters, cannot measure. Everything else stays as the script wrote it."""
    result = copy.deepcopy(result)
    result["memory"]["peak_allocated_mib"] = allocated_mib
    result["memory"]["peak_reserved_mib"] = allocated_mib * 1.25
    return result


def rate(name):
    return fixture(name)["throughput"]["images_per_second"]


def rank0_text(name):
    """Rank 0's median throughput ± MAD as the report prints it."""
    throughput = fixture(name)["throughput"]
    median = throughput["rank0_median_images_per_second"]
    return f"{shown(median)} ± {shown(throughput['rank0_mad_images_per_second'], like=median)}"


def harness(field):
    """A block of what the current harness writes (its stability verdict, its memory section)."""
    return copy.deepcopy(json.loads(HARNESS_RESULT.read_text())[field])


NEW_WINDOW = harness("memory")["window"]  # the current harness's memory window (older results: the timed steps)


def in_window(result, window=NEW_WINDOW):
    """A result whose peak memory was taken over the current harness's window."""
    result = copy.deepcopy(result)
    result["memory"]["window"] = window
    return result


def noisy(result, reason="halves differ"):
    """A result whose stability, as the current harness writes it, says one run is not enough."""
    result = copy.deepcopy(result)
    result["stability"] = {**harness("stability"), "noisy": True, "reason": reason}
    return result


SHARDING = ["ddp", "oss_ddp", "oss_sharded_ddp", "zero1", "fsdp_zero2", "fsdp_zero3"]  # what gloo can run


# ---------------------------------------------------------------------------- fixtures and tables

def test_fixtures_are_real_results_of_the_schema():
    names = sorted(path.stem for path in FIXTURES.glob("*.json"))
    assert names == sorted(["lightning-weak-1proc", "lightning-weak-2proc", "native-desync-2proc",
                            "native-strong-1proc", "native-strong-2proc", "native-weak-1proc", "native-weak-2proc-a",
                            "native-weak-2proc-b", "oss-fsdp_zero3-oom", *[f"oss-{name}" for name in SHARDING]])
    for name in names:
        result = read_result(FIXTURES / f"{name}.json")
        benchmark = {"native": "ddp_resnet50.py", "lightning": "lightning/ddp_resnet50.py",
                     "oss": "oss_benchmark.py"}[name.split("-")[0]]
        assert result["benchmark"] == benchmark and result["config"]["device"] == "cpu"
    assert fixture("native-desync-2proc")["status"] == "desync" and fixture("oss-fsdp_zero3-oom")["status"] == "oom"
    assert fixture("oss-fsdp_zero3-oom")["hardware"] is None  # it failed before it looked at its hardware
    harness = read_result(HARNESS_RESULT)
    assert set(harness["stability"]) == {"second_half_over_first", "host_lead_ms_median", "host_ahead", "noisy",
                                         "reason"}
    assert harness["memory"]["window"] and harness["config"]["timeout"] == harness["config"]["timeout_s"]


def test_committed_results_and_new_fields_follow_the_schema():
    """Every committed result still validates (older ones lack the new fields); the new fields' values are checked."""
    import jsonschema
    from conftest import SCHEMA
    validator = jsonschema.Draft202012Validator(SCHEMA)
    files = sorted((ROOT / "results").rglob("*.json"))
    assert len(files) > 100
    for path in files:
        errors = list(validator.iter_errors(json.loads(path.read_text())))
        assert not errors, f"{path}: {errors[0].message[:300]}"
    new = json.loads(HARNESS_RESULT.read_text())
    lightning = fixture("lightning-weak-1proc")
    assert validator.is_valid(new) and validator.is_valid(lightning)
    for variant in ("stock", "matched"):
        lightning["config"]["lightning_variant"] = variant
        assert validator.is_valid(lightning)
    lightning["config"]["lightning_variant"] = "tuned"
    assert not validator.is_valid(lightning)
    for broken in ({"memory": {**new["memory"], "window": ""}}, {"stability": {**new["stability"], "noisy": "yes"}},
                   {"stability": {key: value for key, value in new["stability"].items() if key != "reason"}},
                   {"config": {**new["config"], "timeout": 0}}):
        assert not validator.is_valid({**new, **broken}), broken
    assert validator.is_valid({**new, "stability": None})


def test_markdown_table_aggregates_repeats_and_marks_failures():
    proc = run_report(FIXTURES)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    markdown = proc.stdout
    assert markdown.count("## CPU (") == 1  # one setup: every fixture ran on this CPU with one torch
    rows = [row for row in table_rows(markdown, "All configurations") if row[0] != "oss_benchmark.py"]
    header = markdown.split("**All configurations**", 1)[1].split("\n\n", 2)[1].splitlines()[0]
    assert ("| benchmark | strategy | processes | batch mode | batch (img/process) | global batch (img) | "
            "Median throughput (img/s) (rank 0) ± MAD | Throughput (img/s) | Peak memory (MiB) | runs | "
            "spread between runs | status |") == header
    # Strong scaling rows (global batch 8) first, then weak (4 per process); the failed run after its twin.
    assert [(row[0], row[2], row[3], row[4], row[5], row[11]) for row in rows] == [
        ("ddp_resnet50.py", "1", "global", "8", "8", "ok"), ("ddp_resnet50.py", "2", "global", "4", "8", "ok"),
        ("ddp_resnet50.py", "1", "per device", "4", "4", "ok"), ("ddp_resnet50.py", "2", "per device", "4", "8", "ok"),
        ("ddp_resnet50.py", "2", "per device", "4", "8", "**✗ desync**"),
        ("lightning/ddp_resnet50.py", "1", "per device", "4", "4", "ok"),
        ("lightning/ddp_resnet50.py", "2", "per device", "4", "8", "ok")]
    assert [row[1] for row in rows] == ["ddp"] * 5 + ["lightning_ddp"] * 2  # script options that never vary: hidden
    # The two ok 2-process weak runs are repeats: the median of each figure, and their spread.
    a, b = fixture("native-weak-2proc-a")["throughput"], fixture("native-weak-2proc-b")["throughput"]
    median = statistics.median([a["images_per_second"], b["images_per_second"]])
    spread = abs(a["images_per_second"] - b["images_per_second"]) / median
    rank0 = statistics.median([a["rank0_median_images_per_second"], b["rank0_median_images_per_second"]])
    mad = statistics.median([a["rank0_mad_images_per_second"], b["rank0_mad_images_per_second"]])
    assert rows[3][6:11] == [f"{shown(rank0)} ± {shown(mad, like=rank0)}", shown(median), "n/a", "2",
                             f"{spread * 100:.1f} %"]
    assert rows[2][6:11] == [rank0_text("native-weak-1proc"), shown(rate("native-weak-1proc")), "n/a", "1", "–"]
    failure = fixture("native-desync-2proc")["failure"]["message"]
    assert f"- ✗ desync in `native-desync-2proc.json`: {failure}" in markdown
    assert "Results from `tests/fixtures/results` (15 files)." in markdown


def test_scaling_tables_pair_runs_that_differ_only_in_world_size():
    markdown = run_report(FIXTURES).stdout
    weak = table_rows(markdown, "Weak scaling")
    native_two = statistics.median([rate("native-weak-2proc-a"), rate("native-weak-2proc-b")])
    expected = []
    for benchmark, one, two in [("ddp_resnet50.py", rate("native-weak-1proc"), native_two),
                                ("lightning/ddp_resnet50.py", rate("lightning-weak-1proc"),
                                 rate("lightning-weak-2proc"))]:
        strategy = "ddp" if benchmark == "ddp_resnet50.py" else "lightning_ddp"
        expected += [[benchmark, strategy, "4", "1", "4", shown(one), shown(one), "1.00×", "1.00×", "100.0 %"],
                     [benchmark, strategy, "4", "2", "8", shown(two), shown(two / 2), f"{two / one:.2f}×", "2.00×",
                      f"{two / (2 * one) * 100:.1f} %"]]  # efficiency = throughput at N / (N x throughput at 1)
    assert weak == expected
    strong = table_rows(markdown, "Strong scaling")
    one, two = rate("native-strong-1proc"), rate("native-strong-2proc")
    assert strong == [
        ["ddp_resnet50.py", "ddp", "8", "1", "8", shown(one), shown(one), "1.00×", "1.00×", "100.0 %"],
        ["ddp_resnet50.py", "ddp", "8", "2", "4", shown(two), shown(two / 2), f"{two / one:.2f}×", "2.00×",
         f"{two / one / 2 * 100:.1f} %"]]


def test_lightning_table_pairs_the_twins_of_one_configuration():
    rows = table_rows(run_report(FIXTURES).stdout, "Lightning against native DDP")
    native_two = statistics.median([rate("native-weak-2proc-a"), rate("native-weak-2proc-b")])
    pairs = [("1", rate("native-weak-1proc"), rate("lightning-weak-1proc")),
             ("2", native_two, rate("lightning-weak-2proc"))]
    # The desync run and the strong-scaling runs have no Lightning twin and stay out.
    # Results from before the variant was recorded ran the matched one.
    assert rows == [[size, "per device", "4", "ddp", shown(native), "lightning_ddp", "matched", shown(lightning),
                     f"{lightning / native:.2f}×", "n/a", "n/a", "–"] for size, native, lightning in pairs]


def test_sharding_table_compares_every_strategy_with_ddp():
    markdown = run_report(FIXTURES).stdout
    rows = table_rows(markdown, "Sharding strategies")
    baseline = rate("oss-ddp")
    # In the order of how much each strategy shards; the OOM run after the ok run of its strategy.
    assert [row[2:] for row in rows] == [
        ["ddp", rank0_text("oss-ddp"), shown(baseline), "baseline", "n/a", "baseline", "ok"],
        *[[name, rank0_text(f"oss-{name}"), shown(rate(f"oss-{name}")), f"{rate(f'oss-{name}') / baseline:.2f}×",
           "n/a", "n/a", "ok"] for name in SHARDING[1:]],
        ["fsdp_zero3", "–", "–", "–", "–", "–", "**✗ oom**"]]
    # The OOM run never saw its hardware: it joins its folder's CPU setup rather than a setup of its own.
    assert markdown.count("## CPU") == 1
    assert "- ✗ oom in `oss-fsdp_zero3-oom.json`: OutOfMemoryError: CUDA out of memory" in markdown


def test_sharding_table_memory_saved_against_ddp(tmp_path):
    """The real oss_benchmark.py results with GPU-like memory figures (with_memory): the arithmetic."""
    figures = {"ddp": 9000.0, "oss_ddp": 7000.0, "oss_sharded_ddp": 6500.0, "zero1": 7100.0, "fsdp_zero2": 5000.0,
               "fsdp_zero3": 4500.0}
    for name, mib in figures.items():
        write(tmp_path / f"oss-{name}.json", with_memory(fixture(f"oss-{name}"), mib))
    write(tmp_path / "oss-fsdp_zero3-oom.json", fixture("oss-fsdp_zero3-oom"))
    rows = table_rows(run_report(tmp_path).stdout, "Sharding strategies")
    assert [(row[2], row[6], row[7], row[8]) for row in rows] == [
        ("ddp", "9,000", "baseline", "ok"), ("oss_ddp", "7,000", "2,000 MiB (22.2 %)", "ok"),
        ("oss_sharded_ddp", "6,500", "2,500 MiB (27.8 %)", "ok"), ("zero1", "7,100", "1,900 MiB (21.1 %)", "ok"),
        ("fsdp_zero2", "5,000", "4,000 MiB (44.4 %)", "ok"), ("fsdp_zero3", "4,500", "4,500 MiB (50.0 %)", "ok"),
        ("fsdp_zero3", "–", "–", "**✗ oom**")]


def test_options_that_differ_split_configurations_and_are_shown(tmp_path):
    base = fixture("native-weak-2proc-a")
    bigger = copy.deepcopy(base)
    bigger["config"]["bucket_cap_mb"] = 50.0
    write(tmp_path / "a.json", base)
    write(tmp_path / "b.json", bigger)
    rows = table_rows(run_report(tmp_path).stdout, "All configurations")
    assert [(row[1], row[9]) for row in rows] == [("ddp (bucket_cap_mb=25.0)", "1"), ("ddp (bucket_cap_mb=50.0)", "1")]


def test_an_option_only_a_newer_result_records_is_shown_only_where_it_alone_tells_results_apart(tmp_path):
    older = fixture("native-weak-2proc-a")
    newer = copy.deepcopy(older)
    older["config"]["bucket_cap_mb"], newer["config"]["bucket_cap_mb"] = 25.0, 50.0
    newer["config"]["added_option"] = "on"  # an option the older script did not record
    write(tmp_path / "two" / "older.json", older)
    write(tmp_path / "two" / "newer.json", newer)
    rows = table_rows(run_report(tmp_path / "two").stdout, "All configurations")
    assert sorted(row[1] for row in rows) == ["ddp (bucket_cap_mb=25.0)", "ddp (bucket_cap_mb=50.0)"]
    newer["config"]["bucket_cap_mb"] = 25.0  # now the absence alone tells the two apart: it is shown
    write(tmp_path / "one" / "older.json", older)
    write(tmp_path / "one" / "newer.json", newer)
    rows = table_rows(run_report(tmp_path / "one").stdout, "All configurations")
    assert sorted(row[1] for row in rows) == ["ddp (added_option unset)", "ddp (added_option=on)"]


def test_report_is_deterministic_and_independent_of_input_order(report):
    files = sorted(FIXTURES.glob("*.json"))
    forward = report.render_markdown(report.load_runs(files), ROOT)
    backward = report.render_markdown(report.load_runs(files[::-1]), ROOT)
    assert forward == backward == report.render_markdown(report.load_runs([FIXTURES]), ROOT)


def test_markdown_file_output(tmp_path):
    out = tmp_path / "report.md"
    proc = run_report(FIXTURES, "--markdown", out)
    assert proc.returncode == 0 and proc.stdout.strip() == f"wrote {out}"
    assert out.read_text().startswith("# Benchmark results\n") and "**Weak scaling**" in out.read_text()


def test_noisy_results_are_marked_and_repeats_still_aggregated(tmp_path):
    write(tmp_path / "one.json", noisy(fixture("native-weak-1proc")))
    write(tmp_path / "a.json", noisy(fixture("native-weak-2proc-a"), "halves differ, host-bound"))
    write(tmp_path / "b.json", fixture("native-weak-2proc-b"))
    write(tmp_path / "steady.json", fixture("native-strong-1proc"))
    write(tmp_path / "lightning.json", fixture("lightning-weak-1proc"))
    markdown = run_report(tmp_path).stdout
    rows = [row for row in table_rows(markdown, "All configurations") if row[0] == "ddp_resnet50.py"]
    assert [(row[2], row[3], row[9], row[11]) for row in rows] == [
        ("1", "global", "1", "ok"), ("1", "per device", "1", "ok, noisy: repeat or interleave"),
        ("2", "per device", "2", "ok, 1 of 2 runs noisy: repeat or interleave")]
    [pair] = table_rows(markdown, "Lightning against native DDP")
    assert pair[8] == f"{rate('lightning-weak-1proc') / rate('native-weak-1proc'):.2f}× (noisy: repeat or interleave)"
    assert rows[2][7] == shown(statistics.median([rate("native-weak-2proc-a"), rate("native-weak-2proc-b")]))
    assert ("- noisy: repeat or interleave: `one.json`: halves differ\n"
            "- noisy: repeat or interleave: `a.json`: halves differ, host-bound") in markdown
    # A regression found in a noisy run says that it may be noise.
    slower = noisy(fixture("native-weak-1proc"))
    slower["throughput"]["images_per_second"] *= 0.5
    proc = run_report(write(tmp_path / "current" / "slower.json", slower), "--check-against",
                      FIXTURES / "native-weak-1proc.json")
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[0].endswith(", 32 px, fp32 (noisy: repeat or interleave: halves differ)")


def test_peak_memory_of_different_windows_is_not_pooled_and_says_its_window(tmp_path):
    write(tmp_path / "a.json", with_memory(fixture("native-weak-2proc-a"), 1000.0))
    write(tmp_path / "b.json", in_window(with_memory(fixture("native-weak-2proc-b"), 1200.0)))
    write(tmp_path / "one.json", with_memory(fixture("native-weak-1proc"), 900.0))
    write(tmp_path / "lightning-one.json", in_window(with_memory(fixture("lightning-weak-1proc"), 990.0)))
    write(tmp_path / "lightning-two.json", with_memory(fixture("lightning-weak-2proc"), 1100.0))
    markdown = run_report(tmp_path).stdout
    assert "| Throughput (img/s) | Peak memory (MiB) | runs |" in markdown  # the column mixes windows
    rows = table_rows(markdown, "All configurations")
    assert [(row[0], row[2], row[8], row[9]) for row in rows] == [
        ("ddp_resnet50.py", "1", "900 (timed steps)", "1"),
        ("ddp_resnet50.py", "2", "1,200 (every step after the first); 1,000 (timed steps)", "2"),
        ("lightning/ddp_resnet50.py", "1", "990 (every step after the first)", "1"),
        ("lightning/ddp_resnet50.py", "2", "1,100 (timed steps)", "1")]
    # Lightning against native: over the window both measured, else each figure with its own and no ratio.
    assert [row[9:] for row in table_rows(markdown, "Lightning against native DDP")] == [
        ["900 (timed steps)", "990 (every step after the first)", "–"],
        ["1,000 (timed steps)", "1,100 (timed steps)", "1.10×"]]
    # Sharding: memory saved only against a ddp baseline of the same window.
    write(tmp_path / "oss" / "oss-ddp.json", with_memory(fixture("oss-ddp"), 9000.0))
    write(tmp_path / "oss" / "oss-zero1.json", in_window(with_memory(fixture("oss-zero1"), 7000.0)))
    write(tmp_path / "oss" / "oss-oss_ddp.json", with_memory(fixture("oss-oss_ddp"), 7000.0))
    rows = table_rows(run_report(tmp_path / "oss").stdout, "Sharding strategies")
    assert [(row[2], row[6], row[7]) for row in rows] == [
        ("ddp", "9,000 (timed steps)", "baseline"), ("oss_ddp", "7,000 (timed steps)", "2,000 MiB (22.2 %)"),
        ("zero1", "7,000 (every step after the first)", "– (other memory window)")]
    # One window throughout: the column's title names it.
    single = run_report(tmp_path / "oss" / "oss-ddp.json").stdout
    assert "| Throughput (img/s) | Peak memory (MiB, timed steps) | runs |" in single


def test_lightning_variants_are_shown_and_kept_apart(tmp_path):
    for name in ("native-weak-1proc", "native-weak-2proc-a", "lightning-weak-1proc", "lightning-weak-2proc"):
        write(tmp_path / f"{name}.json", fixture(name))
    stock, matched = fixture("lightning-weak-2proc"), fixture("lightning-weak-2proc")
    stock["config"]["lightning_variant"], matched["config"]["lightning_variant"] = "stock", "matched"
    write(tmp_path / "lightning-stock.json", stock)
    write(tmp_path / "lightning-matched.json", matched)
    markdown = run_report(tmp_path).stdout
    # A result that recorded no variant ran the matched one: it pools with one that says so, not with stock.
    lightning = [row for row in table_rows(markdown, "All configurations") if row[0] == "lightning/ddp_resnet50.py"]
    assert [(row[1], row[2], row[9]) for row in lightning] == [
        ("lightning_ddp (lightning_variant=matched)", "1", "1"),
        ("lightning_ddp (lightning_variant=matched)", "2", "2"), ("lightning_ddp (lightning_variant=stock)", "2", "1")]
    pairs = table_rows(markdown, "Lightning against native DDP")
    assert [(row[0], row[6], row[7]) for row in pairs] == [
        ("1", "matched", shown(rate("lightning-weak-1proc"))), ("2", "matched", shown(rate("lightning-weak-2proc"))),
        ("2", "stock", shown(rate("lightning-weak-2proc")))]
    reference = FIXTURES / "lightning-weak-2proc.json"
    assert run_report(tmp_path / "lightning-matched.json", "--check-against", reference).returncode == 0
    proc = run_report(tmp_path / "lightning-stock.json", "--check-against", reference)
    assert proc.returncode == 2 and "incomparable" in proc.stderr


# ---------------------------------------------------------------------------- plots

def test_plots_are_written_as_png(tmp_path):
    inputs = tmp_path / "inputs"
    for path in FIXTURES.glob("*.json"):
        write(inputs / path.name, json.loads(path.read_text()))
    for name, mib in {"ddp": 9000.0, "zero1": 6000.0, "fsdp_zero3": 4500.0}.items():
        write(inputs / f"oss-{name}.json", with_memory(fixture(f"oss-{name}"), mib))
    plots = tmp_path / "plots"
    proc = run_report(inputs, "--plots", plots)
    assert proc.returncode == 0, proc.stderr
    written = sorted(path.name.split("-")[0] for path in plots.glob("*.png"))
    assert written == ["memory", "scaling", "step_times"]
    for path in plots.glob("*.png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
        assert f"wrote {path}" in proc.stdout


def test_cpu_results_have_no_memory_plot_and_say_so(tmp_path):
    proc = run_report(FIXTURES, "--plots", tmp_path)
    assert proc.returncode == 0
    assert sorted(path.name.split("-")[0] for path in tmp_path.glob("*.png")) == ["scaling", "step_times"]
    assert "no memory plot" in proc.stderr and "no GPU memory counters" in proc.stderr


# ---------------------------------------------------------------------------- regression check

def test_check_passes_against_itself_with_both_tolerance_spellings():
    for tolerance in ("5%", "0.05"):
        proc = run_report(FIXTURES / "native-weak-1proc.json", "--check-against", FIXTURES / "native-weak-1proc.json",
                          "--tolerance", tolerance)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.startswith("check passed: 1 result within 5.0% of")


def test_check_fails_on_a_throughput_drop_beyond_the_tolerance(tmp_path):
    reference = fixture("native-weak-1proc")
    worse = copy.deepcopy(reference)
    worse["throughput"]["images_per_second"] *= 0.9  # a 10 % drop
    current = write(tmp_path / "current.json", worse)
    proc = run_report(current, "--check-against", FIXTURES / "native-weak-1proc.json", "--tolerance", "5%")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"REGRESSION {current}: throughput dropped 10.0% (")
    assert lines[1].startswith("check failed: 1 violation")
    assert run_report(current, "--check-against", FIXTURES / "native-weak-1proc.json",
                      "--tolerance", "15%").returncode == 0


def test_check_fails_on_a_memory_rise_beyond_the_tolerance(tmp_path):
    reference = write(tmp_path / "reference.json", with_memory(fixture("native-weak-1proc"), 1000.0))
    current = write(tmp_path / "current" / "current.json", with_memory(fixture("native-weak-1proc"), 1100.0))
    proc = run_report(current, "--check-against", reference, "--tolerance", "0.05")
    assert proc.returncode == 1
    assert "peak memory rose 10.0% (1,000 -> 1,100 MiB, timed steps), more than 5.0%" in proc.stdout
    assert run_report(current, "--check-against", reference, "--tolerance", "10.5%").returncode == 0


def test_check_fails_on_a_non_ok_status():
    proc = run_report(FIXTURES / "native-desync-2proc.json", FIXTURES / "native-weak-2proc-a.json",
                      "--check-against", FIXTURES / "native-weak-2proc-b.json", "--tolerance", "50%")
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[0] == ("REGRESSION tests/fixtures/results/native-desync-2proc.json: status "
                                           "desync: parameters differ across ranks by up to 9.41")


def test_check_uses_the_median_of_reference_repeats(tmp_path):
    a, b = fixture("native-weak-2proc-a"), fixture("native-weak-2proc-b")
    reference = statistics.median([a["throughput"]["images_per_second"], b["throughput"]["images_per_second"]])
    current = copy.deepcopy(a)
    current["throughput"]["images_per_second"] = reference * 0.97
    path = write(tmp_path / "current.json", current)
    folder = FIXTURES  # the folder holds both repeats (and runs of other configurations, not matched)
    assert run_report(path, "--check-against", folder, "--tolerance", "4%").returncode == 0
    assert run_report(path, "--check-against", folder, "--tolerance", "2%").returncode == 1


def test_check_reports_results_without_a_reference_and_refuses_an_incomparable_one():
    proc = run_report(FIXTURES / "native-weak-1proc.json", FIXTURES / "native-strong-1proc.json",
                      "--check-against", FIXTURES / "native-weak-1proc.json")
    assert proc.returncode == 0
    assert "native-strong-1proc.json: no reference result with its configuration, not checked" in proc.stderr
    proc = run_report(FIXTURES / "native-strong-1proc.json", "--check-against", FIXTURES / "native-weak-2proc-a.json")
    assert proc.returncode == 2
    [line] = one_error_line(proc.stderr)
    assert line.startswith("report.py: error: incomparable: no result in ")


def test_check_compares_peak_memory_only_over_the_same_window(tmp_path):
    current = write(tmp_path / "current.json", in_window(with_memory(fixture("native-weak-1proc"), 1500.0)))
    timed = write(tmp_path / "timed" / "reference.json", with_memory(fixture("native-weak-1proc"), 1000.0))
    proc = run_report(current, "--check-against", timed, "--tolerance", "5%")
    assert proc.returncode == 0 and proc.stdout.startswith("check passed: 1 result within 5.0% of ")
    assert one_error_line(proc.stderr) == [
        f"report.py: note: {current}: peak memory not compared: the memory windows differ (here: every step after "
        "the first; reference: timed steps)"]
    # A reference of the same window as well: that one is compared.
    write(tmp_path / "timed" / "same-window.json", in_window(with_memory(fixture("native-weak-1proc"), 1000.0)))
    proc = run_report(current, "--check-against", tmp_path / "timed", "--tolerance", "5%")
    assert proc.returncode == 1
    assert "peak memory rose 50.0% (1,000 -> 1,500 MiB, every step after the first), more than 5.0%" in proc.stdout


def test_a_current_harness_run_finds_its_committed_reference(tmp_path, native, report):
    """A default one-GPU run as the current harness records it (its config resolved by the script itself, before any
    GPU work; the figures of a committed run) is checked against the committed results of that configuration:
    --timeout, the DDP options now always recorded and a null cuDNN limit do not make it another configuration;
    its peak memory is compared only with results whose peak covers the same steps."""
    args = native.parse_arguments(["--output", str(tmp_path / "run.json")])
    config = native.resolve_harness_config(args, native.detect_launch({}), native.STRATEGY, True, 1, True)
    config.update(model="resnet50", optimizer="sgd", optimizer_impl="fused")  # as main() does on a GPU, not in fp16
    assert config["timeout"] == 300 and config["cudnn_benchmark_limit"] is None and config["broadcast_buffers"]
    result = json.loads((ROOT / "results" / "nvidia-h200-x2-2026-11-30e" / "s10-native-1gpu-bf16-256-a.json")
                        .read_text())
    result.update(config=config, stability=harness("stability"))
    result["memory"].update(window=NEW_WINDOW)
    result["throughput"]["images_per_second"] *= 1.5  # a rise is never a regression: the tolerance is not the point
    path = write(tmp_path / "run.json", result)
    proc = run_report(path, "--check-against", "results", "--tolerance", "2%")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("check passed: 1 result within 2.0% of results")
    # In the report it is one more repeat of the committed configuration.
    [row] = [row for row in report.aggregate(report.load_runs(["results", path]))
             if path in [run["path"] for run in row["runs"]]]
    assert len(row["runs"]) > 1


@pytest.mark.parametrize("tolerance", ["5", "-1%", "150%", "five", "nan"])
def test_bad_tolerances_are_refused(tolerance):
    proc = run_report(FIXTURES, "--check-against", FIXTURES, f"--tolerance={tolerance}")
    assert proc.returncode == 2
    [line] = one_error_line(proc.stderr)
    assert line.startswith(f"report.py: error: --tolerance '{tolerance}'")


def test_parse_tolerance(report):
    assert report.parse_tolerance("5%") == report.parse_tolerance("0.05") == pytest.approx(0.05)
    assert report.parse_tolerance("0%") == 0


# ---------------------------------------------------------------------------- bad inputs

def test_files_that_are_not_results_are_skipped_with_one_warning_each(tmp_path):
    (tmp_path / "notes.json").write_text("not json at all")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "other.json").write_text(json.dumps({"hello": "world"}))
    newer = fixture("native-weak-1proc")
    newer["schema_version"] = 2
    write(tmp_path / "newer.json", newer)
    broken = fixture("native-weak-1proc")
    broken["throughput"]["images_per_second"] = "fast"
    write(tmp_path / "broken.json", broken)
    truncated = fixture("native-weak-1proc")
    del truncated["config"]["batch_mode"]
    write(tmp_path / "truncated.json", truncated)
    empty_world = fixture("native-weak-1proc")
    empty_world["world"]["world_size"] = 0
    write(tmp_path / "empty-world.json", empty_world)
    unmeasured = fixture("native-weak-1proc")
    unmeasured["throughput"] = None
    write(tmp_path / "unmeasured.json", unmeasured)
    null_rate = fixture("native-weak-1proc")
    null_rate["throughput"]["images_per_second"] = None
    write(tmp_path / "null-rate.json", null_rate)
    odd_environment = fixture("native-weak-1proc")
    odd_environment["software"]["environment"] = ["NCCL_DEBUG=INFO"]
    write(tmp_path / "odd-environment.json", odd_environment)
    (tmp_path / "README.md").write_text("not read: folders give only their *.json files")
    write(tmp_path / ".tmp-half-written.json", {})  # a run still writing its result: hidden, left alone
    write(tmp_path / "good.json", fixture("native-weak-1proc"))
    proc = run_report(tmp_path)
    assert proc.returncode == 0 and "| ddp_resnet50.py | ddp | 1 |" in proc.stdout
    warnings = one_error_line(proc.stderr)
    assert sorted(warnings) == sorted([
        f"report.py: warning: input {tmp_path / 'broken.json'}: skipped: throughput.images_per_second is "
        "'fast', not a number",
        f"report.py: warning: input {tmp_path / 'empty-world.json'}: skipped: world.world_size is 0, not a positive "
        "integer",
        f"report.py: warning: input {tmp_path / 'unmeasured.json'}: skipped: status ok but "
        "throughput.images_per_second is missing",
        f"report.py: warning: input {tmp_path / 'null-rate.json'}: skipped: status ok but "
        "throughput.images_per_second is missing",
        f"report.py: warning: input {tmp_path / 'list.json'}: skipped: not a benchmark result (no schema_version)",
        f"report.py: warning: input {tmp_path / 'odd-environment.json'}: skipped: software.environment is "
        "['NCCL_DEBUG=INFO'], not a dict",
        f"report.py: warning: input {tmp_path / 'newer.json'}: skipped: schema_version 2, this report reads "
        "version 1",
        f"report.py: warning: input {tmp_path / 'notes.json'}: skipped: not JSON (Expecting value: line 1 "
        "column 1 (char 0))",
        f"report.py: warning: input {tmp_path / 'other.json'}: skipped: not a benchmark result (no schema_version)",
        f"report.py: warning: input {tmp_path / 'truncated.json'}: skipped: not a benchmark result "
        "(config.batch_mode is missing)"])


def test_inputs_that_are_all_invalid_are_named_in_one_line(tmp_path):
    broken = tmp_path / "broken"
    (broken / "notes.json").parent.mkdir()
    (broken / "notes.json").write_text("not json at all")
    write(broken / "other.json", {"hello": "world"})
    expected = (f"{broken}: no valid result file, 2 files skipped as invalid ({broken / 'notes.json'}: not JSON "
                f"(Expecting value: line 1 column 1 (char 0)); {broken / 'other.json'}: not a benchmark result (no "
                "schema_version))")
    proc = run_report(broken)
    assert proc.returncode == 2 and proc.stdout == ""
    assert one_error_line(proc.stderr) == [f"report.py: error: {expected}"]
    proc = run_report(FIXTURES / "native-weak-1proc.json", "--check-against", broken)
    assert proc.returncode == 2 and one_error_line(proc.stderr) == [f"report.py: error: --check-against {expected}"]
    for index in range(3):
        write(broken / f"more-{index}.json", [index])
    [line] = one_error_line(run_report(broken).stderr)
    assert line.startswith(f"report.py: error: {broken}: no valid result file, 5 files skipped as invalid (")
    assert line.endswith("; 2 more)")


@pytest.mark.parametrize("args, message", [
    (["/no/such/folder"], "report.py: error: /no/such/folder: no such file or folder"),
    (["{empty}"], "report.py: error: no result files in {empty}"),
    (["{fixtures}", "--tolerance", "5%"], "report.py: error: --tolerance needs --check-against"),
    (["{fixtures}", "--check-against", "/no/such/reference"],
     "report.py: error: /no/such/reference: no such file or folder"),
    (["{fixtures}", "--check-against", "{empty}"], "report.py: error: --check-against {empty}: no result files"),
    (["{fixtures}", "--check-markdown", "{empty}/results.md"],
     "report.py: error: --check-markdown {empty}/results.md: cannot be read (No such file or directory)"),
    (["{fixtures}", "--update-readme", "{empty}/README.md"],
     "report.py: error: unrecognized arguments: --update-readme {empty}/README.md"),
    ([], "report.py: error: the following arguments are required: PATH"),
    (["{fixtures}", "--check-against", "{fixtures}", "--tolerance", ""],
     "report.py: error: --tolerance '': write a percentage (5%) or a fraction (0.05)"),
    (["{fixtures}", "--plots", "{fixtures}/../make_report_fixtures.sh/plots"],
     "report.py: error: --plots {fixtures}/../make_report_fixtures.sh/plots: cannot be written (Not a directory)"),
    (["{fixtures}", "--markdown", "{empty}/m.md", "--check-against", "{empty}"],
     "report.py: error: --check-against {empty}: no result files"),
    (["{fixtures}/native-strong-1proc.json", "--markdown", "{empty}/m.md", "--check-against",
      "{fixtures}/native-weak-2proc-a.json"], "report.py: error: incomparable: "),
    (["{fixtures}/native-strong-1proc.json", "--markdown", "{empty}/m.md", "--check-against",
      "{fixtures}/native-desync-2proc.json"], "report.py: error: --check-against {fixtures}/native-desync-2proc.json: "
                                              "no result with status ok to compare with"),
])
def test_unusable_invocations_exit_2_with_one_line(tmp_path, args, message):
    empty = tmp_path / "empty"
    empty.mkdir()
    fill = {"empty": empty, "fixtures": FIXTURES}
    proc = run_report(*[arg.format(**fill) for arg in args])
    assert proc.returncode == 2 and proc.stdout == ""
    lines = one_error_line(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith(message.format(**fill)), lines
    assert not list(empty.iterdir())  # an unusable reference stops the run before anything is written


# ---------------------------------------------------------------------------- the generated Markdown file

def test_committed_results_markdown_agrees_with_the_report_of_results():
    proc = run_report("results", "--check-markdown", "docs/results.md")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "docs/results.md: agrees with the report of results"


def test_markdown_file_is_the_same_wherever_made_and_check_sees_staleness(tmp_path):
    results = tmp_path / "results" / "cpu-2026-11-29"
    for name in ("native-weak-1proc", "native-weak-2proc-a"):
        write(results / f"{name}.json", fixture(name))
    assert run_report("results", "--markdown", "results.md", cwd=tmp_path).returncode == 0
    text = (tmp_path / "results.md").read_text()
    # Paths relative to the file's folder where it lies outside the repository, as this one does (inside it, relative
    # to the repository: docs/results.md names results/).
    assert text.startswith("# Benchmark results\n\n<!-- generated by `python report.py results --markdown "
                           "results.md`: edit the results, not this file -->\n\n")
    assert "\n## CPU (" in text and "Results from `results/cpu-2026-11-29` (2 files)." in text
    # The same file whichever way the folder is named and wherever the command runs.
    again = run_report(tmp_path / "results", "--check-markdown", tmp_path / "results.md", cwd=ROOT)
    assert again.returncode == 0, again.stderr
    write(results / "native-weak-2proc-b.json", fixture("native-weak-2proc-b"))
    stale = run_report("results", "--check-markdown", "results.md", cwd=tmp_path)
    assert stale.returncode == 1 and stale.stdout == ""
    assert one_error_line(stale.stderr) == ["results.md: differs from the report of results: run python report.py "
                                            "results --markdown results.md"]
    assert (tmp_path / "results.md").read_text() == text  # a check writes nothing


def test_markdown_file_without_results_says_so(tmp_path):
    (tmp_path / "results").mkdir()
    assert run_report("results", "--markdown", "results.md", cwd=tmp_path).returncode == 0
    assert "No results committed yet" in (tmp_path / "results.md").read_text()
    assert run_report("results", "--check-markdown", "results.md", cwd=tmp_path).returncode == 0


def test_compiled_ddp_mode_is_read_from_what_each_script_does(report):
    """Results that recorded no compiled-DDP mode are paired by what their script did: both split the graph
    at DDP's buckets (PyTorch's default)."""
    config = {"compile": True, "compiled_ddp": None}
    assert report.effective_options(config, report.NATIVE, 2)["compiled_ddp"] == "ddp_optimizer"
    assert report.effective_options(config, report.LIGHTNING, 2)["compiled_ddp"] == "ddp_optimizer"
    assert report.effective_options(config, report.OSS, 2)["compiled_ddp"] is None
    assert report.effective_options(config, report.NATIVE, 1)["compiled_ddp"] is None  # one rank: no DDP at all
    eager = {"compile": False, "compiled_ddp": None}
    assert report.effective_options(eager, report.LIGHTNING, 2)["compiled_ddp"] is None


def test_results_from_before_comm_hook_ran_ddps_own_all_reduce(report):
    assert report.effective_options({}, report.NATIVE, 2)["comm_hook"] == "none"
    assert report.effective_options({"comm_hook": "bf16_compress"}, report.NATIVE, 2)["comm_hook"] == "bf16_compress"


def test_inductor_tuning_is_read_from_the_config_or_the_recorded_environment(report):
    """Runs tuned through environment variables (before --coordinate-descent-tuning existed) are told apart
    from untuned ones, and from each other where another TORCHINDUCTOR_ variable changed the kernels."""
    compiled = {"compile": True, "compile_mode": "default"}
    tuned = {"TORCHINDUCTOR_COORDINATE_DESCENT_TUNING": "1", "TORCHINDUCTOR_CACHE_DIR": "/tmp/x"}
    options = report.effective_options(compiled, report.NATIVE, 1, tuned)
    assert options["coordinate_descent_tuning"] is True and "inductor_environment" not in options
    assert report.effective_options(compiled, report.NATIVE, 1, {})["coordinate_descent_tuning"] is False
    assert report.effective_options({"compile": False, "compile_mode": None}, report.NATIVE, 1,
                                    tuned)["coordinate_descent_tuning"] is False
    autotune = {"compile": True, "compile_mode": "max-autotune-no-cudagraphs"}
    options = report.effective_options(autotune, report.NATIVE, 1, {"TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS": "ATEN"})
    assert options["coordinate_descent_tuning"] is True  # the mode turns it on
    assert options["inductor_environment"] == {"TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS": "ATEN"}
    # a newer script records what ran: the record wins
    recorded = {**compiled, "coordinate_descent_tuning": False}
    assert report.effective_options(recorded, report.NATIVE, 1, tuned)["coordinate_descent_tuning"] is False


def test_cudnn_benchmark_limit_is_pytorchs_default_where_a_result_recorded_none(report):
    """Results from before --cudnn-benchmark-limit ran with PyTorch's limit of 10 where cuDNN autotuned, so they
    pair with newer results that record it."""
    assert report.effective_options({"cudnn_benchmark": True}, report.NATIVE, 1)["cudnn_benchmark_limit"] == 10
    assert report.effective_options({"cudnn_benchmark": False}, report.NATIVE, 1)["cudnn_benchmark_limit"] is None
    assert report.effective_options({"cudnn_benchmark": True, "cudnn_benchmark_limit": 0}, report.NATIVE,
                                    1)["cudnn_benchmark_limit"] == 0
    # The current harness records null: it leaves PyTorch's limit as it is.
    assert report.effective_options({"cudnn_benchmark": True, "cudnn_benchmark_limit": None}, report.NATIVE,
                                    1)["cudnn_benchmark_limit"] == 10


def test_ddp_options_and_loss_scale_are_the_defaults_where_a_result_recorded_none(report):
    """Results from before --broadcast-buffers and --loss-scale ran DDP's buffer broadcast and, in fp16, the dynamic
    GradScaler, which is what the current harness records for a run without those options."""
    assert report.effective_options({}, report.OSS, 2)["broadcast_buffers"] is True
    assert report.effective_options({"broadcast_buffers": False}, report.OSS, 2)["broadcast_buffers"] is False
    assert report.effective_options({"grad_scaler": True}, report.NATIVE, 1)["loss_scale"] == "dynamic"
    assert report.effective_options({"grad_scaler": False}, report.NATIVE, 1)["loss_scale"] is None
    assert report.effective_options({"loss_scale": 1024.0}, report.NATIVE, 1)["loss_scale"] == 1024.0


def test_stem_and_batch_norm_are_torchvisions_where_a_result_recorded_none(report):
    """Results from before the computation options computed torchvision's stem and batch norms, so they pair with
    newer results that record them; the sharding benchmark has no such options and gets none."""
    for benchmark in (report.NATIVE, report.LIGHTNING):
        options = report.effective_options({}, benchmark, 1)
        assert (options["stem_conv"], options["max_pool_backward"], options["batch_norm"]) == \
            ("torchvision", "torchvision", "torchvision")
    recorded = {"stem_conv": "space_to_depth", "max_pool_backward": "dense", "batch_norm": "sums"}
    assert report.effective_options(recorded, report.NATIVE, 1) == {**recorded, "comm_hook": "none",
                                                                    "coordinate_descent_tuning": False,
                                                                    "cudnn_benchmark_limit": None,
                                                                    "broadcast_buffers": True, "loss_scale": None}
    assert "stem_conv" not in report.effective_options({}, report.OSS, 2)
    assert "batch_norm" not in report.effective_options({}, report.OSS, 2)


def test_long_setup_titles_keep_distinct_plot_names(report):
    title = "CPU (" + "x" * 120 + ") · torch 2 · resnet50 · 32 px · fp32 · contiguous · eager · "
    names = {report.slug(title + "sgd"), report.slug(title + "adam")}
    assert len(names) == 2 and all(len(name) <= 90 for name in names)
    assert report.slug("Short · title") == "short-title"
