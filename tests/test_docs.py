"""What users rely on in the documents: the main ones stay within their length budgets, relative links resolve,
every committed result has the command that made it (and every command its result, or a line saying why not), and
the pinned stack of constraints.txt is the one behind the committed results."""
import json
import pathlib
import re
import subprocess

import pytest

import analysis
from conftest import ROOT, load_script

LINE_BUDGETS = {"README.md": 250, "docs/scaling.md": 400, "docs/performance.md": 310, "docs/sharding.md": 350, "lightning/README.md": 150}
BYTE_BUDGETS = {"README.md": 21 * 1024}
EXPERIMENT_README_LINES = 60
LINK = re.compile(r"\]\(([^)\s]+)\)|^\[[^\]]+\]:\s*(\S+)", re.MULTILINE)


def tracked_files():
    """The repository's files as git tracks them (the working tree's, when there is no git)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
        paths = [path for path in listed.stdout.split("\0") if path]
    except (OSError, subprocess.CalledProcessError):
        paths = [str(path.relative_to(ROOT)) for path in ROOT.rglob("*") if path.is_file() and not any(
            part.startswith(".") or part in ("runs", "__pycache__") for part in path.relative_to(ROOT).parts)]
    return sorted(path for path in paths if (ROOT / path).is_file())


TEXT_FILES = [path for path in tracked_files() if path.endswith(".md")]


@pytest.mark.parametrize("path", sorted({*LINE_BUDGETS, *(str(readme.relative_to(ROOT))
                                                            for readme in ROOT.glob("experiments/*/README.md"))}))
def test_documents_stay_within_their_budgets(path):
    text = (ROOT / path).read_text()
    lines, limit = text.count("\n"), LINE_BUDGETS.get(path, EXPERIMENT_README_LINES)
    assert lines <= limit, f"{path}: {lines} lines, budget {limit}"
    if path in BYTE_BUDGETS:
        size = len(text.encode())
        assert size <= BYTE_BUDGETS[path], f"{path}: {size} bytes, budget {BYTE_BUDGETS[path]}"


@pytest.mark.parametrize("path", [path for path in TEXT_FILES if path.endswith(".md") and
                                  path.startswith(("docs/", "experiments/", "results/"))])
def test_relative_links_lead_to_committed_files(path):
    """docs/, experiments/ and results/ cite result files and each other by relative links: each must exist."""
    text = (ROOT / path).read_text()
    missing = []
    for inline, reference in LINK.findall(text):
        target = (inline or reference).split("#")[0]
        if target and not re.match(r"[a-z]+:", target) and not (ROOT / path).parent.joinpath(target).exists():
            missing.append(target)
    assert not missing, f"{path}: links to missing files: {missing}"


@pytest.mark.parametrize("folder", sorted(path.parent.name for path in ROOT.glob("results/*/commands.txt")))
def test_every_result_file_has_its_command(folder):
    """A campaign's commands.txt names the output of every result file in its folder (oss_benchmark.py writes
    <output stem>-<strategy>.json), and every probe output it names outside the folder exists."""
    campaign = ROOT / "results" / folder
    text = (campaign / "commands.txt").read_text()
    commands = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    stems = set(re.findall(r"--output (\S+)\.json", commands))
    files = [str(path.relative_to(campaign))[:-len(".json")] for path in campaign.rglob("*.json")]
    # oss_benchmark.py writes <stem>-<strategy>.json; compare.py keeps its rounds' results in <stem>.rounds/
    orphans = [name for name in files if name not in stems and not any(name.startswith((stem + "-", stem + ".rounds/"))
                                                                       for stem in stems)]
    assert not orphans, f"{folder}: no command in commands.txt writes {orphans}"
    unwritten = [stem for stem in sorted(stems) if not any(name == stem or name.startswith((stem + "-", stem + ".rounds/"))
                                                           for name in files) and stem not in comments]
    assert not unwritten, f"{folder}: commands.txt runs {unwritten}, whose files are neither here nor said to be missing"
    elsewhere = re.findall(r"(?:--json|--output-json|>) (\.\./\S+)", text)
    missing = [path for path in elsewhere if not (campaign / path).exists()]
    assert not missing, f"{folder}: commands.txt names outputs that are not committed: {missing}"


def test_constraints_pin_the_stack_of_the_committed_results():
    """constraints.txt reproduces the committed figures' stack: its pins are the versions every result records."""
    pins = dict(re.findall(r"^([\w-]+)==(\S+)$", (ROOT / "constraints.txt").read_text(), re.MULTILINE))
    recorded = {name: set() for name in pins}
    for path in ROOT.glob("results/*/**/*.json"):
        software = json.loads(path.read_text()).get("software") or {}
        for name in pins:
            if software.get(name):
                recorded[name].add(software[name].split("+")[0])
    assert set(pins) == {"torch", "torchvision", "lightning", "fairscale"}
    assert {name: {version} for name, version in pins.items()} == recorded


def test_every_generated_block_is_current(monkeypatch, capsys):
    """The one check of the generated blocks (report.py's and scaling_model.py's): a figure edited by hand in any
    document, or a result added without regenerating, fails here."""
    monkeypatch.chdir(ROOT)
    report = load_script(ROOT / "report.py", "report_for_docs")
    assert report.main(["--check-docs"]) == 0, capsys.readouterr().err


def test_the_engine_rebuilds_only_its_blocks_and_refuses_unknown_names(tmp_path, capsys):
    text = ("intro\n<!-- generated:a -->\nold\n<!-- /generated:a -->\nprose\n"
            "<!-- generated:b -->\nB\n<!-- /generated:b -->\nend\n")
    (tmp_path / "doc.md").write_text(text)
    sections = {"a": lambda document: f"A of {document}", "b": lambda document: "B"}
    assert analysis.check_documents(sections, ["doc.md"], tmp_path) == 1
    assert "doc.md (a)" in capsys.readouterr().err
    assert (tmp_path / "doc.md").read_text() == text  # a check writes nothing
    assert analysis.update_documents(sections, ["doc.md"], tmp_path) == 0
    assert (tmp_path / "doc.md").read_text() == text.replace("\nold\n", "\nA of doc.md\n")
    assert analysis.check_documents(sections, ["doc.md"], tmp_path) == 0
    with pytest.raises(analysis.UsageError, match="doc.md: no generated section named 'a'"):
        analysis.check_documents({"b": sections["b"]}, ["doc.md"], tmp_path)
    with pytest.raises(analysis.UsageError, match="no block for the generated sections c in doc.md"):
        analysis.check_documents({**sections, "c": sections["b"]}, ["doc.md"], tmp_path)
