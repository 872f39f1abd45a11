"""collective_probe.py and scaling_model.py: the probe's fit, the probe on gloo, the model's communication terms
against their definitions, the straggler against the normal's order statistics, the validation of the committed
runs, of published measurements and of a real CPU run, bad input in one line, the outputs' modes."""
import json
import math
import os
import shutil
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


# ---------------------------------------------------------------------------------------- the model's terms

def test_a_collective_costs_latency_plus_bytes_over_bus_bandwidth(model):
    link = model.preset_link("nvlink4")
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
        topology = model.Topology(link, model.preset_link("ib-ndr400"), per_node=8, nics=nics)
        assert topology.collective_ms("all_reduce", size, 64) == pytest.approx((tree_us + bytes_us / bus) / 1e3)


def test_ddp_exposes_the_last_buckets_all_reduce(model):
    """On NVLink every bucket but the last finishes inside the backward: the exposed all-reduce is the last bucket's,
    with DDP's buckets as PyTorch itself assigns them."""
    import torch
    import torch.distributed as dist
    import torchvision
    with torch.device("meta"):
        parameters = list(reversed(list(torchvision.models.resnet50().parameters())))
    buckets, _ = dist._compute_bucket_assignment_by_size(parameters, [25 * 2 ** 20], [False] * len(parameters))
    last = 4 * sum(parameters[i].numel() for i in buckets[-1])
    baseline = model.baseline_of(PAIR)
    args = model.parse_arguments([*map(str, PAIR), "--link", "nvlink4"])
    prediction = model.predict("ddp", 2, baseline, model.workload_of(baseline.config), model.topology_of(args, None),
                               model.local_costs(baseline, None, args))
    assert len(buckets) == 4
    assert prediction.terms["all-reduce"] == pytest.approx((8.4 + 2 * 3.4 + last / 370e3) / 1e3, rel=1e-6)
    one = model.predict("ddp", 1, baseline, model.workload_of(baseline.config), model.topology_of(args, None),
                        model.local_costs(baseline, None, args))
    assert one.efficiency == pytest.approx(1.0)


def test_the_prediction_command_prints_every_strategy_and_writes_json(tmp_path):
    output = tmp_path / "predictions.json"
    proc = subprocess.run([sys.executable, str(MODEL), *map(str, PAIR), "--gpus", "2,16", "--link", "nvlink4",
                           "--json", str(output)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "NVLink 4" in proc.stdout and "InfiniBand NDR" in proc.stdout  # each link's source
    predictions = json.loads(output.read_text())["predictions"]
    assert [(p["strategy"], p["gpus"]) for p in predictions][:3] == [("ddp", 2), ("ddp", 16), ("oss_ddp", 2)]
    assert len(predictions) == 14 and all(0 < p["efficiency"] <= 1 for p in predictions)
    for p in predictions:
        assert sum(p["terms_ms"].values()) == pytest.approx(p["step_ms"], abs=1e-3)


# ------------------------------------------------------------------------------------------------- the straggler

def steps_baseline(steps_per_gpu, spread=0.0, rates=None):
    """A baseline of one run per GPU with the given step times (ms) and img/s."""
    results = [{"benchmark": "ddp_resnet50.py", "strategy": "ddp", "config": {
        "device": "cuda", "image_size": 224, "batch_size_per_device": 256, "precision": "bf16"},
        "hardware": {"ranks": [{"gpu_uuid": f"gpu-{index}"}]}, "step_times_ms_per_rank": [steps],
        "throughput": {"images_per_second": (rates or [1.0] * len(steps_per_gpu))[index]}}
        for index, steps in enumerate(steps_per_gpu)]
    return scaling.Baseline([f"gpu-{index}" for index in range(len(results))], results, "given", spread)


# E[max of n standard normals] (the normal's order statistics, by quadrature)
NORMAL_MAXIMA = {2: 0.5641896, 4: 1.0293754, 8: 1.4236003, 64: 2.3437335, 512: 3.0439032}


@pytest.mark.parametrize("n", sorted(NORMAL_MAXIMA))
def test_unmeasured_gpus_wait_for_the_slowest_of_a_normal_spread(n):
    """Steady 100 ms steps on GPUs 1 % apart: each step waits 1 ms times the mean maximum of n standard normals."""
    baseline = steps_baseline([[100.0] * 50], spread=0.01)
    assert scaling.straggler_ms(baseline, n) == pytest.approx(NORMAL_MAXIMA[n], rel=0.01)


def test_the_gpus_the_runs_measured_are_their_own_stragglers():
    """Predicting a 2-GPU run from its own two GPUs: the slower GPU sets every step, whatever the spread."""
    baseline = steps_baseline([[10.0] * 20, [12.0] * 20], spread=0.05)
    assert scaling.straggler_ms(baseline, 2) == pytest.approx(1.0)
    # jitter alone, no spread: each of 4 ranks draws a step of 10 or 14 ms, all four 10 ms with chance 1/16
    baseline = steps_baseline([[10.0, 14.0] * 10], spread=0.0)
    assert scaling.straggler_ms(baseline, 4) == pytest.approx(10 / 16 + 14 * 15 / 16 - 12)


def test_the_spread_comes_from_the_committed_one_gpu_runs_of_the_workload(model, monkeypatch):
    """Three GPUs ran the workload at 99, 100 and 101 img/s: GPUs are 1 % apart, and 8 of them wait for the slowest,
    in a prediction from the command line as in --validate."""
    committed = steps_baseline([[100.0]] * 3, rates=[99.0, 100.0, 101.0]).results
    key = (committed[0]["benchmark"], model.workload_key(committed[0]))
    monkeypatch.setattr(model, "committed_one_gpu_runs", lambda: {key: [(str(i), r) for i, r in enumerate(committed)]})
    spread, gpus, runs, extent = model.gpu_spread(committed[0])
    assert (spread, gpus, runs, extent) == pytest.approx((0.01, 3, 3, 101 / 99 - 1))
    monkeypatch.setattr(model, "one_gpu_result", lambda path: committed[int(path)])
    run = {**committed[0], "hardware": {"ranks": [{"gpu_uuid": "another"}, {"gpu_uuid": "and another"}]}}
    for baseline in model.baseline_of(["0"]), model.find_counterpart("run.json", run, [("0", committed[0])]):
        assert scaling.straggler_ms(baseline, 8) == pytest.approx(NORMAL_MAXIMA[8], rel=0.01)


def test_the_fastest_mode_starts_from_its_median_run(model):
    path, rates = model.median_run(model.FASTEST)
    chosen = json.loads((ROOT / path).read_text())["throughput"]["images_per_second"]
    assert len(rates) >= 3 and min(rates) < chosen < max(rates)
    assert sum(rate <= chosen for rate in rates) >= len(rates) / 2 <= sum(rate >= chosen for rate in rates)
    block = DOC.read_text().split("<!-- generated:predictions-fastest -->")[1]
    assert f"`python scaling_model.py {path} " in block


# ------------------------------------------------------------------------------------------------ validation

def test_validate_reports_every_run_beside_the_constant_and_the_documents_figures(model, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    output, plot = tmp_path / "v.json", tmp_path / "v.png"
    assert model.main(["--validate", FOLDER, "--json", str(output), "--plot", str(plot)]) == 0
    validation = json.loads(output.read_text())
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = {run["path"]: run for run in validation["runs"]}
    # the runs outside the model's scope are reported with their errors, as their own set
    outside = [r for r in runs.values() if not r["covered"]]
    assert outside and all(r["not_modelled"] for r in outside)
    assert validation["sets"]["in sample, outside it"]["runs"] == len(outside)
    fsdp = runs[f"{FOLDER}/s11-sharding-2gpu-bf16-256-fsdp2-fsdp_zero2.json"]
    assert fsdp["not_modelled"] == ["FSDP2's host work"] and fsdp["error"] == pytest.approx(
        fsdp["predicted"] - fsdp["measured"], abs=2e-3)
    # the measured efficiency, recomputed from the raw files: the 2-GPU img/s over the two GPUs' one-GPU img/s
    run = runs[TRIO[0]]
    assert sorted(run["one_gpu_runs"]) == TRIO[1:] and run["covered"]
    rate = lambda path: json.loads((ROOT / path).read_text())["throughput"]["images_per_second"]  # noqa: E731
    assert run["measured"] == pytest.approx(100 * rate(run["path"]) / sum(map(rate, run["one_gpu_runs"])), abs=1e-3)
    # the constant: the mean measured efficiency of the runs in scope, scored like the model on every set
    in_scope = [r["measured"] for r in runs.values() if r["covered"] and r["like_for_like"]]
    constant = validation["constant_efficiency"]["value"]
    assert constant == pytest.approx(sum(in_scope) / len(in_scope), abs=1e-3)
    scope = validation["sets"]["in sample, in the model's scope"]
    assert scope["baseline_max_abs_error_pp"] == pytest.approx(max(abs(constant - m) for m in in_scope), abs=1e-3)
    # the published measurements, predicted beside the same constant
    published = validation["published"]["rows"]
    assert published and validation["sets"]["published, every predicted row"]["runs"] == len(published)
    assert all(row["baseline_error"] == pytest.approx(constant - row["measured"], abs=1e-3) for row in published)
    # the same figures as the generated table of docs/scaling.md, which lists every committed run (its constant is
    # fitted to every committed folder's runs, this one's to one folder's)
    table = {line.split("](../")[1].split(")")[0]: line for line in DOC.read_text().splitlines()
             if line.startswith("| [") and f"](../{FOLDER}/" in line}
    assert set(table) == set(runs)
    for path, line in table.items():
        cells = [cell.strip() for cell in line.split("|")]
        assert cells[6:9] == [f"{runs[path]['measured']:.2f} %", f"{runs[path]['predicted']:.2f} %",
                              f"{runs[path]['error']:+.2f}"], path


def test_the_constant_is_fitted_to_the_runs_in_scope_and_scored_on_every_set(model):
    def run(measured, error, covered=True, gpus=2, nodes=1):
        return {"measured": measured, "error": error, "covered": covered, "like_for_like": True, "gpus": gpus,
                "nodes": nodes, "benchmark": "ddp_resnet50.py", "strategy": "ddp", "mode": "eager"}

    runs = [run(98.0, 0.5), run(96.0, -0.2), run(80.0, 10.0, covered=False)]
    validation = model.summarise_validation(runs, [], [run(90.0, 8.0, gpus=16, nodes=2)], [])
    assert validation["constant_efficiency"]["value"] == 97.0
    sets = validation["sets"]
    assert sets["in sample, in the model's scope"] == {
        "runs": 2, "gpus": [2], "nodes": [1], "max_abs_error_pp": 0.5, "mean_abs_error_pp": 0.35,
        "baseline_max_abs_error_pp": 1.0, "baseline_mean_abs_error_pp": 1.0}
    assert (sets["in sample, outside it"]["max_abs_error_pp"], sets["in sample, outside it"]
            ["baseline_max_abs_error_pp"]) == (10.0, 17.0)
    assert sets["published, across nodes"]["gpus"] == [16] and (
        sets["published, across nodes"]["max_abs_error_pp"], sets["published, across nodes"]
        ["baseline_max_abs_error_pp"]) == (8.0, 7.0)


ROW = {"source": "https://example.org/resnet50", "organisation": "Example", "implementation": "torch DDP",
       "gpu": "NVIDIA Tesla V100-SXM2-16GB", "precision": "fp32", "batch_per_gpu": 128, "gpus": 16, "nodes": 2,
       "gpus_per_node": 8, "one_gpu_images_per_second": 360.0, "n_gpu_images_per_second": 5400.0,
       "link": "between nodes: InfiniBand 100 Gb/s", "link_gbytes_per_second": 12.5, "link_basis": "stated"}


def test_published_rows_are_predicted_from_their_own_figures_and_link_or_skipped_with_the_reason(model, tmp_path):
    rows = [ROW, {**ROW, "n_gpu_images_per_second": 5700.0}, {**ROW, "link_gbytes_per_second": 1.25},
            {**ROW, "implementation": "tf_cnn_benchmarks, variable_update=parameter_server"},
            {**ROW, "batch_per_gpu": None}, {**ROW, "link_gbytes_per_second": None},
            {**ROW, "gpu": "NVIDIA Tesla K80"}, {"gpu": "a row without figures"}]
    table = tmp_path / "published.json"
    table.write_text(json.dumps({"description": "test", "rows": rows}))
    predicted, skipped = model.validate_published(table)
    assert [row["row"] for row in predicted] == [1, 2, 3]
    first, second, slow = predicted
    # nothing is fitted to the N-GPU figure: two rows that differ only in it get the same prediction
    assert first["predicted"] == second["predicted"] and first["measured"] != second["measured"]
    assert first["measured"] == pytest.approx(100 * 5400 / (16 * 360), abs=1e-3)
    assert first["error"] == pytest.approx(first["predicted"] - first["measured"], abs=2e-3)
    # the row's link decides the communication: ten times slower, less efficient
    assert slow["predicted"] < first["predicted"] and slow["terms_ms"]["all-reduce"] > first["terms_ms"]["all-reduce"]
    reasons = {row["row"]: row["reason"] for row in skipped}
    assert sorted(reasons) == [4, 5, 6, 7, 8]
    for row, words in ((4, "parameter servers"), (5, "batch per GPU not known"), (6, "link is not stated"),
                       (7, "no datasheet figures"), (8, "missing or malformed")):
        assert words in reasons[row], (row, reasons[row])


def test_the_plot_takes_a_validation_dict(model, tmp_path):
    validation = {"max_abs_error_pp": 0.5, "runs": [{"measured": 98.0, "predicted": 98.4, "covered": True},
                                                    {"measured": 90.0, "predicted": 97.0, "covered": False}],
                  "published": {"rows": [{"measured": 88.0, "predicted": 97.5}]}}
    model.plot_predicted_against_measured(validation, tmp_path / "plot.svg")
    assert (tmp_path / "plot.svg").read_text().lstrip().startswith("<?xml")
    assert [p.name for p in tmp_path.iterdir()] == ["plot.svg"]


def copy_trio(folder, **changes):
    """The 2-GPU run and its two one-GPU runs, the 2-GPU run's fields changed as given."""
    folder.mkdir(exist_ok=True)
    for path in TRIO[1:]:
        shutil.copy(ROOT / path, folder)
    run = json.loads((ROOT / TRIO[0]).read_text())
    (folder / pathlib_name(TRIO[0])).write_text(json.dumps({**run, **changes}))


def pathlib_name(path):
    return path.rsplit("/", 1)[1]


def test_outputs_take_the_umasks_mode_and_unreadable_files_are_counted_as_skipped(model, tmp_path, monkeypatch):
    folder = tmp_path / "runs"
    copy_trio(folder)
    (folder / "truncated.json").write_text('{"schema_version": 2, "config": {')
    (folder / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    prediction, validation, plot = tmp_path / "p.json", tmp_path / "v.json", tmp_path / "v.png"
    previous = os.umask(0o022)
    try:
        assert model.main([*map(str, PAIR), "--link", "nvlink4", "--gpus", "2", "--json", str(prediction)]) == 0
        assert model.main(["--validate", str(folder), "--json", str(validation), "--plot", str(plot)]) == 0
    finally:
        os.umask(previous)
    for path in (prediction, validation, plot):
        assert path.stat().st_mode & 0o777 == 0o644, path
    result = json.loads(validation.read_text())
    assert [pathlib_name(run["path"]) for run in result["runs"]] == [pathlib_name(TRIO[0])]
    skipped = {pathlib_name(row["path"]): row["reason"] for row in result["skipped"]}
    assert sorted(skipped) == ["deep.json", "truncated.json"]
    assert "nested too deeply" in skipped["deep.json"] and "not JSON" in skipped["truncated.json"]


# --------------------------------------------------------------------------------------------- a real CPU run

def one_process_pair(folder, names):
    """Two one-process runs side by side, as the GPU campaigns run one per GPU, each with one thread like each rank
    of the two-process run (the script gives a rank cpu_count // ranks-per-node threads)."""
    pinned = ("import os, runpy, sys; os.cpu_count = lambda: 1; sys.argv = [sys.argv[1], *sys.argv[2:]]; "
              "runpy.run_path(sys.argv[0], run_name='__main__')")
    procs = [subprocess.Popen([sys.executable, "-c", pinned, str(NATIVE), *SMALL, "--output", str(folder / name)],
                              env=clean_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name in names]
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
    return [json.loads((folder / name).read_text())["throughput"]["images_per_second"] for name in names]


def test_the_model_predicts_a_two_process_cpu_run_from_one_process_runs_and_a_gloo_probe(tmp_path, native_two_rank):
    """A one-process pair, the two-process run that probed its collectives after its timed steps
    (--collective-probe), then --validate: the pipeline of a GPU run, on gloo.

    How close the figure comes depends on the machine: on a quiet two-core host the measured efficiency was 66-73 %
    and the error +0.6, +1.9 and +4.4 points (the model takes gloo's threads as stealing all their time from the
    computation on the shared cores); beside another test the host's pace sets the measured figure, so only a
    coarse bound is asserted here."""
    runs = tmp_path / "runs"
    runs.mkdir()
    before = one_process_pair(runs, ["one-a.json", "one-b.json"])  # each pair side by side
    _, two = native_two_rank  # the same commit, software and (CPU) machine as the pair
    assert two["collective_probe"]["collectives"]
    (runs / "two.json").write_text(json.dumps(two))
    output = tmp_path / "v.json"
    proc = subprocess.run([sys.executable, str(MODEL), "--validate", str(runs), "--json", str(output)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (run,) = json.loads(output.read_text())["runs"]
    assert len(run["one_gpu_runs"]) == 2 and run["covered"] and run["like_for_like"]
    assert run["terms_ms"]["all-reduce"] > 0 and run["terms_ms"]["SM sharing"] > 0
    rates = before
    figures = f"one-process img/s {[round(r, 2) for r in rates]}, measured {run['measured']:.1f} %, " \
              f"predicted {run['predicted']:.1f} %"
    # whatever the machine does, the model's own figure stays plausible (62-92 % in every repetition here)
    assert 30 <= run["predicted"] <= 100, figures
    # Beside the suite's other worker the measured efficiency is the machine's, not the model's (seen: 108-117 %):
    # against the measured figure only a coarse bound holds; the committed GPU runs check the model to a point.
    assert 20 <= run["measured"] <= 150 and abs(run["error"]) <= 50, figures


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
    (tmp / "binary.md").write_bytes(bytes(range(256)) * 8)
    for name, record in (("no-broadcast", probe_record(broadcast=None)), ("negative", probe_record(
            all_reduce={"latency_us": 10.0, "bus_bandwidth_gbps": -5.0})), ("no-copy", probe_record(local_copy={}))):
        (tmp / f"{name}.json").write_text(json.dumps(record))


ONE = str(PAIR[0])
# {case: (argv, what its one line says)}; {tmp}: the folder of write_bad_files
BAD_INPUTS = {
    "nothing to do": ([], "give one-GPU RESULT files"),
    "no link": ([ONE], "give the link"),
    "bandwidth alone": ([ONE, "--bandwidth", "10"], "--bandwidth and --latency go together"),
    "a bad GPU count": ([ONE, "--link", "nvlink4", "--gpus", "2,x"], "--gpus"),
    "an unknown strategy": ([ONE, "--link", "nvlink4", "--strategies", "ddp,zero9"], "zero9"),
    "an unknown preset": ([ONE, "--link", "nvlink9"], "invalid choice"),
    "a negative GPU spread": ([ONE, "--link", "nvlink4", "--gpu-spread", "-1"], "--gpu-spread"),
    "a GPU spread for a validation": (["--validate", FOLDER, "--gpu-spread", "1"], "--gpu-spread goes with"),
    "a missing result": (["missing.json", "--link", "nvlink4"], "missing.json: no such file"),
    "a multi-rank result": ([TRIO[0], "--link", "nvlink4"], "the model starts from one-GPU runs"),
    "a one-rank sharding run": (["results/nvidia-h200-2026-12-01d/oss-1gpu-ddp.json", "--link", "nvlink4"],
                                "wraps the model in its strategy"),
    "a result nested 100,000 deep": (["{tmp}/deep.json", "--link", "nvlink4"], "nested too deeply"),
    "a probe that is no probe": ([ONE, "--probe", str(PAIR[1])], "no collective_probe.py output"),
    "a probe nested 100,000 deep": ([ONE, "--probe", "{tmp}/deep.json"], "nested too deeply"),
    "a probe missing a collective": ([ONE, "--probe", "{tmp}/no-broadcast.json"], "no broadcast fit"),
    "a probe with a negative bandwidth": ([ONE, "--probe", "{tmp}/negative.json"], "not a positive bandwidth"),
    "a probe's local copy without a fit": ([ONE, "--probe", "{tmp}/no-copy.json"], "no local_copy fit"),
    "a plot without validation": ([ONE, "--link", "nvlink4", "--plot", "x.png"], "--plot goes with"),
    "--json to a place that takes no file": ([ONE, "--link", "nvlink4", "--json", "/proc/p.json"],
                                             "takes no new file"),
    "--json into a folder that is not there": ([ONE, "--link", "nvlink4", "--json", "{tmp}/no/p.json"],
                                               "its folder does not exist"),
    "a validation's --json that cannot be written": (["--validate", FOLDER, "--json", "/proc/v.json"],
                                                     "takes no new file"),
    "a plot format matplotlib does not write": (["--validate", FOLDER, "--plot", "{tmp}/v.xyz"],
                                                "give a file ending in"),
    "a folder that is not there": (["--validate", "no-such-folder"], "not a folder"),
    "an empty folder": (["--validate", "{tmp}/empty"], "nothing validated: 0 results (0 multi-rank), 0 files"),
    "a folder of junk": (["--validate", "{tmp}/junk"], "nothing validated: 0 results (0 multi-rank), 3 files skipped"),
    "a binary document": (["--check-doc", "{tmp}/binary.md"], "cannot be read"),
    "a document of other sections": (["--check-doc", "README.md"], "no generated section named"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_the_model_refuses_bad_input_in_one_line_before_any_work(model, case, monkeypatch, capsys, tmp_path):
    write_bad_files(tmp_path)
    argv, rule = BAD_INPUTS[case]
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(model, "predict", lambda *a, **k: pytest.fail("predicted before refusing the input"))
    with pytest.raises(SystemExit) as exit_info:
        model.run_cli(lambda: model.main(argv), model.PROG)
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and rule in lines[0] and lines[0].startswith("scaling_model.py: error:"), lines


def test_a_run_whose_probe_cannot_be_used_is_skipped_not_predicted(model, tmp_path, monkeypatch, capsys):
    copy_trio(tmp_path / "runs", collective_probe=probe_record(broadcast={"latency_us": 5.0,
                                                                          "bus_bandwidth_gbps": -1.0}))
    with pytest.raises(SystemExit) as exit_info:
        model.run_cli(lambda: model.main(["--validate", str(tmp_path / "runs")]), model.PROG)
    assert exit_info.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert "3 results (1 multi-rank), 1 file skipped" in line and "not a positive bandwidth" in line


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
