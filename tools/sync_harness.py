"""Copy the shared harness block of ddp_resnet50.py into the other benchmark scripts.

The scripts are single files on purpose (copy one to a cluster, read it top to bottom), so the harness
(argument checks, timing, statistics, environment capture, JSON writing, failure handling) is repeated
in each. ddp_resnet50.py holds the master copy; this tool replaces the block between the markers in
the others, and `--check` only reports whether they differ (tests/test_harness_copies.py runs it).
Copying moves the Lightning twin's lines, so it also renumbers the code map in lightning/README.md
(`name()` — line N, and the line that creates the model), which tests/test_lightning.py checks.

    python tools/sync_harness.py          # copy
    python tools/sync_harness.py --check  # exit 1 when a copy differs
"""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MASTER = ROOT / "ddp_resnet50.py"
COPIES = [ROOT / "lightning" / "ddp_resnet50.py", ROOT / "oss_benchmark.py"]
BEGIN = "# ============================================================================ harness\n"
END = "# ============================================================================ end of harness\n"
TWIN, TWIN_README = ROOT / "lightning" / "ddp_resnet50.py", ROOT / "lightning" / "README.md"


def harness_block(text, path):
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SystemExit(f"{path}: needs exactly one harness begin and end marker")
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    if stop <= start + len(BEGIN):
        raise SystemExit(f"{path}: the harness end marker comes before its begin marker")
    return start, stop


def renumber_code_map():
    """Point every `name()` — line N of the Lightning README at where that function or ResNet50Benchmark method
    now starts, and the model's line at the one that calls get_model(name, weights=None). True when it changed."""
    source = TWIN.read_text().splitlines()
    module_class = next(i for i, text in enumerate(source, 1) if text.startswith("class ResNet50Benchmark("))

    def line_of(method, name):
        pattern = rf"    def {name}\b" if method else rf"(def|class) {name}\b"
        found = [i for i, text in enumerate(source, 1) if re.match(pattern, text) and (not method or i > module_class)]
        if not found:
            sys.exit(f"sync_harness.py: lightning/README.md's code map names {name}(), which {TWIN.relative_to(ROOT)} no longer "
                     f"defines: fix the map by hand")
        return found[0]

    readme = TWIN_README.read_text()
    updated = re.sub(r"`(ResNet50Benchmark\.)?(\w+)(\(\))?` — line \d+",
                     lambda m: f"`{m[1] or ''}{m[2]}{m[3] or ''}` — line {line_of(m[1], m[2])}", readme)
    model_line = next(i for i, text in enumerate(source, 1) if "get_model(name, weights=None" in text)
    updated = re.sub(r"(`[\w.]+\([\w, ]*weights=None\)` at line )\d+", lambda m: f"{m[1]}{model_line}", updated)
    if updated != readme:
        TWIN_README.write_text(updated)
    return updated != readme


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="report differing copies instead of copying")
    args = parser.parse_args()
    master = MASTER.read_text()
    start, stop = harness_block(master, MASTER)
    block = master[start:stop]
    differing, missing = [], [str(path.relative_to(ROOT)) for path in COPIES if not path.exists()]
    if missing:
        print("harness copies missing: " + ", ".join(missing))
        return 1
    for path in COPIES:
        text = path.read_text()
        begin, end = harness_block(text, path)
        if text[begin:end] != block:
            differing.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_text(text[:begin] + block + text[end:])
    if args.check and differing:
        print("harness differs from ddp_resnet50.py in: " + ", ".join(differing))
        return 1
    if differing:
        print("copied the harness into: " + ", ".join(differing))
    if not args.check and renumber_code_map():
        print("renumbered the code map in lightning/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
