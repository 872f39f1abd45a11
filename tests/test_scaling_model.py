"""collective_probe.py and scaling_model.py: the probe's fit, the probe on gloo, the ceiling's communication terms
against their definitions, every printed ceiling with its spread, the validation as a bound (rows above the ceiling
beyond their noise named, the points lost below it) of committed runs, of a published table given as a file and of
a real CPU run with its probe (report.py's view of a run folder), bad input in one line."""
import json
import math
import shutil
import statistics
import subprocess
import sys

import pytest

from resnet50_ddp_benchmarks import scaling
from conftest import NATIVE, ROOT, SMALL, clean_env, load_script, run_script

PROBE = ROOT / "resnet50_ddp_benchmarks" / "collective_probe.py"
MODEL = ROOT / "scaling_model.py"
DOC = ROOT / "docs" / "scaling.md"
PAIR = [ROOT / path for path in ("results/nvidia-h200-x2-2026-11-30b/s4-native-1gpu-bf16-256-gpu0.json",
                                 "results/nvidia-h200-x2-2026-11-30b/s4-native-1gpu-bf16-256-gpu1.json")]
FOLDER = "results/nvidia-h200-x2-2026-11-30f"
# A 2-GPU run in the model's scope and the one-GPU runs of its two GPUs
TRIO = [f"{FOLDER}/s11-native-2gpu-bf16-256-nobb.json", f"{FOLDER}/s11-native-1gpu-bf16-256-gpu0.json",
        f"{FOLDER}/s11-native-1gpu-bf16-256-gpu1.json"]
# nccl-tests' bus-bandwidth factors (doc/PERFORMANCE.md), written out here independently of both tools
FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
           "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}
TINY_SIZES = "1K,4K,16K"


@pytest.fixture(scope="module")
def probe():
    return load_script(PROBE, "collective_probe_under_test")


@pytest.fixture(scope="module")
def model():
    return load_script(MODEL, "scaling_model_under_test")


# ------------------------------------------------------------------------------------------------- the probe

@pytest.mark.parametrize("world", [2, 4, 8])
def test_the_fit_recovers_latency_and_bus_bandwidth_from_synthetic_timings(probe, world):
    sizes = [4 ** k * 1024 for k in range(9)]
    for name, factor in FACTORS.items():
        alpha, bus = 12.0, 300.0  # us, GB/s
        # +-3 % of deterministic noise on every median
        times = [(alpha + size * factor(world) / (bus * 1e3)) * (1 + 0.03 * math.sin(7 * k))
                 for k, size in enumerate(sizes)]
        fit = probe.summarise(name, sizes, times, world)["fit"]
        assert fit["latency_us"] == pytest.approx(alpha, rel=0.05), name
        assert fit["bus_bandwidth_gbps"] == pytest.approx(bus, rel=0.05), name
        assert fit["max_relative_residual"] < 0.07


def test_one_rank_moves_no_bytes_so_the_fit_has_no_bus_bandwidth(probe):
    fit = probe.summarise("all_reduce", [1024, 4096], [20.0, 21.0], 1)["fit"]
    assert fit["bus_bandwidth_gbps"] is None and fit["latency_us"] == pytest.approx(20.5)


@pytest.mark.parametrize("nproc", [2, 4])
def test_the_probe_times_every_collective_on_gloo_processes(nproc, tmp_path):
    output = tmp_path / "probe.json"
    proc = run_script(PROBE, ["--device", "cpu", "--sizes", TINY_SIZES, "--repeats", "2", "--warmup", "1",
                              "--output", str(output)], nproc=nproc, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(output.read_text())
    assert (record["backend"], record["world_size"], record["timer"]) == ("gloo", nproc, "host clock")
    assert record["sizes_bytes"] == [1024, 4096, 16384]
    assert set(record["collectives"]) == {*FACTORS, "local_copy"}
    for name, factor in FACTORS.items():
        summary = record["collectives"][name]
        assert summary["bus_factor"] == pytest.approx(factor(nproc))
        assert len(summary["median_us"]) == 3 and min(summary["median_us"]) > 0
        assert summary["fit"]["bus_bandwidth_gbps"] is None or summary["fit"]["bus_bandwidth_gbps"] > 0
    assert "| all_reduce |" in proc.stdout
    assert not list(tmp_path.glob(".*"))  # nothing left of the atomic write


def test_probe_collectives_runs_inside_a_process_group_of_one(probe):
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        record = probe.probe_collectives(sizes=[1024, 8192], repeats=1, warmup=0)
    finally:
        dist.destroy_process_group()
    assert record["world_size"] == 1 and record["device"] == "cpu"
    assert record["collectives"]["all_reduce"]["fit"]["bus_bandwidth_gbps"] is None
    json.dumps(record)


# ---------------------------------------------------------------------------------------- the ceiling's terms

def test_a_collective_costs_latency_plus_bytes_over_bus_bandwidth():
    link = scaling.preset_link("nvlink4")
    size = 100e6
    for n in (2, 8):
        hop_steps = {"all_reduce": 2 * (n - 1), "all_gather": n - 1, "reduce_scatter": n - 1, "broadcast": n - 1}
        for name, factor in FACTORS.items():
            expected = 8.4 + 3.4 * hop_steps[name] + size * factor(n) / 370e3
            assert link.time_us(name, size, n) == pytest.approx(expected), (name, n)
    # 64 GPUs in 8 nodes: the ring at the slower of NVLink and the node's NICs together, the tree's latency (a chain
    # of 7 NVLink steps in each node, 3 network levels between them, up and down) shorter than the ring's
    tree_us = 8.4 + 2 * (7 * 3.4 + 3 * 14.0)
    bytes_us = size * FACTORS["all_reduce"](64) / 1e3
    for nics, bus in ((8, 370.0), (2, 94.0), (1, 47.0)):
        topology = scaling.Topology(link, scaling.preset_link("ib-ndr400"), per_node=8, nics=nics)
        assert topology.collective_ms("all_reduce", size, 64) == pytest.approx((tree_us + bytes_us / bus) / 1e3)


def default_ceiling(n, strategy="ddp"):
    baseline = scaling.one_gpu_baseline(PAIR)
    topology = scaling.Topology(scaling.preset_link("nvlink4"), scaling.preset_link("ib-ndr400"))
    config = baseline.results[0]["config"]
    return scaling.ceiling(strategy, n, baseline, scaling.workload_of(config, strategy), topology,
                           scaling.local_costs(baseline.results[0], None, ""))


def test_ddp_exposes_the_last_buckets_all_reduce():
    """On NVLink every bucket but the last finishes inside the backward: the exposed all-reduce is the last bucket's,
    with DDP's buckets as PyTorch itself assigns them; one GPU is its own ceiling."""
    import torch
    import torch.distributed as dist
    import torchvision
    with torch.device("meta"):
        parameters = list(reversed(list(torchvision.models.resnet50().parameters())))
    buckets, _ = dist._compute_bucket_assignment_by_size(parameters, [25 * 2 ** 20], [False] * len(parameters))
    last = 4 * sum(parameters[i].numel() for i in buckets[-1])
    assert len(buckets) == 4
    assert default_ceiling(2).terms["all-reduce"] == pytest.approx((8.4 + 2 * 3.4 + last / 370e3) / 1e3, rel=1e-6)
    assert default_ceiling(1).efficiency == pytest.approx(1.0)


def test_the_command_prints_each_ceiling_with_how_far_below_published_runs_fell(tmp_path):
    output = tmp_path / "ceilings.json"
    proc = subprocess.run([sys.executable, str(MODEL), *map(str, PAIR), "--gpus", "1,8,16", "--link", "nvlink4",
                           "--json", str(output)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "NVLink 4" in proc.stdout and "InfiniBand NDR" in proc.stdout  # each link's source
    document = json.loads(output.read_text())
    assert document["what"] == scaling.CEILING
    tops = document["ceilings"]
    assert [(t["strategy"], t["gpus"]) for t in tops][:4] == [("ddp", 1), ("ddp", 8), ("ddp", 16), ("oss_ddp", 1)]
    assert len(tops) == 21 and all(0 < t["ceiling_efficiency"] <= 1 for t in tops)
    for t in tops:
        assert sum(t["terms_ms"].values()) == pytest.approx(t["step_ms_at_least"], abs=1e-3)
    # every extrapolated ceiling carries the spread, one node's (8 GPUs) or across nodes' (16), in the JSON and on
    # the screen: the published rows' points lost, as --validate computes them
    losses = scaling.published_losses()
    for t in tops:
        if t["gpus"] > 1:
            assert t["published_runs_fell_below_points"] == dict(zip(("median", "least", "most", "rows"),
                                                                     scaling.spread(losses[t["gpus"] <= 8])))
    rows = [line.split("|") for line in proc.stdout.splitlines() if line.startswith("| ddp |")]
    spreads = {int(row[2]): row[4].strip() for row in rows}
    for n, one_node in ((8, True), (16, False)):
        median = statistics.median(losses[one_node])
        assert spreads[n].startswith(f"{median:.1f} ({min(losses[one_node]):.1f} to {max(losses[one_node]):.1f}")


# ------------------------------------------------------------------------------------------------ validation

ROW = {"source": "https://example.org/resnet50", "organisation": "Example", "implementation": "torch DDP",
       "gpu": "NVIDIA Tesla V100-SXM2-16GB", "precision": "fp32", "batch_per_gpu": 128, "gpus": 16, "nodes": 2,
       "gpus_per_node": 8, "one_gpu_images_per_second": 360.0, "n_gpu_images_per_second": 5400.0,
       "link": "between nodes: InfiniBand 100 Gb/s", "link_gbytes_per_second": 12.5, "link_basis": "stated"}


def copy_trio(folder, **changes):
    """The 2-GPU run and its two one-GPU runs, the 2-GPU run's fields changed as given."""
    folder.mkdir(exist_ok=True)
    for path in TRIO[1:]:
        shutil.copy(ROOT / path, folder)
    run = json.loads((ROOT / TRIO[0]).read_text())
    (folder / TRIO[0].rsplit("/", 1)[1]).write_text(json.dumps({**run, **changes}))


def test_validate_names_the_rows_above_the_ceiling_beyond_their_noise_in_a_table_given_as_a_file(tmp_path):
    """A published table given as a file beside committed runs: a row above its ceiling by more than its noise is
    named, one above it within its noise is not; the points lost are the ceiling less the measured efficiency."""
    rows = [ROW, {**ROW, "n_gpu_images_per_second": 16 * 360.0 * 1.2},  # 120 %: above any ceiling
            {**ROW, "n_gpu_images_per_second": 16 * 360.0 * 1.2, "noise_pp": 30},  # the same, within its noise
            {**ROW, "gpus": 8, "nodes": 1, "link_gbytes_per_second": 1.25, "n_gpu_images_per_second": 1440.0},
            {**ROW, "implementation": "tf_cnn_benchmarks, variable_update=parameter_server"},
            {**ROW, "batch_per_gpu": None}, {**ROW, "gpu": "NVIDIA Tesla K80"}, ["not a row"]]
    table = tmp_path / "mine.json"
    table.write_text(json.dumps({"description": "test", "rows": rows}))
    copy_trio(tmp_path / "runs")
    output = tmp_path / "v.json"
    proc = subprocess.run([sys.executable, str(MODEL), "--validate", str(tmp_path / "runs"), "--published", str(table),
                           "--json", str(output)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    validation = json.loads(output.read_text())
    bounded = validation["published"][str(table)]["rows"]
    assert [row["name"].split(" (")[0] for row in bounded] == [f"mine.json row {i}" for i in (1, 2, 3, 4)]
    first, above, within, slow = bounded
    assert first["measured"] == pytest.approx(100 * 5400 / (16 * 360), abs=1e-3)
    assert first["lost"] == pytest.approx(first["ceiling"] - first["measured"], abs=2e-3)
    # nothing is fitted to the N-GPU figure: rows that differ only in it share their ceiling
    assert first["ceiling"] == above["ceiling"] == within["ceiling"] and above["measured"] == pytest.approx(120)
    assert slow["ceiling"] < first["ceiling"] and slow["terms_ms"]["all-reduce"] > first["terms_ms"]["all-reduce"]
    subsets = validation["subsets"]
    assert subsets["mine.json, every row"]["above_beyond_noise"] == [above["name"]]
    assert subsets["mine.json, across nodes"]["rows"] == 3 and subsets["mine.json, one node"]["rows"] == 1
    lost = sorted(row["lost"] for row in bounded)
    assert subsets["mine.json, every row"]["points_lost"]["min"] == pytest.approx(lost[0], abs=0.01)
    assert subsets["mine.json, every row"]["points_lost"]["max"] == pytest.approx(lost[-1], abs=0.01)
    assert above["name"] in proc.stdout and within["name"] not in proc.stdout
    reasons = [row["reason"] for row in validation["published"][str(table)]["skipped"]]
    assert len(reasons) == 4 and "parameter servers" in reasons[0] and "batch_per_gpu" in reasons[1]
    assert "no datasheet figures" in reasons[2]
    # the committed run beside them: its own one-GPU runs, its measured efficiency recomputed from the raw files
    (run,) = validation["runs"]
    rate = lambda path: json.loads((ROOT / path).read_text())["throughput"]["images_per_second"]  # noqa: E731
    assert run["measured"] == pytest.approx(100 * rate(TRIO[0]) / sum(map(rate, TRIO[1:])), abs=1e-3)
    assert run["lost"] > -run["noise"] and subsets["this project's runs (in sample)"]["rows"] == 1


def test_the_committed_runs_and_the_shipped_table_lie_below_the_ceiling_within_noise_or_are_named():
    """The documents' validation: every committed multi-rank run is bounded or skipped with a reason, and every row
    above the ceiling beyond its noise is one the summary names."""
    validation = scaling.validate([ROOT / "results"], [scaling.PUBLISHED])
    named = {name for s in validation["subsets"].values() for name in s["above_beyond_noise"]}
    rows = validation["runs"] + validation["published"]["docs/published/resnet50_multi_gpu.json"]["rows"]
    assert {r["name"] for r in rows if r["ceiling"] - r["measured"] < -r["noise"]} == named
    assert len(validation["runs"]) > 100 and all(s["reason"] for s in validation["skipped"])


# ------------------------------------------------------------------------- a real CPU run: report.py's view

def test_a_two_process_cpu_run_with_its_probe_gets_its_ceiling_in_the_report(tmp_path, native_two_rank):
    """A one-process run and the two-process run that probed its collectives (--collective-probe): --validate
    bounds it, and report.py's view of the folder prints the ceiling at the probed link and the points lost."""
    runs = tmp_path / "runs"
    runs.mkdir()
    _, two = native_two_rank
    assert two["collective_probe"]["collectives"]
    # one thread, like each rank of the two-process run (the script gives a rank cpu_count // ranks-per-node)
    pinned = ("import os, runpy, sys; os.cpu_count = lambda: 1; sys.argv = sys.argv[1:]; "
              "runpy.run_path(sys.argv[0], run_name='__main__')")
    one = subprocess.run([sys.executable, "-c", pinned, str(NATIVE), *SMALL, "--output", str(runs / "one.json")],
                         env=clean_env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stdout + one.stderr
    (runs / "two.json").write_text(json.dumps(two))
    (row,) = scaling.ceilings([runs])
    assert (row["mode"], row["gpus"], row["runs"]) == ("per_device", 2, 1) and row["link"] == "probe (gloo, 2 ranks)"
    assert 0 < row["ceiling"] <= 100 and row["lost"] == pytest.approx(row["ceiling"] - row["measured"])
    report = subprocess.run([sys.executable, str(ROOT / "report.py"), str(runs)], capture_output=True, text=True,
                            cwd=ROOT, timeout=300)
    assert report.returncode == 0, report.stderr
    assert f"| weak | 2 | 1 | {row['measured']:.1f} % | {row['ceiling']:.1f} % | {row['lost']:.1f} |" in report.stdout
    (tmp_path / "empty-table.json").write_text('{"rows": []}')
    proc = subprocess.run([sys.executable, str(MODEL), "--validate", str(runs), "--published",
                           str(tmp_path / "empty-table.json")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0 and "this project's runs (in sample) | 1 |" in proc.stdout, proc.stderr


# -------------------------------------------------------------------------------------------------- bad input

def probe_record(**fits):
    """A collective probe of two ranks whose every fit is 10 us and 100 GB/s unless given (None: no such fit)."""
    kinds = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "local_copy")
    collectives = {kind: {"fit": fits.get(kind, {"latency_us": 10.0, "bus_bandwidth_gbps": 100.0})} for kind in kinds
                   if fits.get(kind, True) is not None}
    return {"schema": "collective_probe/1", "backend": "nccl", "world_size": 2, "collectives": collectives}


def write_bad_files(tmp):
    """The files the bad inputs name, under tmp."""
    (tmp / "empty").mkdir()
    (tmp / "junk").mkdir()
    (tmp / "junk" / "notes.json").write_text("not JSON")
    (tmp / "junk" / "other.json").write_text('{"a": 1}')
    for path in (tmp / "junk" / "deep.json", tmp / "deep.json"):
        path.write_text("[" * 100_000 + "]" * 100_000)
    (tmp / "norows.json").write_text('{"description": "no rows"}')
    for name, record in (("no-broadcast", probe_record(broadcast=None)), ("negative", probe_record(
            all_reduce={"latency_us": 10.0, "bus_bandwidth_gbps": -5.0})), ("no-copy", probe_record(local_copy={}))):
        (tmp / f"{name}.json").write_text(json.dumps(record))
    (tmp / "empty-table.json").write_text('{"rows": []}')


ONE = str(PAIR[0])
# {case: (argv, what its one line says)}; {tmp}: the folder of write_bad_files
BAD_INPUTS = {
    "nothing to do": ([], "give one-GPU RESULT files"),
    "no link": ([ONE], "give the link"),
    "a bad GPU count": ([ONE, "--link", "nvlink4", "--gpus", "2,x"], "--gpus"),
    "an unknown strategy": ([ONE, "--link", "nvlink4", "--strategies", "ddp,zero9"], "zero9"),
    "an unknown preset": ([ONE, "--link", "nvlink9"], "invalid choice"),
    "a missing result": (["missing.json", "--link", "nvlink4"], "missing.json: no such file"),
    "a multi-rank result": ([TRIO[0], "--link", "nvlink4"], "a 2-rank ddp_resnet50.py run"),
    "a one-rank sharding run": (["results/nvidia-h200-2026-12-01d/oss-1gpu-ddp.json", "--link", "nvlink4"],
                                "oss_benchmark.py"),
    "a result nested 100,000 deep": (["{tmp}/deep.json", "--link", "nvlink4"], "nested too deeply"),
    "a probe that is no probe": ([ONE, "--probe", str(PAIR[1])], "so it measured no link"),
    "a probe nested 100,000 deep": ([ONE, "--probe", "{tmp}/deep.json"], "nested too deeply"),
    "a probe missing a collective": ([ONE, "--probe", "{tmp}/no-broadcast.json"], "no broadcast fit"),
    "a probe with a negative bandwidth": ([ONE, "--probe", "{tmp}/negative.json"], "not a positive bandwidth"),
    "a probe's local copy without a fit": ([ONE, "--probe", "{tmp}/no-copy.json"], "no local_copy fit"),
    "--published without --validate": ([ONE, "--link", "nvlink4", "--published", "{tmp}/norows.json"],
                                       "--published goes with --validate"),
    "a published table without rows": (["--validate", FOLDER, "--published", "{tmp}/norows.json"], "no rows"),
    "a published table that is not there": (["--validate", FOLDER, "--published", "{tmp}/none.json"], "no such file"),
    "--json to a place that takes no file": ([ONE, "--link", "nvlink4", "--json", "/proc/p.json"],
                                             "cannot write in"),
    "--json into a folder that is not there": ([ONE, "--link", "nvlink4", "--json", "{tmp}/no/p.json"],
                                               "cannot write in"),
    "a folder that is not there": (["--validate", "no-such-folder"], "no such file or folder"),
    "a folder of junk and an empty table": (["--validate", "{tmp}/junk", "--published", "{tmp}/empty-table.json"],
                                            "nothing to check"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_the_model_refuses_bad_input_in_one_line_before_any_work(model, case, monkeypatch, capsys, tmp_path):
    write_bad_files(tmp_path)
    argv, rule = BAD_INPUTS[case]
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(model, "ceiling", lambda *a, **k: pytest.fail("computed before refusing the input"))
    with pytest.raises(SystemExit) as exit_info:
        model.run_cli(lambda: model.main(argv), model.PROG)
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and rule in lines[0] and lines[0].startswith("scaling_model.py: error:"), lines
    assert not list(tmp_path.glob("**/p.json"))


def test_a_run_whose_probe_cannot_be_used_is_skipped_with_the_reason(tmp_path):
    copy_trio(tmp_path / "runs", collective_probe=probe_record(broadcast={"latency_us": 5.0,
                                                                          "bus_bandwidth_gbps": -1.0}))
    runs, skipped = scaling.validate_runs([tmp_path / "runs"])
    assert runs == [] and len(skipped) == 1 and "not a positive bandwidth" in skipped[0]["reason"]


PROBE_CASES = {
    "cuda without a GPU": (["--device", "cuda"], "needs a CUDA GPU"),
    "zero repeats": (["--device", "cpu", "--repeats", "0"], "--repeats must be at least 1"),
    "a size that is no size": (["--device", "cpu", "--sizes", "1K,lots"], "is not a size"),
    "one size": (["--device", "cpu", "--sizes", "4K,4K"], "at least two different"),
    "a backwards sweep": (["--device", "cpu", "--sizes", "64M:1K"], "FIRST < LAST"),
    "an output folder that is not there": (["--device", "cpu", "--output", "no/such/folder/p.json"], "does not exist"),
}


@pytest.mark.parametrize("case", PROBE_CASES)
def test_the_probe_refuses_bad_input_in_one_line(probe, case, monkeypatch, capsys):
    argv, rule = PROBE_CASES[case]
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(probe.torch.cuda, "is_available", lambda: False)
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        probe.run_guarded(lambda: probe.main(argv))
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and rule in lines[0], lines


def test_an_existing_output_is_kept_unless_overwrite(probe, tmp_path, monkeypatch, capsys):
    output = tmp_path / "probe.json"
    output.write_text("{}")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        probe.run_guarded(lambda: probe.main(["--device", "cpu", "--output", str(output)]))
    assert exit_info.value.code == 2 and output.read_text() == "{}"
    assert "--overwrite" in capsys.readouterr().err
