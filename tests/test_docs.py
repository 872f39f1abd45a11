"""What users rely on in the documents: every generated block is current, relative links resolve, every committed
result has the command that made it (and every command its result, or a line saying why not), and the pinned stack
of constraints.txt is the one behind the committed results."""
import json
import pathlib
import re
import subprocess

import pytest

from conftest import ROOT, load_script

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


@pytest.mark.parametrize("path", [path for path in TEXT_FILES if path == "README.md" or
                                  path.startswith(("docs/", "experiments/", "results/", "lightning/"))])
def test_relative_links_lead_to_committed_files(path):
    """The documents cite result files and each other by relative links: each must exist."""
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
    """The check of report.py's generated blocks (scaling_model.py checks its own document's): a figure edited by
    hand in any of them, or a result added without regenerating, fails here."""
    monkeypatch.chdir(ROOT)
    report = load_script(ROOT / "report.py", "report_for_docs")
    assert report.main(["--check-docs"]) == 0, capsys.readouterr().err
