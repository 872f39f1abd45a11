"""The analysis tools' files: a tool never writes over a file it was asked to read, and reads regular files only
(a result of at most RESULT_LIMIT bytes): a link to /dev/zero or a FIFO is refused in one line, not read for ever
or until memory runs out."""
import json
import os
import resource
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, clean_env
from resnet50_ddp_benchmarks import analysis
from test_telemetry import HEADER, a_result, sample

RESULTS = [ROOT / "results" / "nvidia-h200-x2-2026-11-30b" / f"s4-native-1gpu-bf16-256-gpu{gpu}.json" for gpu in (0, 1)]
MEMORY = 4 * 2**30  # bytes a tool may take here: one that reads /dev/zero fails instead of taking the machine's


def run(tool, *args, timeout=60):
    limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))  # noqa: E731
    return subprocess.run([sys.executable, str(ROOT / tool), *map(str, args)], capture_output=True, text=True,
                          env=clean_env(), cwd=ROOT, timeout=timeout, preexec_fn=limit)


def one_line(proc, code=2):
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == code and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]


def inputs(tmp_path):
    """Two one-GPU results and a telemetry log (with a run inside it) in tmp_path."""
    for path in RESULTS:
        shutil.copy(path, tmp_path)
    (tmp_path / "smi.csv").write_text(HEADER + "".join(sample(s, 0, 1900, 690, "0x0") for s in range(3)))
    (tmp_path / "run.json").write_text(json.dumps(a_result(["2026-11-30T12:00:00.000Z", "2026-11-30T12:00:02.000Z"])))
    return {path.name: path for path in tmp_path.iterdir()}


# (tool, its arguments: each "{name}" is that input, "{link}" a link to the first input named, which is the output)
WRITES_OVER_AN_INPUT = {
    "report --markdown": ("report.py", ["{run.json}", "--markdown", "{run.json}"]),
    "report --markdown through a link": ("report.py", ["{run.json}", "--markdown", "{link}"]),
    "scaling_model --json": ("scaling_model.py", ["{s4-native-1gpu-bf16-256-gpu1.json}",
                                                  "{s4-native-1gpu-bf16-256-gpu0.json}", "--gpus", "2", "--link",
                                                  "nvlink4", "--json", "{s4-native-1gpu-bf16-256-gpu1.json}"]),
    "telemetry --json over the log": ("tools/telemetry.py", ["{smi.csv}", "{run.json}", "--json", "{smi.csv}"]),
    "telemetry --json over a result": ("tools/telemetry.py", ["{smi.csv}", "{run.json}", "--json", "{link}"]),
}


@pytest.mark.parametrize("case", sorted(WRITES_OVER_AN_INPUT))
def test_a_tool_never_writes_over_a_file_it_reads(tmp_path, case):
    tool, template = WRITES_OVER_AN_INPUT[case]
    files = inputs(tmp_path)
    target = next(word for word in reversed(template) if word != "{link}" and word.startswith("{"))
    (tmp_path / "link").symlink_to(files[target.strip("{}")])
    files["link"] = tmp_path / "link"
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    one_line(run(tool, *[files[word.strip("{}")] if word.startswith("{") else word for word in template]))
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


def device_or_fifo(tmp_path, name, kind):
    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    return path


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_the_tools_read_regular_files_only(tmp_path, kind):
    files = inputs(tmp_path)
    one_line(run("report.py", device_or_fifo(tmp_path, "not-a-file.json", kind)))
    one_line(run("scaling_model.py", "--check-doc", device_or_fifo(tmp_path, "not-a-file.md", kind)))
    one_line(run("tools/telemetry.py", device_or_fifo(tmp_path, "not-a-file.csv", kind), files["run.json"]))
    one_line(run("tools/telemetry.py", files["smi.csv"], tmp_path / "not-a-file.json"))


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_a_compare_round_whose_result_is_no_regular_file_fails_in_one_line(tmp_path, kind):
    """The round's command leaves a link to /dev/zero or a FIFO at its --output: the round failed (exit 1)."""
    make = "os.mkfifo(sys.argv[-1])" if kind == "fifo" else 'os.symlink("/dev/zero", sys.argv[-1])'
    command = f"{sys.executable} -c 'import os, sys; {make}'"
    proc = run("compare.py", "--a", command, "--b", command, "--rounds", "2", "--output", tmp_path / "cmp.json")
    one_line(proc, code=1)
    assert os.path.lexists(tmp_path / "cmp.rounds" / "a-1.json")  # what the round left
    assert json.loads((tmp_path / "cmp.json").read_text())["status"] == "failed"


def test_a_result_over_the_size_bound_is_refused_unread(tmp_path, monkeypatch):
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"padding": "x" * 4096}))
    monkeypatch.setattr(analysis, "RESULT_LIMIT", 1024)
    document, problem = analysis.read_json(path)
    assert document is None and problem
