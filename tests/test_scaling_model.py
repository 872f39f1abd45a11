"""collective_probe.py and scaling_model.py: the probe's fit, the probe on gloo, the model's communication terms
against their definitions, its validation of the committed runs and of a real CPU run, the generated document."""
import json
import math
import re
import subprocess
import sys

import pytest

from conftest import NATIVE, ROOT, SMALL, clean_env, load_script, run_script

PROBE = ROOT / "lib" / "collective_probe.py"
MODEL = ROOT / "scaling_model.py"
DOC = ROOT / "docs" / "scaling.md"
PAIR = [ROOT / path for path in ("results/nvidia-h200-x2-2026-11-30b/s4-native-1gpu-bf16-256-gpu0.json",
                                 "results/nvidia-h200-x2-2026-11-30b/s4-native-1gpu-bf16-256-gpu1.json")]
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


# ----------------------------------------------------------------------------------------------- validation

def test_validate_reproduces_the_committed_runs_and_the_documents_figures(tmp_path):
    folder = "results/nvidia-h200-x2-2026-11-30f"
    output, plot = tmp_path / "v.json", tmp_path / "v.png"
    proc = subprocess.run([sys.executable, str(MODEL), "--validate", folder, "--json", str(output), "--plot",
                           str(plot)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    validation = json.loads(output.read_text())
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = {run["path"]: run for run in validation["runs"]}
    assert {"max_abs_error_pp", "runs", "covered_runs", "skipped"} <= set(validation)
    counted = [r for r in runs.values() if r["covered"] and r["like_for_like"]]
    assert validation["max_abs_error_pp"] == pytest.approx(max(abs(r["error"]) for r in counted), abs=1e-3)
    # the measured efficiency, recomputed from the raw files: the 2-GPU img/s over the two GPUs' one-GPU img/s
    run = runs[f"{folder}/s11-native-2gpu-bf16-256-nobb.json"]
    assert sorted(run["one_gpu_runs"]) == [f"{folder}/s11-native-1gpu-bf16-256-gpu0.json",
                                           f"{folder}/s11-native-1gpu-bf16-256-gpu1.json"]
    rate = lambda path: json.loads((ROOT / path).read_text())["throughput"]["images_per_second"]  # noqa: E731
    assert run["measured"] == pytest.approx(100 * rate(run["path"]) / sum(map(rate, run["one_gpu_runs"])), abs=1e-3)
    assert run["error"] == pytest.approx(run["predicted"] - run["measured"], abs=2e-3)
    # the same figures as the generated table of docs/scaling.md
    table = {line.split("](../")[1].split(")")[0]: line for line in DOC.read_text().splitlines()
             if line.startswith("| [") and f"](../{folder}/" in line}
    assert table, "the document's validation table lists runs of this folder"
    for path, line in table.items():
        cells = [cell.strip() for cell in line.split("|")]
        assert cells[4:7] == [f"{runs[path]['measured']:.2f} %", f"{runs[path]['predicted']:.2f} %",
                              f"{runs[path]['error']:+.2f}"], path


def test_check_doc_passes_on_the_committed_document_and_fails_on_an_edited_copy(model, tmp_path, capsys):
    assert model.main(["--check-doc", str(DOC)]) == 0
    text = DOC.read_text()
    start = text.index("--markdown-section validation-summary -->")
    # one hand-edited figure: the first digit of the bold maximum error
    edited = text[:start] + re.sub(r"\*\*(\d)", lambda m: f"**{(int(m[1]) + 1) % 10}", text[start:], count=1)
    assert edited != text
    copy = tmp_path / "scaling.md"
    copy.write_text(edited)
    capsys.readouterr()
    assert model.main(["--check-doc", str(copy)]) == 1
    assert "validation-summary" in capsys.readouterr().out
    assert model.main(["--update-doc", str(copy)]) == 0 and copy.read_text() == text


def test_the_plot_takes_a_validation_dict(model, tmp_path):
    validation = {"max_abs_error_pp": 0.5, "runs": [{"measured": 98.0, "predicted": 98.4, "covered": True},
                                                    {"measured": 90.0, "predicted": 97.0, "covered": False}]}
    model.plot_predicted_against_measured(validation, tmp_path / "plot.svg")
    assert (tmp_path / "plot.svg").read_text().lstrip().startswith("<?xml")
    assert [p.name for p in tmp_path.iterdir()] == ["plot.svg"]


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

MODEL_CASES = {
    "nothing to do": ([], "give one-GPU RESULT files"),
    "no link": ([str(PAIR[0])], "give the link"),
    "bandwidth alone": ([str(PAIR[0]), "--bandwidth", "10"], "--bandwidth and --latency go together"),
    "a bad GPU count": ([str(PAIR[0]), "--link", "nvlink4", "--gpus", "2,x"], "--gpus"),
    "an unknown strategy": ([str(PAIR[0]), "--link", "nvlink4", "--strategies", "ddp,zero9"], "zero9"),
    "an unknown preset": ([str(PAIR[0]), "--link", "nvlink9"], "invalid choice"),
    "a missing result": (["missing.json", "--link", "nvlink4"], "missing.json: no such file"),
    "a multi-rank result": (["results/nvidia-h200-x2-2026-11-30f/s11-native-2gpu-bf16-256-nobb.json", "--link",
                             "nvlink4"], "the model starts from one-GPU runs"),
    "a one-rank sharding run": (["results/nvidia-h200-2026-12-01d/oss-1gpu-ddp.json", "--link", "nvlink4"],
                                "wraps the model in its strategy"),
    "a probe that is no probe": ([str(PAIR[0]), "--probe", str(PAIR[1])], "no collective_probe.py output"),
    "a plot without validation": ([str(PAIR[0]), "--link", "nvlink4", "--plot", "x.png"], "--plot goes with"),
    "a folder that is not there": (["--validate", "no-such-folder"], "not a folder"),
    "a document without sections": (["--check-doc", "README.md"], "no section generated"),
}


@pytest.mark.parametrize("case", MODEL_CASES)
def test_the_model_refuses_bad_input_in_one_line(model, case, monkeypatch, capsys, tmp_path):
    argv, rule = MODEL_CASES[case]
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        model.run_guarded(lambda: model.main(argv))
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and rule in lines[0] and lines[0].startswith("scaling_model.py: error:"), lines


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
