"""The repository is a product: its text says what the code does and what was measured, not how the work went, and
names no place outside the repository; the main documents stay within their length budgets; relative links resolve.

Scanned: every tracked text file (md, txt, sh, py, toml, cfg, yml, sbatch). Not scanned: the raw result files
(JSON, the gzipped nvidia-smi logs) and the probes' logs. They are data: they record exactly what ran, on which
host, from which folder and with which command line, and must stay as the runs wrote them (results/README.md), so
a host's paths inside them are evidence, not prose.
"""
import pathlib
import re
import subprocess

import pytest

from conftest import ROOT

TEXT_SUFFIXES = {".md", ".txt", ".sh", ".py", ".toml", ".cfg", ".yml", ".yaml", ".sbatch"}
PROCESS_TALK = [(re.compile(pattern, re.IGNORECASE), what) for pattern, what in (
    (r"\bsessions?\b", "work sessions"),
    (r"\bdevice[ ]calls?\b", "calls of the GPU lending tool"),
    (r"\bcalls? \d+\b", "numbered calls"),
    (r"\bsupers[e]d", "replaced work"),
    (r"\bissues? #?\d+\b", "an internal issue number"),
    (r"(?<![\w/.&-])#\d+\b", "an internal issue number"),  # owner/repo#123 names an upstream issue and is allowed
)]
# "session" in its technical senses: pytest's fixture scope, a POSIX process session, Lightning's interactive jobs
TECHNICAL_SESSION = re.compile(r"scope=[\"']session[\"']|start_new_session|\b(?:own|new|interactive) session\b",
                               re.IGNORECASE)
# (a letter in brackets keeps this file from naming the places it looks for)
OUTSIDE_ANYWHERE = [re.compile(pattern) for pattern in (r"\.\./shar[e]d\b", r"/w[o]rk/", r"/h[o]me/", r"/r[o]ot/",
                                                        r"/U[s]ers/")]
OUTSIDE_IN_DOCS = [re.compile(r"/tmp/")]  # code and its docstrings may name a scratch file; documents may not
LINE_BUDGETS = {"README.md": 250, "docs/performance.md": 300, "docs/sharding.md": 350, "lightning/README.md": 150}
BYTE_BUDGETS = {"README.md": 20 * 1024}
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


# this file is left out: its samples of what it looks for would trip it
TEXT_FILES = [path for path in tracked_files() if pathlib.PurePath(path).suffix in TEXT_SUFFIXES and
              path != "tests/test_docs.py"]


def problems_in(path, text):
    """Each line that talks about the process or names a path outside the repository, with what it names."""
    document = pathlib.PurePath(path).suffix in (".md", ".txt")
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        prose = TECHNICAL_SESSION.sub("", line)
        whats = [what for pattern, what in PROCESS_TALK if pattern.search(prose)]
        whats += [f"a path outside the repository ({pattern.pattern})" for pattern in
                  OUTSIDE_ANYWHERE + (OUTSIDE_IN_DOCS if document else []) if pattern.search(line)]
        found += [f"{path}:{number}: {what}: {line.strip()[:100]}" for what in whats]
    return found


@pytest.mark.parametrize("path", TEXT_FILES)
def test_text_talks_about_the_product_not_the_process(path):
    problems = problems_in(path, (ROOT / path).read_text(errors="replace"))
    assert not problems, "\n".join(problems)


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


def test_the_checks_see_what_they_look_for():
    """Each pattern catches what it is for and lets the technical uses of its words pass."""
    # each sample is split in two so that this file does not itself say what it looks for
    caught = problems_in("docs/x.md", "\n".join([
        "In the third session we ran it.", "call 4 cut the run", "the dev" "ice calls", "kept in super" "seded-runs",
        "see iss" "ue 27", "fixed in #" "27", "the log in ../sh" "ared/device.md", "run /wo" "rk/main/x", "ls /tmp/x",
        "/ho" "me/me/x"]))
    outside = [f"a path outside the repository ({pattern.pattern})" for pattern in [*OUTSIDE_ANYWHERE[:2],
                                                                                    *OUTSIDE_IN_DOCS,
                                                                                    OUTSIDE_ANYWHERE[2]]]
    assert [problem.split(": ")[1] for problem in caught] == [
        "work sessions", "numbered calls", "calls of the GPU lending tool", "replaced work",
        "an internal issue number", "an internal issue number", *outside]
    assert not problems_in("tests/x.py", "\n".join([
        '@pytest.fixture(scope="session")', "subprocess.Popen(cmd, start_new_session=True)",
        "Lightning takes the job for an interactive session", "pytorch/pytorch#181789 fixed it",
        "python x.py --output /tmp/smoke.json", "## 1. Install"]))


@pytest.mark.parametrize("folder", sorted(path.parent.name for path in ROOT.glob("results/*/commands.txt")))
def test_every_result_file_has_its_command(folder):
    """A campaign's commands.txt names the output of every result file in its folder (oss_benchmark.py writes
    <output stem>-<strategy>.json), and every probe output it names outside the folder exists."""
    campaign = ROOT / "results" / folder
    text = (campaign / "commands.txt").read_text()
    stems = set(re.findall(r"--output (\S+)\.json", text))
    files = [str(path.relative_to(campaign))[:-len(".json")] for path in campaign.rglob("*.json")]
    orphans = [name for name in files if name not in stems and not any(name.startswith(stem + "-") for stem in stems)]
    assert not orphans, f"{folder}: no command in commands.txt writes {orphans}"
    elsewhere = re.findall(r"(?:--json|--output-json|>) (\.\./\S+)", text)
    missing = [path for path in elsewhere if not (campaign / path).exists()]
    assert not missing, f"{folder}: commands.txt names outputs that are not committed: {missing}"
