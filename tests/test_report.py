"""report.py on real result files: reading them, the tables, the pairing rules, plots, the regression
check, the generated Markdown file (docs/results.md) and bad inputs.

The fixtures under tests/fixtures/results/ were written by ddp_resnet50.py, lightning/ddp_resnet50.py and
oss_benchmark.py in CPU runs, the one under tests/fixtures/harness-results/ by the current harness
(tests/fixtures/make_report_fixtures.sh). No benchmark runs here: every test reads files, and runs report.py's
main() in this process (run_report) but for the few that check the command line itself.
"""
import contextlib
import copy
import errno
import io
import json
import math
import os
import statistics
import subprocess
import sys

import pytest

from resnet50_ddp_benchmarks import analysis
from resnet50_ddp_benchmarks import pairing
from conftest import ROOT, clean_env, load_script, one_error_line, read_result

REPORT = ROOT / "report.py"
FIXTURES = ROOT / "tests" / "fixtures" / "results"
# A result of the current harness: its stability verdict, its memory window, every DDP option and --timeout recorded.
HARNESS_RESULT = ROOT / "tests" / "fixtures" / "harness-results" / "native-weak-1proc.json"
report = load_script(REPORT, "report_under_test")


def run_report(*args, cwd=ROOT):
    """report.py's command line in this process: (returncode, stdout, stderr) as the real one gives them."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = report.main([str(arg) for arg in args])
        except report.UsageError as error:
            print(f"report.py: error: {error}", file=sys.stderr)
            code = 2
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def run_report_process(*args, cwd=ROOT):
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


def tables_after(markdown, title):
    """The cells of every table that follows a bold title (one per sharding launch)."""
    return [table_rows(f"**{title}**{part}", title) for part in markdown.split(f"**{title}**")[1:]]


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


def on_gpus(result, *uuids, peak_tflops=989.0):
    """A CPU result as if it ran on GPUs with these UUIDs (one per rank): what the pairing rules key on."""
    result = copy.deepcopy(result)
    result["config"]["device"] = "cuda"
    result["hardware"]["ranks"] = [{"rank": rank, "hostname": "vm", "device": f"cuda:{rank}", "gpu_name": "NVIDIA H200",
                                    "gpu_uuid": uuid} for rank, uuid in enumerate(uuids)]
    result["efficiency"].update(peak_tflops_per_device=peak_tflops, mfu=0.25 if peak_tflops else None)
    return result


def rated(result, images_per_second):
    result = copy.deepcopy(result)
    result["throughput"]["images_per_second"] = images_per_second
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


def steady(result):
    result = copy.deepcopy(result)
    result["stability"] = harness("stability")
    return result


def noisy(result, reason="halves differ"):
    """A result whose stability, as the current harness writes it, says one run is not enough."""
    result = copy.deepcopy(result)
    result["stability"] = {**harness("stability"), "noisy": True, "reason": reason}
    return result


def launched(result, launch_id):
    result = copy.deepcopy(result)
    result["launch_id"] = launch_id
    return result


SHARDING = ["ddp", "oss_ddp", "oss_sharded_ddp", "zero1", "fsdp_zero2", "fsdp_zero3"]  # what gloo can run
UNKNOWN = "stability unknown"


@pytest.fixture(scope="module")
def committed():
    """Every committed result, read once: (runs, comparisons)."""
    return report.load_documents([ROOT / "results"])


# ---------------------------------------------------------------------------- reading and upgrading

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
    current = read_result(HARNESS_RESULT)
    assert set(current["stability"]) == {"second_half_over_first", "host_lead_ms_median", "host_ahead", "noisy",
                                         "reason"}
    assert current["memory"]["window"] and current["config"]["timeout"] == current["config"]["timeout_s"]


def test_committed_results_follow_the_schema():
    """Every committed result passes the validation (the schema through its fast sample); the sample catches a bad
    value anywhere in a long list."""
    files = sorted((ROOT / "results").rglob("*.json"))
    assert len(files) > 400
    for path in files:
        document = json.loads(path.read_text())
        # compare.py's files follow their own schema (test_compare.py); harness_cost.py's are no results either
        if not (analysis.is_comparison(document) or analysis.is_harness_cost(document)):
            assert analysis.document_problem(document) is None, path
    new = json.loads(HARNESS_RESULT.read_text())
    validator = analysis.result_validator()
    assert validator.is_valid(new)
    unlaunched = {key: value for key, value in new.items() if key != "launch_id"}
    assert analysis.document_problem(unlaunched) == "the top level: 'launch_id' is a required property"
    lightning = fixture("lightning-weak-1proc")
    for variant, valid in (("stock", True), ("matched", True), (None, True), ("tuned", False)):
        lightning["config"]["lightning_variant"] = variant
        assert validator.is_valid(lightning) is valid
    for broken in ({"memory": {**new["memory"], "window": ""}}, {"stability": {**new["stability"], "noisy": "yes"}},
                   {"stability": {key: value for key, value in new["stability"].items() if key != "reason"}},
                   {"config": {**new["config"], "timeout": 0}}):
        assert not validator.is_valid({**new, **broken}), broken
    assert validator.is_valid({**new, "stability": None})
    long_list = fixture("native-weak-2proc-a")
    long_list["step_times_ms_per_rank"][1] = [10.0] * 40 + [-1.0] + [10.0] * 40
    assert analysis.document_problem(long_list) == "step_times_ms_per_rank.1.40: -1.0 is less than the minimum of 0"
    long_list["step_times_ms_per_rank"][1][40] = "slow"
    assert analysis.document_problem(long_list) == "step_times_ms_per_rank.1.40: 'slow' is not of type 'number'"


def test_files_that_are_not_results_are_skipped_with_one_line_naming_the_first_broken_rule(tmp_path):
    (tmp_path / "notes.json").write_text("not json at all")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "other.json").write_text(json.dumps({"hello": "world"}))
    # tools/harness_cost.py's measurement: committed beside results, read by no table, not warned about
    write(tmp_path / "harness-cost.json", {"tool": "harness_cost", "ratio_pooled": 1.0, "block_times": []})
    write(tmp_path / "newer.json", {**fixture("native-weak-1proc"), "schema_version": 3})
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
    odd_environment = fixture("native-weak-1proc")
    odd_environment["software"]["environment"] = ["NCCL_DEBUG=INFO"]
    write(tmp_path / "odd-environment.json", odd_environment)
    # What the schema cannot say: fields that must agree, figures that must be finite.
    wrong_batch = fixture("native-weak-1proc")
    wrong_batch["config"]["global_batch_size"] = 5
    write(tmp_path / "wrong-batch.json", wrong_batch)
    (tmp_path / "nan.json").write_text(json.dumps(rated(fixture("native-weak-1proc"), float("nan"))))
    (tmp_path / "README.md").write_text("not read: folders give only their *.json files")
    write(tmp_path / ".tmp-half-written.json", {})  # a run still writing its result: hidden, left alone
    write(tmp_path / "good.json", fixture("native-weak-1proc"))
    proc = run_report("--all", tmp_path)
    assert proc.returncode == 0 and "| ddp_resnet50.py | ddp | 1 |" in proc.stdout
    prefix = f"report.py: warning: input {tmp_path}"
    assert sorted(one_error_line(proc.stderr)) == sorted([
        f"{prefix}/broken.json: skipped: throughput.images_per_second: 'fast' is not of type 'number'",
        f"{prefix}/empty-world.json: skipped: world.world_size: 0 is less than the minimum of 1",
        f"{prefix}/unmeasured.json: skipped: throughput: None is not of type 'object'",
        f"{prefix}/list.json: skipped: not a benchmark result (no schema_version)",
        f"{prefix}/odd-environment.json: skipped: software.environment: ['NCCL_DEBUG=INFO'] is not of type 'object'",
        f"{prefix}/newer.json: skipped: schema_version 3, the analysis tools read version 2",
        f"{prefix}/notes.json: skipped: not JSON (Expecting value: line 1 column 1 (char 0))",
        f"{prefix}/other.json: skipped: not a benchmark result (no schema_version)",
        f"{prefix}/truncated.json: skipped: config: 'batch_mode' is a required property",
        f"{prefix}/wrong-batch.json: skipped: config.global_batch_size is not config.batch_size_per_device x "
        "world.world_size",
        f"{prefix}/nan.json: skipped: throughput.images_per_second is nan, not a finite number"])


def test_deeply_nested_json_is_skipped_in_one_line_and_the_others_still_report(tmp_path):
    """The real command line: a RecursionError must not end the report."""
    (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)
    write(tmp_path / "good.json", fixture("native-weak-1proc"))
    proc = run_report_process("--all", tmp_path)
    assert proc.returncode == 0 and "| ddp_resnet50.py | ddp | 1 |" in proc.stdout
    [line] = one_error_line(proc.stderr)  # one warning, naming the file it skipped
    assert line.startswith("report.py: warning: ") and str(tmp_path / "deep.json") in line


def test_the_environment_and_cudnns_default_limit_belong_to_the_configuration():
    """A null cuDNN limit is PyTorch's default where cuDNN autotunes; Inductor's and NCCL's tuning variables from
    the recorded environment are options, their caches, logging and the machine's own settings are not."""
    result = fixture("native-weak-1proc")
    result["config"].update(cudnn_benchmark=True, cudnn_benchmark_limit=None)
    result["software"]["environment"] = {"TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS": "ATEN", "NCCL_DEBUG": "INFO",
                                         "TORCHINDUCTOR_CACHE_DIR": "/x", "NCCL_P2P_DISABLE": "1",
                                         "NCCL_NVLS_ENABLE": "0"}
    config = pairing.config_of(result)
    assert config["cudnn_benchmark_limit"] == 10
    assert config["inductor_environment"] == {"TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS": "ATEN"}
    assert config["nccl_environment"] == {"NCCL_P2P_DISABLE": "1"}
    result["config"].update(cudnn_benchmark=False)
    assert pairing.config_of(result)["cudnn_benchmark_limit"] is None


# ---------------------------------------------------------------------------- tables

def test_markdown_table_aggregates_repeats_and_marks_failures():
    proc = run_report("--all", FIXTURES)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    markdown = proc.stdout
    assert markdown.count("## CPU (") == 1  # one setup: every fixture ran on this CPU with one torch
    rows = [row for row in table_rows(markdown, "All configurations") if row[0] != "oss_benchmark.py"]
    header = markdown.split("**All configurations**", 1)[1].split("\n\n", 2)[1].splitlines()[0]
    assert ("| benchmark | strategy | processes | batch mode | batch (img/process) | global batch (img) | "
            "Median throughput (img/s) (rank 0) ± MAD | Throughput (img/s) | range over runs (spread) | MFU | "
            "Peak memory (MiB) | runs | status |") == header
    # Strong scaling rows (global batch 8) first, then weak (4 per process); the failed run after its twin.
    assert [(row[0], row[2], row[3], row[4], row[5], row[12]) for row in rows] == [
        ("ddp_resnet50.py", "1", "global", "8", "8", f"ok, {UNKNOWN}"),
        ("ddp_resnet50.py", "2", "global", "4", "8", f"ok, {UNKNOWN}"),
        ("ddp_resnet50.py", "1", "per device", "4", "4", f"ok, {UNKNOWN}"),
        ("ddp_resnet50.py", "2", "per device", "4", "8", f"ok, {UNKNOWN}"),
        ("ddp_resnet50.py", "2", "per device", "4", "8", "**✗ desync**"),
        ("lightning/ddp_resnet50.py", "1", "per device", "4", "4", f"ok, {UNKNOWN}"),
        ("lightning/ddp_resnet50.py", "2", "per device", "4", "8", f"ok, {UNKNOWN}")]
    assert [row[1] for row in rows] == ["ddp"] * 5 + ["lightning_ddp"] * 2  # script options that never vary: hidden
    # The two ok 2-process weak runs are repeats: the median of each figure, the range over both, their count.
    a, b = fixture("native-weak-2proc-a")["throughput"], fixture("native-weak-2proc-b")["throughput"]
    low, high = sorted([a["images_per_second"], b["images_per_second"]])
    median = statistics.median([low, high])
    rank0 = statistics.median([a["rank0_median_images_per_second"], b["rank0_median_images_per_second"]])
    mad = statistics.median([a["rank0_mad_images_per_second"], b["rank0_mad_images_per_second"]])
    assert rows[3][6:12] == [f"{shown(rank0)} ± {shown(mad, like=rank0)}", shown(median),
                             f"{shown(low, like=high)}–{shown(high)} ({(high - low) / median * 100:.1f} %)", "—", "n/a",
                             "2 runs, 1 machine"]
    assert rows[2][6:12] == [rank0_text("native-weak-1proc"), shown(rate("native-weak-1proc")), "–", "—", "n/a",
                             "1 run, 1 machine"]
    failure = fixture("native-desync-2proc")["failure"]["message"]
    assert f"- ✗ desync in `native-desync-2proc.json`: {failure}" in markdown
    assert "Results from [tests/fixtures/results](tests/fixtures/results/) (15 files)." in markdown


def test_mfu_is_a_dash_without_a_peak_and_a_percentage_with_one(tmp_path):
    write(tmp_path / "cpu.json", fixture("native-weak-1proc"))
    write(tmp_path / "gpu.json", on_gpus(fixture("native-weak-2proc-a"), "GPU-a", "GPU-b"))
    write(tmp_path / "unknown-gpu.json", on_gpus(fixture("native-strong-1proc"), "GPU-a", peak_tflops=None))
    markdown = run_report("--all", tmp_path).stdout
    mfu = {(row[2], row[3]): row[9] for rows in tables_after(markdown, "All configurations") for row in rows}
    assert mfu == {("1", "per device"): "—", ("2", "per device"): "25.0 %", ("1", "global"): "—"}


def test_scaling_tables_pair_runs_that_differ_only_in_world_size():
    markdown = run_report("--all", FIXTURES).stdout
    weak = table_rows(markdown, "Weak scaling")
    native_two = [rate("native-weak-2proc-a"), rate("native-weak-2proc-b")]
    one = rate("native-weak-1proc")
    efficiencies = sorted(two / (2 * one) * 100 for two in native_two)  # each run against the one-process base
    lightning_one, lightning_two = rate("lightning-weak-1proc"), rate("lightning-weak-2proc")
    assert weak == [
        ["ddp_resnet50.py", "ddp", "4", "1", "4", shown(one), shown(one), "1.00×", "100.0 %"],
        ["ddp_resnet50.py", "ddp", "4", "2", "8", shown(statistics.median(native_two)),
         shown(statistics.median(native_two) / 2), "2.00×",
         f"{efficiencies[0]:.1f}–{efficiencies[1]:.1f} % (2 runs, 1 machine)"],
        ["lightning/ddp_resnet50.py", "lightning_ddp", "4", "1", "4", shown(lightning_one), shown(lightning_one),
         "1.00×", "100.0 %"],
        ["lightning/ddp_resnet50.py", "lightning_ddp", "4", "2", "8", shown(lightning_two), shown(lightning_two / 2),
         "2.00×", f"{lightning_two / (2 * lightning_one) * 100:.1f} % (1 run, 1 machine)"]]
    strong = table_rows(markdown, "Strong scaling")
    one, two = rate("native-strong-1proc"), rate("native-strong-2proc")
    assert strong[1][5:] == [shown(two), shown(two / 2), "2.00×", f"{two / one / 2 * 100:.1f} % (1 run, 1 machine)"]


def test_weak_scaling_efficiency_is_against_the_smallest_count_of_the_series(tmp_path):
    """efficiency = T(N) / (N / N_base x T(N_base)): a series of 2, 4 and 8 GPUs on one machine has N_base = 2."""
    base = steady(fixture("native-weak-2proc-a"))
    runs = [(2, 0, 100.0), (2, 2, 98.0), (2, 4, 102.0), (2, 6, 100.0), (4, 0, 190.0), (8, 0, 360.0)]
    for count, first, throughput in runs:  # the 2-GPU base on every pair of the larger runs' GPUs
        result = on_gpus(rated(base, throughput), *[f"GPU-{index}" for index in range(first, first + count)])
        result["world"]["world_size"] = count
        result["config"]["global_batch_size"] = 4 * count
        write(tmp_path / f"{count}-{first}.json", result)
    rows = table_rows(run_report("--all", tmp_path).stdout, "Weak scaling")
    # 4 GPUs: base 100 (the median 100 on GPUs 0-1 and 98 on 2-3: 99), 190 / (2 x 99); 8 GPUs: 360 / (4 x 100)
    assert [(row[3], row[7], row[8]) for row in rows] == [
        ("2", "1.00×", "100.0 %"), ("4", "2.00×", "96.0 % (1 run, 1 machine)"),
        ("8", "4.00×", "90.0 % (1 run, 1 machine)")]


def test_lightning_table_pairs_the_twins_of_one_configuration():
    rows = table_rows(run_report("--all", FIXTURES).stdout, "Lightning against native DDP")
    native_two = statistics.median([rate("native-weak-2proc-a"), rate("native-weak-2proc-b")])
    pairs = [("1", rate("native-weak-1proc"), rate("native-weak-1proc"), rate("lightning-weak-1proc")),
             ("2", native_two, native_two, rate("lightning-weak-2proc"))]
    # The desync run and the strong-scaling runs have no Lightning twin and stay out; results from before the
    # variant was recorded say so; each Lightning run against the median of its machine's native runs.
    assert rows == [[size, "per device", "4", "ddp", shown(native), "lightning_ddp", variant,
                     shown(lightning), f"{lightning / base:.3f} (1 run, 1 machine)", "n/a", "n/a", "–"]
                    for (size, native, base, lightning), variant in zip(pairs, ["n/a (1 rank)", "variant unknown"])]


def test_ratios_are_taken_only_on_one_machine_commit_and_software(tmp_path):
    """Two results that differ only in their GPUs' UUIDs are not a pair: the ratio says across machines and
    comes from the rows' medians; another commit says across commits/software; the same GPUs pair."""
    native, lightning = steady(fixture("native-weak-1proc")), steady(fixture("lightning-weak-1proc"))
    write(tmp_path / "native.json", on_gpus(rated(native, 100.0), "GPU-a"))
    write(tmp_path / "lightning.json", on_gpus(rated(lightning, 90.0), "GPU-b"))
    assert table_rows(run_report("--all", tmp_path).stdout, "Lightning against native DDP")[0][8] == "0.900, across machines"
    write(tmp_path / "lightning.json", on_gpus(rated(lightning, 90.0), "GPU-a"))
    assert table_rows(run_report("--all", tmp_path).stdout, "Lightning against native DDP")[0][8] == "0.900 (1 run, 1 machine)"
    other = on_gpus(rated(lightning, 90.0), "GPU-a")
    other["git"]["commit"] = "0123456"
    write(tmp_path / "lightning.json", other)
    assert table_rows(run_report("--all", tmp_path).stdout, "Lightning against native DDP")[0][8] == \
        "0.900, across commits/software"
    other["git"]["commit"], other["software"]["torchvision"] = native["git"]["commit"], "0.1"
    write(tmp_path / "lightning.json", other)
    assert table_rows(run_report("--all", tmp_path).stdout, "Lightning against native DDP")[0][8] == \
        "0.900, across commits/software"
    # Native runs on the Lightning run's GPU: the median of them alone is the denominator, and the range counts
    # machines.
    write(tmp_path / "lightning.json", on_gpus(rated(lightning, 90.0), "GPU-b"))
    for name, throughput in (("native-b", 80.0), ("native-b2", 70.0), ("native-b3", 130.0)):
        write(tmp_path / f"{name}.json", on_gpus(rated(native, throughput), "GPU-b"))
    write(tmp_path / "lightning-a.json", on_gpus(rated(lightning, 95.0), "GPU-a"))
    [row] = table_rows(run_report("--all", tmp_path).stdout, "Lightning against native DDP")
    assert row[8] == "0.950–1.125 (2 runs, 2 machines)"


def test_scaling_uses_one_gpu_runs_on_the_larger_runs_own_gpus(tmp_path):
    two = steady(fixture("native-weak-2proc-a"))
    one = steady(fixture("native-weak-1proc"))
    write(tmp_path / "two.json", on_gpus(rated(two, 190.0), "GPU-a", "GPU-b"))
    write(tmp_path / "one-a.json", on_gpus(rated(one, 100.0), "GPU-a"))
    write(tmp_path / "one-c.json", on_gpus(rated(one, 80.0), "GPU-c"))  # another machine: not its base
    rows = table_rows(run_report("--all", tmp_path).stdout, "Weak scaling")
    # GPU-b has no one-GPU run: the base does not cover the run's GPUs, so no like-for-like figure.
    assert rows[1][7:] == ["2.00×", "105.6 % across machines"]
    write(tmp_path / "one-b.json", on_gpus(rated(one, 90.0), "GPU-b"))
    rows = table_rows(run_report("--all", tmp_path).stdout, "Weak scaling")
    assert rows[1][7:] == ["2.00×", "100.0 % (1 run, 1 machine)"]  # 190 / (100 + 90)


def test_ddp_options_change_nothing_on_one_rank(tmp_path):
    """One rank builds no DDP: a one-rank run with DDP's options is a repeat of the default, and the base of the
    two-rank runs with and without them."""
    one, two = steady(fixture("native-weak-1proc")), steady(fixture("native-weak-2proc-a"))
    quiet = copy.deepcopy(one)
    quiet["config"].update(broadcast_buffers=False, bucket_cap_mb=50.0)
    write(tmp_path / "one.json", on_gpus(rated(one, 100.0), "GPU-a"))
    write(tmp_path / "one-quiet.json", on_gpus(rated(quiet, 100.0), "GPU-b"))
    write(tmp_path / "two.json", on_gpus(rated(two, 190.0), "GPU-a", "GPU-b"))
    quiet_two = copy.deepcopy(two)
    quiet_two["config"].update(broadcast_buffers=False)
    write(tmp_path / "two-quiet.json", on_gpus(rated(quiet_two, 196.0), "GPU-a", "GPU-b"))
    markdown = run_report("--all", tmp_path).stdout
    rows = table_rows(markdown, "All configurations")
    assert [(row[1], row[2], row[11]) for row in rows] == [
        ("ddp", "1", "2 runs, 1 machine"), ("ddp (broadcast_buffers=false)", "2", "1 run, 1 machine"),
        ("ddp", "2", "1 run, 1 machine")]
    assert [(row[1], row[8]) for row in table_rows(markdown, "Weak scaling")] == [
        ("ddp", "100.0 %"), ("ddp (broadcast_buffers=false)", "98.0 % (1 run, 1 machine)"),
        ("ddp", "95.0 % (1 run, 1 machine)")]


def test_nccl_tuning_variables_make_a_configuration_of_their_own(tmp_path, committed):
    tuned = steady(fixture("native-weak-2proc-a"))
    tuned["software"]["environment"] = {"NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "0", "NCCL_DEBUG": "INFO"}
    write(tmp_path / "tuned.json", tuned)
    write(tmp_path / "plain.json", fixture("native-weak-2proc-b"))
    rows = table_rows(run_report("--all", tmp_path).stdout, "All configurations")
    assert sorted(row[1] for row in rows) == ["ddp", 'ddp (nccl_environment={"NCCL_P2P_DISABLE": "1"})']
    # A committed run older than the recording of the environment, from its campaign's commands.txt.
    [run] = [run for run in committed[0] if run["path"].name == "ddp2-native-2gpu-bf16-256-bv-nch4.json"]
    assert dict(run["config"].options)["nccl_environment"] == '{"NCCL_MAX_NCHANNELS": "4"}'


def test_pre_variant_lightning_results_read_variant_unknown_and_stay_apart(tmp_path):
    for name in ("native-weak-1proc", "native-weak-2proc-a", "lightning-weak-1proc", "lightning-weak-2proc"):
        write(tmp_path / f"{name}.json", fixture(name))
    stock, matched = fixture("lightning-weak-2proc"), fixture("lightning-weak-2proc")
    stock["config"]["lightning_variant"], matched["config"]["lightning_variant"] = "stock", "matched"
    write(tmp_path / "lightning-stock.json", stock)
    write(tmp_path / "lightning-matched.json", matched)
    markdown = run_report("--all", tmp_path).stdout
    lightning = [row for row in table_rows(markdown, "All configurations") if row[0] == "lightning/ddp_resnet50.py"]
    # Each variant a configuration of its own on two ranks; the twin's default, stock, goes without saying. One rank
    # builds no DDP: the variants are the same run there.
    assert [(row[1], row[2], row[11]) for row in lightning] == [
        ("lightning_ddp", "1", "1 run, 1 machine"), ("lightning_ddp (lightning_variant=matched)", "2", "1 run, 1 machine"),
        ("lightning_ddp", "2", "1 run, 1 machine"), ("lightning_ddp (variant unknown)", "2", "1 run, 1 machine")]
    pairs = table_rows(markdown, "Lightning against native DDP")
    assert [(row[0], row[6]) for row in pairs] == [("1", "n/a (1 rank)"), ("2", "matched"), ("2", "stock"),
                                                   ("2", "variant unknown")]
    reference = FIXTURES / "lightning-weak-2proc.json"
    proc = run_report("--all", tmp_path / "lightning-matched.json", "--check-against", reference)
    assert proc.returncode == 2 and proc.stderr.endswith("the nearest differs in lightning_variant matched/null\n")


def test_stability_is_said_steady_noisy_or_unknown(tmp_path):
    write(tmp_path / "one.json", noisy(fixture("native-weak-1proc")))
    write(tmp_path / "a.json", noisy(fixture("native-weak-2proc-a"), "halves differ, host-bound"))
    write(tmp_path / "b.json", fixture("native-weak-2proc-b"))
    write(tmp_path / "steady.json", steady(fixture("native-strong-1proc")))
    write(tmp_path / "unknown.json", fixture("native-strong-2proc"))
    write(tmp_path / "lightning.json", fixture("lightning-weak-1proc"))
    markdown = run_report("--all", tmp_path).stdout
    rows = [row for row in table_rows(markdown, "All configurations") if row[0] == "ddp_resnet50.py"]
    assert [(row[2], row[3], row[12]) for row in rows] == [
        ("1", "global", "ok"), ("2", "global", f"ok, {UNKNOWN}"),
        ("1", "per device", "ok, noisy: repeat or interleave"),
        ("2", "per device", "ok, 1 of 2 runs noisy: repeat or interleave")]
    [pair] = table_rows(markdown, "Lightning against native DDP")
    # a ratio with a noisy side carries the flag at its end
    assert pair[8] == f"{rate('lightning-weak-1proc') / rate('native-weak-1proc'):.3f} (noisy) (1 run, 1 machine)"
    assert table_rows(markdown, "Strong scaling")[1][8].endswith("(1 run, 1 machine)")
    assert ("- noisy: repeat or interleave: `one.json`: halves differ\n"
            "- noisy: repeat or interleave: `a.json`: halves differ, host-bound") in markdown
    # A regression found in a noisy run says that it may be noise.
    slower = noisy(rated(fixture("native-weak-1proc"), rate("native-weak-1proc") * 0.5))
    proc = run_report(write(tmp_path / "current" / "slower.json", slower), "--check-against",
                      FIXTURES / "native-weak-1proc.json")
    assert proc.returncode == 1
    [line] = [line for line in proc.stdout.splitlines() if line.startswith("REGRESSION")]
    assert "noisy" in line and "halves differ" in line  # a regression found in a noisy run says it may be noise


def test_options_that_differ_split_configurations_and_only_they_are_shown(tmp_path):
    base = fixture("native-weak-2proc-a")
    bigger, other = copy.deepcopy(base), copy.deepcopy(base)
    bigger["config"]["bucket_cap_mb"] = 50.0
    other["config"].update(bucket_cap_mb=50.0, static_graph=True)
    write(tmp_path / "a.json", base)
    write(tmp_path / "b.json", bigger)
    write(tmp_path / "c.json", other)
    rows = table_rows(run_report("--all", tmp_path).stdout, "All configurations")
    # What tells rows apart, against benchmark_extras.py's defaults: the default bucket size is not spelled out.
    assert [row[1] for row in rows] == ["ddp", "ddp (bucket_cap_mb=50.0)", "ddp (bucket_cap_mb=50.0, static_graph=true)"]


def test_an_option_only_a_newer_result_records_is_shown_only_where_it_tells_results_apart(tmp_path):
    older = fixture("native-weak-2proc-a")
    newer = copy.deepcopy(older)
    older["config"]["bucket_cap_mb"], newer["config"]["bucket_cap_mb"] = 25.0, 50.0
    newer["config"]["added_option"] = "on"  # an option the older script did not record
    write(tmp_path / "two" / "older.json", older)
    write(tmp_path / "two" / "newer.json", newer)
    rows = table_rows(run_report("--all", tmp_path / "two").stdout, "All configurations")
    assert sorted(row[1] for row in rows) == ["ddp", "ddp (added_option=on, bucket_cap_mb=50.0)"]
    newer["config"]["bucket_cap_mb"] = 25.0  # now the absence alone tells the two apart
    write(tmp_path / "one" / "older.json", older)
    write(tmp_path / "one" / "newer.json", newer)
    rows = table_rows(run_report("--all", tmp_path / "one").stdout, "All configurations")
    assert sorted(row[1] for row in rows) == ["ddp (added_option unset)", "ddp (added_option=on)"] or \
        sorted(row[1] for row in rows) == ["ddp", "ddp (added_option=on)"]


def test_report_is_deterministic_and_independent_of_input_order():
    files = sorted(FIXTURES.glob("*.json"))
    forward = report.render_markdown(report.load_documents(files)[0], ROOT)
    backward = report.render_markdown(report.load_documents(files[::-1])[0], ROOT)
    assert forward == backward == report.render_markdown(report.load_documents([FIXTURES])[0], ROOT)


def test_peak_memory_of_different_windows_is_not_pooled_and_says_its_window(tmp_path):
    write(tmp_path / "a.json", with_memory(fixture("native-weak-2proc-a"), 1000.0))
    write(tmp_path / "b.json", in_window(with_memory(fixture("native-weak-2proc-b"), 1200.0)))
    write(tmp_path / "one.json", with_memory(fixture("native-weak-1proc"), 900.0))
    write(tmp_path / "lightning-one.json", in_window(with_memory(fixture("lightning-weak-1proc"), 990.0)))
    write(tmp_path / "lightning-two.json", with_memory(fixture("lightning-weak-2proc"), 1100.0))
    markdown = run_report("--all", tmp_path).stdout
    assert "| MFU | Peak memory (MiB) | runs |" in markdown  # the column mixes windows
    rows = table_rows(markdown, "All configurations")
    assert [(row[0], row[2], row[10]) for row in rows] == [
        ("ddp_resnet50.py", "1", "900 (timed steps)"),
        ("ddp_resnet50.py", "2", "1,200 (every step after the first); 1,000 (timed steps)"),
        ("lightning/ddp_resnet50.py", "1", "990 (every step after the first)"),
        ("lightning/ddp_resnet50.py", "2", "1,100 (timed steps)")]
    # Lightning against native: over the window both measured, else each figure with its own and no ratio.
    assert [row[9:] for row in table_rows(markdown, "Lightning against native DDP")] == [
        ["900 (timed steps)", "990 (every step after the first)", "–"],
        ["1,000 (timed steps)", "1,100 (timed steps)", "1.10×"]]
    single = run_report("--all", tmp_path / "one.json").stdout
    assert "| MFU | Peak memory (MiB, timed steps) | runs |" in single  # one window throughout: the title names it


# ---------------------------------------------------------------------------- sharding tables

SHARDING_HEADER = ["strategy", "Median throughput (img/s) (rank 0) ± MAD", "Throughput (img/s)", "vs ddp",
                   "forward ms", "backward ms", "optimizer step ms", "parameter sync ms", "host ms per step",
                   "collectives per step", "MiB per step measured (analytic)", "optimizer state MiB/rank",
                   "expected state saving MiB", "Peak memory (MiB)", "peak saving vs ddp (MiB)", "status"]


def test_sharding_table_has_oss_benchmarks_columns_for_each_launch():
    """What oss_benchmark.py --table printed: rank 0's median ± MAD, vs ddp of the launch, the analysis passes."""
    proc = run_report(FIXTURES, "--sharding")
    assert proc.returncode == 0 and "All configurations" not in proc.stdout
    header = proc.stdout.split("**Sharding strategies, one launch**", 1)[1].split("\n\n", 2)[1].splitlines()[0]
    assert header == "| " + " | ".join(SHARDING_HEADER) + " |"
    launch, oom = tables_after(proc.stdout, "Sharding strategies, one launch")
    baseline = fixture("oss-ddp")["throughput"]["rank0_median_images_per_second"]
    assert [row[0] for row in launch] == SHARDING and [row[0] for row in oom] == ["fsdp_zero3"]
    for row, name in zip(launch, SHARDING):
        result = fixture(f"oss-{name}")
        analysis = result["analysis"]
        phases = {phase: value["median"] for phase, value in analysis["phases_ms"].items()}
        syncs = [phases[phase] for phase in ("parameter_sync", "parameter_sync_before_forward") if phase in phases]
        sync = f"{sum(syncs):.2f}" if syncs else "–"
        measured = analysis["collectives"]["measured_per_step"]
        kinds = ", ".join(f"{measured[kind]['count']:g} {kind}" for kind in report.COLLECTIVE_KINDS if kind in measured)
        volume = sum(value["bytes"] for value in measured.values()) / 2**20
        analytic = sum(analysis["collectives"]["analytic_bytes_per_step"].values()) / 2**20
        state = max(analysis["memory"]["optimizer_state_bytes_per_rank"]) / 2**20
        saving = analysis["memory"]["expected_optimizer_state_saving_bytes_vs_ddp"] / 2**20
        relative = result["throughput"]["rank0_median_images_per_second"] / baseline
        assert row[1:] == [rank0_text(f"oss-{name}"), shown(rate(f"oss-{name}")), f"{relative * 100:.1f} %",
                           f"{phases['forward']:.2f}", f"{phases['backward']:.2f}", f"{phases['optimizer_step']:.2f}",
                           sync, "–", kinds,
                           f"{volume:.1f} ({analytic:.1f})", f"{state:.1f}", f"{saving:.1f}", "n/a", "–",
                           f"ok, {UNKNOWN}"], name
    assert oom[0][1:5] == ["–", "–", "–", "–"] and oom[0][-1] == "**✗ oom**"
    assert "- ✗ oom in `oss-fsdp_zero3-oom.json`: OutOfMemoryError: CUDA out of memory" in proc.stdout


def test_sharding_tables_never_mix_two_launches(tmp_path):
    """Two launches of the same configuration in one folder: each zero1 against the ddp of its own launch; a
    launch without ddp has no baseline."""
    ddp, zero1 = fixture("oss-ddp"), fixture("oss-zero1")
    for launch, factor in (("A", 1.0), ("B", 2.0)):
        for name, result in (("ddp", ddp), ("zero1", zero1)):
            result = launched(result, f"launch-{launch}")
            result["throughput"]["rank0_median_images_per_second"] *= factor if name == "ddp" else 1.0
            write(tmp_path / f"{launch}-{name}.json", result)
    write(tmp_path / "C-zero1.json", launched(zero1, "launch-C"))
    tables = tables_after(run_report(tmp_path, "--sharding").stdout, "Sharding strategies, one launch")
    ddp_median = ddp["throughput"]["rank0_median_images_per_second"]
    relative = zero1["throughput"]["rank0_median_images_per_second"] / ddp_median
    assert [[(row[0], row[3]) for row in rows] for rows in tables] == [
        [("ddp", "100.0 %"), ("zero1", f"{relative * 100:.1f} %")],
        [("ddp", "100.0 %"), ("zero1", f"{relative / 2 * 100:.1f} %")],
        [("zero1", "–")]]


def test_sharding_table_memory_saved_and_fairscales_epochs(tmp_path):
    figures = {"ddp": 9000.0, "oss_ddp": 7000.0, "zero1": 7100.0, "fsdp_zero3": 4500.0}
    for name, mib in figures.items():
        write(tmp_path / f"oss-{name}.json", with_memory(fixture(f"oss-{name}"), mib))
    write(tmp_path / "oss-fsdp_zero2.json", in_window(with_memory(fixture("oss-fsdp_zero2"), 5000.0)))
    epochs = fixture("oss-oss_sharded_ddp")
    epochs["throughput"]["rank0_epochs"] = {"steps_per_epoch": 2, "count": 2, "steps_left_out": 0,
                                            "images_per_second": [10.0, 12.0], "median": 11.0, "mad": 1.0}
    write(tmp_path / "oss-oss_sharded_ddp.json", with_memory(epochs, 6500.0))
    markdown = run_report(tmp_path, "--sharding").stdout
    [rows] = tables_after(markdown, "Sharding strategies, one launch")
    assert "| per epoch: median ± MAD (epochs × steps) |" in markdown
    assert [(row[0], row[2], row[-3], row[-2]) for row in rows] == [
        ("ddp", "–", "9,000 (timed steps)", "0 (0.0 %)"), ("oss_ddp", "–", "7,000 (timed steps)", "2,000 (22.2 %)"),
        ("oss_sharded_ddp", "11.0 ± 1.0 (2 × 2)", "6,500 (timed steps)", "2,500 (27.8 %)"),
        ("zero1", "–", "7,100 (timed steps)", "1,900 (21.1 %)"),
        ("fsdp_zero2", "–", "5,000 (every step after the first)", "– (other memory window)"),
        ("fsdp_zero3", "–", "4,500 (timed steps)", "4,500 (50.0 %)")]


def test_sharding_option_needs_a_sharding_result():
    proc = run_report(FIXTURES / "native-weak-1proc.json", "--sharding")
    assert proc.returncode == 2
    assert len(one_error_line(proc.stderr)) == 1 and proc.stdout == ""


# ---------------------------------------------------------------------------- comparisons (compare.py)

def comparison(a="python ddp_resnet50.py", b="python ddp_resnet50.py --compile", ratio=1.46):
    return {"schema_version": 1, "tool": "compare.py", "status": "ok", "commands": {"a": a, "b": b}, "ratio": ratio,
            "interval_95": [ratio - 0.01, ratio + 0.01], "pairs": [{"ratio": ratio}] * 4, "rounds": [{}] * 8,
            "like_for_like": True}


def test_comparison_files_feed_their_table_and_are_no_result(tmp_path):
    write(tmp_path / "cmp.json", comparison())
    write(tmp_path / "good.json", fixture("native-weak-1proc"))
    proc = run_report("--all", tmp_path)
    assert proc.returncode == 0 and proc.stderr == ""
    [row] = proc.stdout.split("## Comparisons\n\n")[1].splitlines()[2:]
    assert row == (f"| `--compile` / the default | 1.460 (95 % interval 1.450–1.470; 4 pairs) | — | "
                   f"[cmp]({os.path.relpath(tmp_path / 'cmp.json')}) |")
    write(tmp_path / "cmp.json", {**comparison(a="python ddp_resnet50.py", b="python lightning/ddp_resnet50.py"),
                                  "like_for_like": False, "interval_95": None, "status": "interrupted"})
    [row] = run_report("--all", tmp_path).stdout.split("## Comparisons\n\n")[1].splitlines()[2:]
    assert row.startswith("| the twin (stock) / native | 1.460 across commits/software from 4 pairs, no interval")
    assert analysis.read_result_file(tmp_path / "cmp.json") == (None, "a comparison (compare.py), not a result")


def test_noisy_rounds_and_gpu_models_show_and_an_a_a_comparison_gives_the_noise(tmp_path):
    command = "python ddp_resnet50.py --batch-size-per-device 32"
    ratios = [0.9, 1.1, 1.0, 1.05]
    machine = {"gpu_names": ["NVIDIA H200"], "gpu_uuids": ["774ddefe-a8cb"], "hostnames": ["vm"], "cpu": "x"}
    document = {**comparison(a=command, b=command, ratio=1.0), "pairs": [{"ratio": ratio} for ratio in ratios],
                "rounds": [{}] * 8, "noisy_rounds": 5, "machine": {"a": machine, "b": machine}}
    other = {**document, "commands": {"a": command, "b": command + " --compile"}}
    row = report.comparisons_table([(tmp_path / "ab.json", other)], tmp_path).splitlines()[2]
    assert row.startswith("| `--compile` / `--batch-size-per-device 32` | 1.000 (95 % interval "
                          "0.990–1.010; 4 pairs; 5 of 8 rounds noisy) | NVIDIA H200 774ddefe |")
    assert report.comparisons_table([(tmp_path / "aa.json", document)], tmp_path).startswith("No comparisons")
    row = report.noise_table([(tmp_path / "aa.json", document)], tmp_path).splitlines()[2].split(" | ")
    logs = [math.log(ratio) for ratio in ratios]
    half = 3.182 * statistics.stdev(logs) / math.sqrt(4)  # t(0.975, 3 degrees of freedom)
    assert row[2:5] == ["0.900–1.100 (4 pairs, 5 of 8 rounds noisy)", f"{100 * statistics.stdev(logs):.2f} %",
                        f"±{100 * (math.exp(half) - 1):.1f} %"]
    assert report.noise_table([(tmp_path / "ab.json", other)], tmp_path).startswith("No A/A comparisons")


# ---------------------------------------------------------------------------- plots

def test_plots_are_written_as_png_and_the_table_still_printed(tmp_path):
    inputs = tmp_path / "inputs"
    for path in FIXTURES.glob("*.json"):
        write(inputs / path.name, json.loads(path.read_text()))
    for name, mib in {"ddp": 9000.0, "zero1": 6000.0, "fsdp_zero3": 4500.0}.items():
        write(inputs / f"oss-{name}.json", with_memory(fixture(f"oss-{name}"), mib))
    plots = tmp_path / "plots"
    proc = run_report(inputs, "--plots", plots)
    assert proc.returncode == 0, proc.stderr
    assert "Scaling efficiency, weak" in proc.stdout  # the answer, as without --plots
    written = sorted(path.name.split("-")[0] for path in plots.glob("*.png"))
    assert written == ["memory", "scaling", "step_times"]
    for path in plots.glob("*.png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
        assert f"wrote {path}" in proc.stdout
    proc = run_report(FIXTURES, "--plots", tmp_path / "cpu")  # CPU results: no memory plot, and it says so
    assert sorted(path.name.split("-")[0] for path in (tmp_path / "cpu").glob("*.png")) == ["scaling", "step_times"]
    assert "no memory plot" in proc.stderr and "no GPU memory counters" in proc.stderr


# ---------------------------------------------------------------------------- regression check

def check_lines(proc):
    """The check's own lines, after the table it prints first."""
    return [line for line in proc.stdout.splitlines() if line.startswith(("REGRESSION", "check "))]


def test_check_passes_against_itself_and_keeps_the_table():
    for tolerance in ("5%", "0.05"):
        proc = run_report(FIXTURES / "native-weak-1proc.json", "--check-against", FIXTURES / "native-weak-1proc.json",
                          "--tolerance", tolerance)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.startswith("1 results (1 ok) in ")  # the answer, as without the check
        assert check_lines(proc)[0].startswith("check passed: 1 result within 5.0% of")


@pytest.mark.parametrize("drop, tolerance, code", [(0.06, "5%", 1), (0.04, "5%", 0), (0.10, "5%", 1),
                                                   (0.10, "15%", 0)])
def test_check_flags_a_throughput_drop_just_beyond_the_tolerance(tmp_path, drop, tolerance, code):
    reference = fixture("native-weak-1proc")
    current = write(tmp_path / "current.json", rated(reference, rate("native-weak-1proc") * (1 - drop)))
    proc = run_report(current, "--check-against", FIXTURES / "native-weak-1proc.json", "--tolerance", tolerance)
    assert proc.returncode == code
    if code:
        lines = check_lines(proc)
        assert len(lines) == 2 and lines[0].startswith(f"REGRESSION {current}: throughput dropped {drop:.1%} (")
        assert lines[1].startswith("check failed: 1 violation")


def test_check_fails_on_a_memory_rise_beyond_the_tolerance(tmp_path):
    reference = write(tmp_path / "reference.json", with_memory(fixture("native-weak-1proc"), 1000.0))
    current = write(tmp_path / "current" / "current.json", with_memory(fixture("native-weak-1proc"), 1100.0))
    proc = run_report(current, "--check-against", reference, "--tolerance", "0.05")
    assert proc.returncode == 1
    assert "peak memory rose 10.0% (1,000 -> 1,100 MiB, timed steps), more than 5.0%" in proc.stdout
    assert run_report(current, "--check-against", reference, "--tolerance", "10.5%").returncode == 0


def test_check_fails_on_a_non_ok_status():
    proc = run_report("--all", FIXTURES / "native-desync-2proc.json", FIXTURES / "native-weak-2proc-a.json",
                      "--check-against", FIXTURES / "native-weak-2proc-b.json", "--tolerance", "50%")
    assert proc.returncode == 1
    assert check_lines(proc)[0] == ("REGRESSION tests/fixtures/results/native-desync-2proc.json: status "
                                    "desync: parameters differ across ranks by up to 9.41")


def test_check_uses_the_median_of_reference_repeats(tmp_path):
    a, b = fixture("native-weak-2proc-a"), fixture("native-weak-2proc-b")
    reference = statistics.median([a["throughput"]["images_per_second"], b["throughput"]["images_per_second"]])
    path = write(tmp_path / "current.json", rated(a, reference * 0.97))
    folder = FIXTURES  # the folder holds both repeats (and runs of other configurations, not matched)
    assert run_report(path, "--check-against", folder, "--tolerance", "4%").returncode == 0
    assert run_report(path, "--check-against", folder, "--tolerance", "2%").returncode == 1


def test_a_mismatch_names_the_fields_that_differ_in_a_short_line(tmp_path):
    proc = run_report("--all", FIXTURES / "native-weak-1proc.json", FIXTURES / "native-strong-1proc.json",
                      "--check-against", FIXTURES / "native-weak-1proc.json")
    assert proc.returncode == 0
    [warning] = one_error_line(proc.stderr)  # one line that names a field that differs
    assert warning.startswith("report.py: warning: ") and "batch_mode global/per_device" in warning
    assert len(warning) <= 200
    weak = FIXTURES / "native-weak-1proc.json"
    proc = run_report(FIXTURES / "native-strong-1proc.json", "--check-against", weak)
    assert proc.returncode == 2
    [line] = one_error_line(proc.stderr)
    assert "batch_mode global/per_device" in line and len(line) <= 200
    assert report.differences(*[run["config"] for run in report.load_documents(
        [FIXTURES / "native-strong-1proc.json", FIXTURES / "native-strong-2proc.json"])[0]]) == [
        "world_size 1/2", "batch_size_per_device 8/4"]


def test_check_compares_peak_memory_only_over_the_same_window(tmp_path):
    current = write(tmp_path / "current.json", in_window(with_memory(fixture("native-weak-1proc"), 1500.0)))
    timed = write(tmp_path / "timed" / "reference.json", with_memory(fixture("native-weak-1proc"), 1000.0))
    proc = run_report(current, "--check-against", timed, "--tolerance", "5%")
    assert proc.returncode == 0 and check_lines(proc)[0].startswith("check passed: 1 result within 5.0% of ")
    [note] = one_error_line(proc.stderr)  # one line that names both windows
    assert str(current) in note and "every step after the first" in note and "timed steps" in note
    write(tmp_path / "timed" / "same-window.json", in_window(with_memory(fixture("native-weak-1proc"), 1000.0)))
    proc = run_report(current, "--check-against", tmp_path / "timed", "--tolerance", "5%")
    assert proc.returncode == 1
    assert "peak memory rose 50.0% (1,000 -> 1,500 MiB, every step after the first), more than 5.0%" in proc.stdout


def test_a_current_harness_run_finds_its_committed_reference(tmp_path, native):
    """A default one-GPU run as the current harness records it (its config resolved by the script itself, before any
    GPU work; the figures of a committed run) is checked against the committed results of that configuration:
    --timeout, the DDP options now always recorded and a null cuDNN limit do not make it another configuration."""
    args = native.parse_arguments(["--output", str(tmp_path / "run.json")])
    config = native.resolve_harness_config(args, native.detect_launch({}), native.SCRIPT, native.STRATEGY, True, 1,
                                          True)
    config.update(model="resnet50", optimizer="sgd", optimizer_impl="fused")  # as main() does on a GPU, not in fp16
    assert config["timeout"] == 300 and config["cudnn_benchmark_limit"] is None and config["broadcast_buffers"]
    campaign = ROOT / "results" / "nvidia-h200-x2-2026-11-30e"
    result = json.loads((campaign / "s10-native-1gpu-bf16-256-a.json").read_text())
    result.update(config=config, stability=harness("stability"), schema_version=2, launch_id="one")
    result["memory"].update(window=NEW_WINDOW)
    result["throughput"]["images_per_second"] *= 1.5  # a rise is never a regression: the tolerance is not the point
    path = write(tmp_path / "run.json", result)
    proc = run_report(path, "--check-against", campaign, "--tolerance", "2%")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert check_lines(proc)[0].startswith(f"check passed: 1 result within 2.0% of {campaign}")
    [row] = [row for row in report.aggregate(report.load_documents([campaign, path])[0])
             if path in [run["path"] for run in row["runs"]]]
    assert len(row["runs"]) > 1  # in the report it is one more repeat of the committed configuration


@pytest.mark.parametrize("tolerance", ["5", "-1%", "150%", "five", "nan"])
def test_bad_tolerances_are_refused(tolerance):
    proc = run_report(FIXTURES, "--check-against", FIXTURES, f"--tolerance={tolerance}")
    assert proc.returncode == 2
    [line] = one_error_line(proc.stderr)
    assert line.startswith(f"report.py: error: --tolerance '{tolerance}'")


# ---------------------------------------------------------------------------- bad inputs

def test_inputs_that_are_all_invalid_are_named_in_one_line(tmp_path):
    broken = tmp_path / "broken"
    (broken / "notes.json").parent.mkdir()
    (broken / "notes.json").write_text("not json at all")
    write(broken / "other.json", {"hello": "world"})
    proc = run_report(broken)
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = one_error_line(proc.stderr)  # one line naming both files
    assert str(broken / "notes.json") in line and str(broken / "other.json") in line
    proc = run_report(FIXTURES / "native-weak-1proc.json", "--check-against", broken)
    assert proc.returncode == 2 and len(one_error_line(proc.stderr)) == 1
    for index in range(3):
        write(broken / f"more-{index}.json", [index])
    [line] = one_error_line(run_report(broken).stderr)  # five files: three named, the count of the rest
    assert sum(str(broken / name) in line for name in ("notes.json", "other.json", "more-0.json", "more-1.json",
                                                       "more-2.json")) == 3 and "5" in line and "2" in line


@pytest.mark.parametrize("args", [
    ["/no/such/folder"], ["{empty}"], ["{fixtures}", "--tolerance", "5%"],
    ["{fixtures}", "--check-against", "/no/such/reference"], ["{fixtures}", "--check-against", "{empty}"],
    ["{fixtures}", "--docs"], ["{fixtures}", "--update-readme", "{empty}/README.md"],
    ["{fixtures}", "--sharding", "--markdown", "{empty}/m.md"], ["{fixtures}", "--all", "--sharding"],
    ["{fixtures}", "--plots", "{fixtures}/../make_report_fixtures.sh/plots"],
    ["{fixtures}", "--markdown", "{empty}/m.md", "--check-against", "{empty}"],
    ["{fixtures}/native-strong-1proc.json", "--markdown", "{empty}/m.md", "--check-against",
     "{fixtures}/native-weak-2proc-a.json"],  # a reference of other configurations only
    ["{fixtures}/native-strong-1proc.json", "--markdown", "{empty}/m.md", "--check-against",
     "{fixtures}/native-desync-2proc.json"],  # a reference without an ok result
    ["{fixtures}", "--markdown", "{empty}/no/such/folder/m.md"],
])
def test_unusable_invocations_exit_2_with_one_line(tmp_path, args):
    empty = tmp_path / "empty"
    empty.mkdir()
    fill = {"empty": empty, "fixtures": FIXTURES}
    proc = run_report(*[arg.format(**fill) for arg in args])
    assert proc.returncode == 2 and proc.stdout == ""
    lines = one_error_line(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("report.py: error: "), lines
    assert not list(empty.iterdir())  # an unusable reference stops the run before anything is written


def test_the_command_line_gives_one_line_and_exit_2():
    proc = run_report_process("/no/such/folder")
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(one_error_line(proc.stderr)) == 1


# ---------------------------------------------------------------------------- the one-screen answer

def one_screen(proc):
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) <= 50 and max(map(len, lines)) <= 120, proc.stdout
    return lines


def test_without_a_path_it_answers_from_results_on_one_screen():
    lines = one_screen(run_report())
    assert lines == one_screen(run_report("results"))
    answers = {line.split(" (")[0].split(":")[0] for line in lines if not line.startswith(" ")}
    assert {"DDP speed", "Scaling efficiency, weak", "Lightning / native img/s", "Sharding, % of the ddp run of its launch",
            "Scaling, strong"} <= answers
    # the range of the default mode over every one of its runs, the flag of the dirty run at its top
    speed = next(line for line in lines if line.startswith("  NVIDIA H200") and "the defaults" in line)
    assert "4,692–4,751 (dirty) img/s (56 runs, 19 machines)" in speed
    assert "oss_ddp: speed 90.6 (dirty)–93.4 %" in "\n".join(lines)
    assert "slurm/scaling_sweep.sh strong" in "\n".join(lines)  # no strong series: the command that measures one


def test_a_two_process_cpu_sweep_gets_its_answers_and_a_command_for_the_rest(tmp_path):
    for name in ("native-weak-1proc", "native-weak-2proc-a", "native-weak-2proc-b"):
        write(tmp_path / "sweep" / f"{name}.json", fixture(name))
    lines = one_screen(run_report(tmp_path / "sweep"))
    one, two = rate("native-weak-1proc"), [rate("native-weak-2proc-a"), rate("native-weak-2proc-b")]
    low, high = (f"{100 * value / (2 * one):.1f}" for value in sorted(two))
    assert f"  2 processes, the defaults: {low}–{high} % (2 runs, 1 machine)" in lines
    assert sum("measure:" in line for line in lines) == 3  # strong scaling, Lightning, sharding
    for name in ("oss-ddp", "oss-zero1", "lightning-weak-1proc"):  # one sharding launch, nothing of native's
        write(tmp_path / "other" / f"{name}.json", fixture(name))
    other = one_screen(run_report(tmp_path / "other"))
    assert sum("measure:" in line for line in other) == 4 and any(line.startswith("  zero1: ") for line in other)
    assert len([line for line in lines if line.startswith("  CPU")]) == 1


def test_many_gpu_models_still_fit_one_screen(tmp_path):
    one = steady(fixture("native-weak-1proc"))
    for index in range(60):  # a line per GPU model
        result = on_gpus(rated(one, 100.0 + index), f"GPU-{index}")
        result["hardware"]["ranks"][0]["gpu_name"] = f"GPU model {index}"
        write(tmp_path / f"one-{index}.json", result)
    lines = one_screen(run_report(tmp_path))
    assert lines[-2].startswith("... ") and "--all" in lines[-2]


def test_range_ends_carry_their_runs_flags(tmp_path):
    one, two = steady(fixture("native-weak-1proc")), steady(fixture("native-weak-2proc-a"))
    for gpu in ("GPU-a", "GPU-b"):  # the base on each of the two-GPU runs' GPUs
        write(tmp_path / f"one-{gpu}.json", on_gpus(rated(one, 100.0), gpu))
    write(tmp_path / "two-a.json", on_gpus(rated(noisy(two), 190.0), "GPU-a", "GPU-b"))
    dirty = on_gpus(rated(two, 196.0), "GPU-a", "GPU-b")
    dirty["git"]["dirty"] = True
    write(tmp_path / "two-b.json", dirty)
    lines = one_screen(run_report(tmp_path))
    assert "  2 GPUs, the defaults: 95.0 (noisy)–98.0 (dirty) % (2 runs, 1 machine)" in lines


# ---------------------------------------------------------------------------- generated answers

def test_answers_follow_the_pairing_rules(committed):
    """The honest versions: a range over every repeat with its counts and the flags of its ends, and a pair of two
    machines only labelled."""
    runs = committed[0]
    default = report.pick(runs)
    assert len(default) > 20 and all(run["config"].world_size == 1 for run in default)
    low, high = min(default, key=pairing.rate), max(default, key=pairing.rate)
    assert report.rates_text(default) == (f"{low['images_per_second']:,.0f}{report.flag(low)}–"
                                          f"{high['images_per_second']:,.0f}{report.flag(high)} img/s "
                                          f"({len(default)} runs, {len({run['machine'] for run in default})} machines)")
    stock_pieces = report.pick(runs, **report.TWIN, world_size=2, gradient_as_bucket_view=False,
                               lightning_sigterm_sync=True, lightning_ddp_side_stream=report.ANY)
    no_views = report.pick(runs, world_size=2, gradient_as_bucket_view=False)
    assert report.ratio_of(stock_pieces, no_views).endswith(", across machines")  # never a headline figure
    rows = {row[0]: row for row in report.sharding_figures(runs)[2]}
    assert rows["oss_ddp"][3] == "3 launches, 3 machines"  # every launch, not the best of them


# ---------------------------------------------------------------------------- the Markdown file

def test_markdown_file_output_and_cells_that_show_only_what_tells_runs_apart(tmp_path):
    out = tmp_path / "report.md"
    proc = run_report(FIXTURES, "--markdown", out)
    assert proc.returncode == 0 and proc.stdout.strip() == f"wrote {out}"
    text = out.read_text()
    assert text.startswith("# Benchmark results\n") and "**Weak scaling**" in text
    committed = (ROOT / "docs" / "results.md").read_text()
    cells = [cell.strip() for line in committed.splitlines() if line.startswith("|") for cell in line.split("|")]
    assert max(map(len, cells)) < 200  # the longest tells six options apart
    assert max(len(line) for line in committed.splitlines() if not line.startswith(("|", "#"))) <= 200


def test_markdown_file_is_written_atomically(tmp_path, monkeypatch):
    """A full disk (here: the sync fails with ENOSPC) leaves the old file whole and no temporary file behind."""
    out = tmp_path / "report.md"
    out.write_text("old report\n")
    out.chmod(0o640)

    def full_disk(descriptor):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", full_disk)
    proc = run_report(FIXTURES, "--markdown", out)
    assert proc.returncode == 2
    assert len(one_error_line(proc.stderr)) == 1
    assert out.read_text() == "old report\n" and sorted(tmp_path.iterdir()) == [out]
    monkeypatch.undo()
    assert run_report(FIXTURES, "--markdown", out).returncode == 0
    assert out.read_text().startswith("# Benchmark results") and out.stat().st_mode & 0o777 == 0o640


def test_markdown_file_links_its_sources_from_its_own_folder(tmp_path):
    results = tmp_path / "results" / "cpu-2026-11-29"
    for name in ("native-weak-1proc", "native-weak-2proc-a"):
        write(results / f"{name}.json", fixture(name))
    (tmp_path / "out").mkdir()
    assert run_report("results", "--markdown", "out/results.md", cwd=tmp_path).returncode == 0
    text = " ".join((tmp_path / "out" / "results.md").read_text().split())  # paragraphs joined again
    assert " ## CPU (" in text and f"Results from [{results}](../results/cpu-2026-11-29/) (2 files)." in text


def test_markdown_file_without_results_says_so(tmp_path):
    (tmp_path / "results").mkdir()
    assert run_report("results", "--markdown", "results.md", cwd=tmp_path).returncode == 0
    assert "No results committed yet" in (tmp_path / "results.md").read_text()


def test_long_setup_titles_keep_distinct_plot_names():
    title = "CPU (" + "x" * 120 + ") · torch 2 · resnet50 · 32 px · fp32 · contiguous · eager · "
    names = {report.slug(title + "sgd"), report.slug(title + "adam")}
    assert len(names) == 2 and all(len(name) <= 90 for name in names)
    assert report.slug("Short · title") == "short-title"
