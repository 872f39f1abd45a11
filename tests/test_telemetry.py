"""tools/telemetry.py: nvidia-smi samples lined up with each result's timed steps (rank0_timed_window_utc), or with
the whole run (started_at, wall_time_s) where the result does not record the timed steps."""
import gzip
import json
import subprocess
import sys

from conftest import ROOT, clean_env

FIXTURE = ROOT / "tests" / "fixtures" / "results" / "native-weak-1proc.json"  # a real result of the native script

TOOL = ROOT / "tools" / "telemetry.py"
HEADER = ("timestamp, index, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], power.limit [W], "
          "temperature.gpu, clocks_event_reasons.active\n")


def sample(second, index, mhz, watts, reasons):
    return f"2026/11/30 12:00:{second:06.3f}, {index}, {mhz} MHz, 3201 MHz, {watts:.2f} W, 700.00 W, 50, {reasons}\n"


def a_result(window, steps=None, uuid=None, images_per_second=5000.0, started_at="2026-11-30T11:00:00Z", wall_s=1.0):
    """A real result file of the CPU smoke run with the fields telemetry.py reads set as given."""
    result = json.loads(FIXTURE.read_text())
    result["throughput"]["images_per_second"] = images_per_second
    result.update(started_at=started_at, wall_time_s=wall_s)
    if window is None:
        result["throughput"].pop("rank0_timed_window_utc", None)
    else:
        result["throughput"]["rank0_timed_window_utc"] = window
    if steps is not None:
        result["step_times_ms_per_rank"] = [steps]
        result["throughput"]["timed_wall_s"] = sum(steps) / 1e3
    result["hardware"]["ranks"][0]["gpu_uuid"] = uuid
    return result


def run_tool(*args):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True,
                          env=clean_env(), cwd=ROOT, timeout=60)


def test_samples_inside_the_timed_window_per_gpu(tmp_path):
    lines = [HEADER]
    for tenth in range(0, 100):  # 10 s at 100 ms; GPU 0 capped from 4 s on, GPU 1 never
        second = tenth / 10
        lines.append(sample(second, 0, 1980 if second < 4 else 1880, 600 if second < 4 else 690,
                            "0x0000000000000000" if second < 4 else "0x0000000000000004"))
        lines.append(sample(second, 1, 1980, 620, "0x0000000000000000"))
    lines.insert(50, "timestamp, index\n")  # a repeated header line is skipped
    log = tmp_path / "nvidia-smi.csv.gz"
    with gzip.open(log, "wt") as handle:
        handle.writelines(lines)
    result = a_result(["2026-11-30T12:00:02.000Z", "2026-11-30T12:00:06.000Z"])
    whole = a_result(None, started_at="2026-11-30T12:00:07Z", wall_s=2.0)  # no timed window: the whole run
    unknown = a_result(None, wall_s=None)  # neither
    for name, value in (("run", result), ("whole", whole), ("unknown", unknown)):
        (tmp_path / f"{name}.json").write_text(json.dumps(value))
    out = tmp_path / "telemetry.json"
    proc = run_tool(log, *(tmp_path / f"{name}.json" for name in ("run", "whole", "unknown")), "--json", out)
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(out.read_text())
    assert list(figures) == [str(tmp_path / "run.json"), str(tmp_path / "whole.json")]
    assert (figures[str(tmp_path / "run.json")]["window"], figures[str(tmp_path / "whole.json")]["window"]) == (
        "timed steps", "whole run")
    gpu0, gpu1 = figures[str(tmp_path / "run.json")]["gpus"]
    # 2.0 s to 6.0 s inclusive: 41 samples a GPU, 20 before 4 s (1980 MHz, 600 W) and 21 after (1880, 690)
    assert gpu0["samples"] == gpu1["samples"] == 41
    assert abs(gpu0["sm_mhz"] - (20 * 1980 + 21 * 1880) / 41) < 1e-9
    assert abs(gpu0["power_w"] - (20 * 600 + 21 * 690) / 41) < 1e-9
    assert gpu0["power_capped_share"] == 21 / 41 and gpu1["power_capped_share"] == 0
    assert gpu0["limit_w"] == 700 and gpu1["sm_mhz"] == 1980
    assert "| run | 5,000 | 0 | 41 | 1,929 | 646 (700) | 51% | 50 |" in proc.stdout
    # 7.0 s to 9.0 s inclusive: 21 samples a GPU, all capped on GPU 0
    assert "| whole (whole run) | 5,000 | 0 | 21 | 1,880 | 690 (700) | 100% | 50 |" in proc.stdout
    assert "| unknown | – | – | no window in the result |" in proc.stdout


def test_a_file_that_is_not_an_nvidia_smi_log_is_one_line(tmp_path):
    log = tmp_path / "not.csv"
    log.write_text("hello, world\n")
    (tmp_path / "run.json").write_text(json.dumps(a_result(None)))
    proc = run_tool(log, tmp_path / "run.json")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "not an nvidia-smi --format=csv log" in lines[0], proc.stderr


def test_clock_sensitivity_fits_step_time_against_the_clock(tmp_path):
    """Steps of 40 ms while the clock reads 1,800 MHz, 38 ms once it reads 1,900: -2 ms per 100 MHz, r = -1."""
    lines = ["timestamp, index, uuid, clocks.current.sm [MHz], power.draw [W], clocks_event_reasons.active\n"]
    for tenth in range(0, 110):
        second = tenth / 10
        lines.append(f"2026/11/30 12:00:{second:06.3f}, 0, GPU-aaaa, {1800 if second < 5 else 1900} MHz, 690.00 W, "
                     "0x0000000000000004\n")
        lines.append(f"2026/11/30 12:00:{second:06.3f}, 1, GPU-bbbb, 1500 MHz, 600.00 W, 0x0000000000000000\n")
    log = tmp_path / "nvidia-smi.csv"
    log.write_text("".join(lines))
    steps = [40.0] * 125 + [38.0] * 131  # 5,000 ms then 4,978 ms
    result = a_result(["2026-11-30T12:00:00.000Z", "2026-11-30T12:00:10.000Z"], steps, uuid="bbbb")
    (tmp_path / "run.json").write_text(json.dumps(result))
    out = tmp_path / "fit.json"
    # rank 0 ran on GPU 1 by its uuid; the given index is not needed, and GPU 1's flat clock fits nothing
    proc = run_tool(log, tmp_path / "run.json", "--sensitivity", 1000, "--json", out)
    assert proc.returncode == 0, proc.stderr
    key = str(tmp_path / "run.json")
    assert json.loads(out.read_text())[key]["clock_sensitivity"] is None
    assert "| run | 1 | no fit: no timed window, fewer than 3 bins, or a clock that did not move |" in proc.stdout
    result["hardware"]["ranks"][0]["gpu_uuid"] = "aaaa"
    (tmp_path / "run.json").write_text(json.dumps(result))
    proc = run_tool(log, tmp_path / "run.json", "--sensitivity", 1000, "--json", out)
    assert proc.returncode == 0, proc.stderr
    fit = json.loads(out.read_text())[key]["clock_sensitivity"]
    assert fit["gpu"] == 0 and fit["bins"] == 10 and fit["sm_mhz_range"] == [1800, 1900]
    assert abs(fit["slope_ms_per_100_mhz"] + 2.0) < 1e-9 and abs(fit["correlation"] + 1.0) < 1e-9
    assert abs(fit["proportional_ms_per_100_mhz"] + 100 * 38 / 1850) < 1e-9
    assert "| run | 0 | 10 | 1,850 (1,800–1,900) | -2.00 | -1.00 | -2.05 |" in proc.stdout


def test_sensitivity_without_uuids_needs_the_gpu_named(tmp_path):
    log = tmp_path / "nvidia-smi.csv"
    log.write_text(HEADER + sample(1.0, 0, 1900, 690, "0x0"))
    result = a_result(["2026-11-30T12:00:00.000Z", "2026-11-30T12:00:02.000Z"], [40.0])
    (tmp_path / "run.json").write_text(json.dumps(result))
    proc = run_tool(log, tmp_path / "run.json", "--sensitivity", 500)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "--rank0-gpu INDEX" in lines[0], proc.stderr
    proc = run_tool(log, tmp_path / "run.json", "--sensitivity", 0)
    assert proc.returncode == 2 and "must be a positive number of milliseconds" in proc.stderr


def one_error_line(proc):
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("telemetry.py: error: "), proc.stderr
    return lines[0]


def test_bad_results_and_outputs_are_one_line_and_write_nothing(tmp_path):
    log = tmp_path / "nvidia-smi.csv"
    log.write_text(HEADER + sample(1.0, 0, 1900, 690, "0x0"))
    (tmp_path / "list.json").write_text("[1, 2]")
    assert "not a benchmark result" in one_error_line(run_tool(log, tmp_path / "list.json"))
    (tmp_path / "bad-window.json").write_text(json.dumps(a_result(["yesterday", "today"])))
    # (the result schema's pattern for the window's times refuses it)
    assert "throughput.rank0_timed_window_utc.0: 'yesterday' does not match" in \
        one_error_line(run_tool(log, tmp_path / "bad-window.json"))
    (tmp_path / "run.json").write_text(json.dumps(a_result(["2026-11-30T12:00:00.000Z", "2026-11-30T12:00:02.000Z"])))
    assert one_error_line(run_tool(log, tmp_path / "missing.json")).endswith("missing.json: no such file")
    blocked = tmp_path / "file"
    blocked.write_text("")
    line = one_error_line(run_tool(log, tmp_path / "run.json", "--json", blocked / "out.json"))
    assert f"--json {blocked / 'out.json'}: cannot be written" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad-window.json", "file", "list.json", "nvidia-smi.csv",
                                                          "run.json"]
