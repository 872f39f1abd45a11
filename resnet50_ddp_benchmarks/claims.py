"""Every measured figure in the documents' hand-written prose, traced to the committed files and checked against
them (tests/test_claims.py;
`python -m resnet50_ddp_benchmarks.claims [DOCUMENT ...]` prints what fails).

A figure is a number that was measured: one with a decimal point or thousands separators, a percentage, a ratio
written with ×, a signed difference, a range (`3,498–3,632`) or a number with a unit (`55 ms`, `11,360 MiB`,
`4,690 img/s`). Bare counts and settings (`256 images`, `2 GPUs`), versions and dates are not figures; hardware data
and settings written with a unit are listed in NOT_MEASURED. Generated blocks (`<!-- generated:NAME -->`), code
blocks, code spans, link targets and comments are not prose.

A claim is a sentence (an annotation just after its full stop still belongs to it) or a table row. Every one that
holds a figure names its source:

- a link to a committed result (`[s4-…-a](../results/…/s4-native-2gpu-bf16-256-a.json)`) or a code span that names
  one or a glob of them (`results/nvidia-h200-2026-12-01c/s19-*-sums-*.json`);
- or an annotation, a comment the reader does not see, placed right after the figures it covers:
  - `<!-- from: PATHS -->`: the figures come from these files;
  - `<!-- ratio: B-PATHS / A-PATHS; B-PATHS / A-PATHS -->`: the figures set B against A, pair after pair;
  - `<!-- range: PATHS -->`: the figures range over the repeats of the named runs' configurations;
    `<!-- range img/s: PATHS -->` also checks that the range written before it is their img/s, lowest to highest;
  - `<!-- table: NAME -->`: the figures before it (in its table cell) restate the generated block NAME, and appear
    in it as written;
  - `<!-- computed: HOW -->` (analytic figures) and `<!-- published: SOURCE -->` (figures of others).
  A table's header row may name the source of all its rows.
PATHS are files, folders or globs ({a,b} as a shell expands it), relative to the document, the repository or
results/; a name without a folder is in the folder of the name before it.

What is checked, against the committed results (read once; configurations as report.py groups them):

- every path names a committed file;
- like for like: the results named by one `from:` annotation, and those linked from a claim, come from one machine
  (report.py's: the GPUs that ran together) and one build (git commit and software versions); each pair of a
  `ratio:` ran on the same GPUs (for scaling, A's among B's) with the same build; otherwise the claim says so
  ("across machines", "across GPUs", "across commits", "two commits", ...);
- a range covers every committed repeat: each ok result with the configuration of a run that a `range:` names is
  named too;
- picks are said: a claim that rests on a noisy result or a comparison with noisy rounds says "noisy"; a sentence
  that quotes the img/s of a single run, the fastest of three or more repeats of its configuration, says "best of"
  (or "fastest of"); a claim that cites a comparison cites every committed comparison of the same two commands;
- a result written from a dirty tree (its commit does not name the code that ran) is said with the word "dirty".
"""
import functools
import glob
import json
import pathlib
import re
import sys

from resnet50_ddp_benchmarks import analysis
from resnet50_ddp_benchmarks.pairing import load_documents

REPOSITORY = analysis.REPOSITORY
DOCUMENTS = ("README.md", "docs/noise.md", "docs/performance.md", "docs/sharding.md", "lightning/README.md", "slurm/README.md")


def documents(root=REPOSITORY):
    """The documents whose prose is checked: the fixed ones and every README under experiments/."""
    experiments = sorted(str(path.relative_to(root)) for path in pathlib.Path(root).glob("experiments/**/README.md"))
    found = [*DOCUMENTS, *experiments]
    return [document for document in found if (pathlib.Path(root) / document).is_file()]


# Figures that were not measured here: (pattern over a unit's prose, why). Only the matched span is exempt.
NOT_MEASURED = [
    (r"95 % interval", "a confidence level"),
    (r"141 GB", "the H200's memory (datasheet)"),
    (r"989 TFLOP/s", "the H200's dense bf16/fp16 peak (datasheet)"),
    (r"494 in TF32", "the H200's dense TF32 peak (datasheet)"),
    (r"700 W", "the H200's power limit (nvidia-smi)"),
    (r"\d+ MB bucket|\d+ MB reduce bucket", "DDP's bucket size, a setting"),
    (r"every 100 ms|500 ms bins|per 100 MHz", "a sampling setting, a unit"),
    (r"within ±1 %", "compare.py's --until-interval setting"),
    (r"\d+–\d+ GPUs", "a span of GPU counts, a setting"),
    (r"torchrun's: 30 s|30 s by default", "a launcher's default grace period, a setting"),
]

# ---------------------------------------------------------------------------- the prose

GENERATED = re.compile(r"<!-- generated:(?P<name>[a-z0-9-]+) -->\n.*?<!-- /generated:(?P=name) -->", re.DOTALL)
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.DOTALL | re.MULTILINE)
COMMENT = re.compile(r"<!--(.*?)-->", re.DOTALL)
ANNOTATION = re.compile(r"^\s*(?P<kind>from|ratio|range|table|computed|published)(?:\s+(?P<quantity>img/s))?:"
                        r"\s*(?P<args>.*?)\s*$", re.DOTALL)
LINK = re.compile(r"\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")
CODE = re.compile(r"`+([^`]+?)`+")
VERSION = re.compile(r"\b(?:torch|PyTorch|NCCL|cuDNN|CUDA|Python|Lightning|fairscale|Slurm|torchvision|cu)"
                     r"\s?(?:after |before )?\d+(?:\.\d+)+\+?\w*"
                     r"|\b\d+\.\d+\.\d+\b|\b\d{4}-\d{2}-\d{2}\b|\bv\d+(?:\.\d+)+")
NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
UNIT = r"%|ms\b|µs\b|MiB\b|MB\b|GiB\b|GB\b|img/s|W\b|MHz\b|TB/s|TFLOP/s|GFLOP\b|s\b|points?\b"
FIGURE = re.compile(rf"(?<![\w.,/\-–])(?P<sign>[+−±]|×)?(?P<low>{NUMBER})"
                    rf"(?:\s?–\s?[+−]?(?P<high>{NUMBER}))?(?![\d,]*\.\d)(?![\w])(?P<unit>×(?!\d)|\s?(?:{UNIT}))?")
SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bal)(?<!\bvs)(?<=[.!?])(?P<tail>(?:\s*<!--.*?-->)*)\s+"
                          r"(?=[A-Z*_(\[`\"])")
LIST_ITEM = re.compile(r"^\s*(?:[-*]|\d+\.)\s+")


class Unit:
    """A sentence or a table row: its prose (comments, code and link targets left out), its sources."""

    def __init__(self, document, line, raw, header=None):
        self.document, self.line, self.raw = document, line, raw
        self.annotations = []  # (kind, quantity, arguments, offset in raw)
        for match in COMMENT.finditer(raw):
            found = ANNOTATION.match(match[1])
            if found:
                self.annotations.append((found["kind"], found["quantity"], found["args"], match.start()))
        spaces = lambda match: " " * len(match[0])  # noqa: E731 (every mask keeps the offsets of raw)
        text = COMMENT.sub(spaces, raw)
        self.links = [match["target"] for match in LINK.finditer(text)]
        text = LINK.sub(lambda match: (" " + match["text"] if " " in match["text"] else "").ljust(len(match[0])), text)
        self.codes = [match[1] for match in CODE.finditer(text)]
        self.words = text.replace("\n", " ")  # the prose with its code spans, for what a unit says
        self.text = CODE.sub(spaces, text).replace("\n", " ")
        self.header = header  # a table row's header row, whose annotations name every row's source
        self.table = None  # a header row's whole table, whose words count for the header's sources
        self.in_table = raw.lstrip().startswith("|")

    def figures(self):
        """[(figure, start)] of the measured figures in the prose, NOT_MEASURED left out."""
        text = VERSION.sub(lambda match: " " * len(match[0]), self.text)
        exempt = [match.span() for pattern, _ in NOT_MEASURED for match in re.finditer(pattern, text)]
        found = []
        for match in FIGURE.finditer(text):
            if any(start <= match.start() < end for start, end in exempt):
                continue
            low, high, unit, sign = match["low"], match["high"], (match["unit"] or "").strip(), match["sign"]
            if high is None and not unit and not sign and re.fullmatch(r"\d+", low):
                continue  # a bare count or setting
            found.append((match[0].strip(), match.start()))
        return found

    def says(self, *words, segment=None):
        """Whether the unit (or the segment (start, end) of it that a claim covers) says one of the words."""
        text = self.table or (self.words if segment is None else self.words[segment[0]:segment[1]])
        return any(word in re.sub(r"\s+", " ", text).lower() for word in words)

    def segment(self, position):
        """The stretch of the unit an annotation at position covers: from the annotation before it (or the start of
        its table cell) to it."""
        before = [raw.index("-->", offset) + 3 for *_, offset in self.annotations if offset < position
                  for raw in [self.raw]]
        return max([*before, self.raw.rfind("|", 0, position) + 1, 0]), position

    def covered_by_header(self):
        return bool(self.header and self.header.annotations)

    def __repr__(self):
        return f"{self.document}:{self.line}"


def masked(text):
    """The text with what is not prose blanked (its newlines kept, so that line numbers hold)."""
    blank = lambda match: re.sub(r"[^\n]", " ", match[0])  # noqa: E731
    text = GENERATED.sub(blank, text)
    text = FENCE.sub(blank, text)
    lines, previous_blank, in_code = text.split("\n"), True, False
    for index, line in enumerate(lines):
        if line.startswith("    ") and (previous_blank or in_code) and not LIST_ITEM.match(line):
            in_code = True
            lines[index] = " " * len(line)
        elif line.strip():
            in_code = False
        previous_blank = not line.strip()
    return "\n".join(lines)


def units_of(document, text):
    """Every sentence and table row of the document's prose, with its line."""
    lines = masked(text).split("\n")
    units, block, start = [], [], 0

    def flush():
        if not block:
            return
        if block[0].lstrip().startswith("|"):
            header = Unit(document, start + 1, block[0])
            header.table = " ".join(Unit(document, start, row).words for row in block)
            units.append(header)
            for offset, row in enumerate(block[1:], 1):
                if not re.fullmatch(r"\s*\|[\s:|-]*\|?\s*", row):
                    units.append(Unit(document, start + offset + 1, row, header))
            return
        items = []
        for offset, line in enumerate(block):
            if offset == 0 or LIST_ITEM.match(line) or line.lstrip().startswith("#"):
                items.append([start + offset, line])
            else:
                items[-1][1] += "\n" + line
        for item_line, item in items:
            if re.match(r"\s*\[[^\]]+\]:\s", item):
                continue  # a link definition
            position = 0
            for end in [*SENTENCE_END.finditer(item), None]:
                cut = end.start() + len(end["tail"]) if end else len(item)
                sentence = item[position:cut]
                if sentence.strip():
                    units.append(Unit(document, item_line + item[:position].count("\n") + 1, sentence))
                position = end.end() if end else len(item)

    for index, line in enumerate(lines):
        if line.strip():
            if not block:
                start = index
            block.append(line)
        else:
            flush()
            block = []
    flush()
    return units


# ---------------------------------------------------------------------------- the committed files

class Evidence:
    """The committed results (as report.py reads and groups them) and comparisons, read once."""

    def __init__(self, root=REPOSITORY):
        self.root = pathlib.Path(root).resolve()
        runs, comparisons = load_documents([self.root / "results"])
        self.runs = {pathlib.Path(run["path"]).resolve(): run for run in runs}
        for path, run in self.runs.items():
            document = json.loads(path.read_text(encoding="utf-8"))
            run["dirty"] = bool((document.get("git") or {}).get("dirty"))
        self.comparisons = {pathlib.Path(path).resolve(): document for path, document in comparisons}
        self.repeats = {}
        for run in self.runs.values():
            if run["status"] == "ok":
                self.repeats.setdefault(run["config"], []).append(run)

    def expand(self, argument, base):
        """The files a source names: a file, a folder (every file under it) or a glob; relative to base, else to
        the repository. [] where it names nothing."""
        for folder in (base, self.root, self.root / "results"):
            path = (folder / argument).resolve()
            if any(character in argument for character in "*?[{"):
                names = [str(folder / argument)]
                while any("{" in name for name in names):  # {a,b} as a shell expands it
                    names = [name[:match.start()] + choice + name[match.end():]
                             for name in names for match in [re.search(r"\{([^{}]*)\}", name)]
                             for choice in match[1].split(",")]
                found = sorted({pathlib.Path(name).resolve() for each in names
                                for name in glob.glob(each, recursive=True) if pathlib.Path(name).is_file()})
                if found:
                    return found
            elif path.is_dir():
                return sorted(file.resolve() for file in path.rglob("*") if file.is_file())
            elif path.is_file():
                return [path]
        return []

    def generated(self, name):
        """The text of the generated block NAME in one of the documents that hold them, or None."""
        if not hasattr(self, "blocks"):
            self.blocks = {}
            for document in analysis.DOCUMENTS:
                path = self.root / document
                if path.is_file():
                    for match in analysis.GENERATED.finditer(path.read_text(encoding="utf-8")):
                        self.blocks[match["name"]] = match["body"]
        return self.blocks.get(name)

    def relative(self, path):
        return str(path.relative_to(self.root)) if path.is_relative_to(self.root) else str(path)


@functools.lru_cache(maxsize=2)
def evidence(root=REPOSITORY):
    return Evidence(root)


# ---------------------------------------------------------------------------- the checks

def same_devices(b, a):
    """B and A on the same GPUs (for scaling: A's among B's)."""
    return bool(a["devices"]) and (a["devices"] == b["devices"] or a["devices"] < b["devices"])


ACROSS_MACHINES = ("across machines", "across gpus", "different gpus", "different machines", "another gpu",
                   "another machine", "two machines")
ACROSS_BUILDS = ("across commits", "different commits", "two commits", "another commit", "machines and commits")


def across_words(unit, segment, machines, builds):
    problems = []
    if machines and not unit.says(*ACROSS_MACHINES, segment=segment):
        problems.append("its sides ran on different GPUs, and it does not say so (\"across machines\")")
    if builds and not unit.says(*ACROSS_BUILDS, segment=segment):
        problems.append("its sides ran different commits or software, and it does not say so (\"across commits\")")
    return problems


def covered(unit, figures, position):
    """The figures an annotation at position covers: those in its segment."""
    start, end = unit.segment(position)
    return [(figure, offset) for figure, offset in figures if start <= offset < end]


def resolved(run):
    return pathlib.Path(run["path"]).resolve()


def check_unit(unit, facts, base):
    """The problems of one unit, each a line of text.

    Each source is a claim: (kind, files, pairs, segment), where segment is the stretch of the unit whose words
    count for it (an annotation's own, or the whole unit for its links and code spans)."""
    figures = unit.figures()
    problems, claims, described = [], [], False

    def files(argument):
        found = facts.expand(argument, base)
        if not found:
            problems.append(f"names {argument}, which is no committed file")
        return found

    def sides(args):
        """An annotation's files, one list per side ("/" between B and A, ";" between pairs). A name without a
        folder is in the folder of the name before it; a folder followed by such names only gives them its path."""
        tokens = args.replace(";", " ; ").split()
        folder, lists = "", [[]]
        for index, token in enumerate(tokens):
            following = (tokens[index + 1:] + [""])[0]
            if token in ("/", ";"):
                lists.append([])
            elif "/" not in token:
                lists[-1] += files(folder + token)
            elif token.endswith("/") and following not in ("", "/", ";") and "/" not in following:
                folder = token
            else:
                lists[-1] += files(token)
                folder = token.rsplit("/", 1)[0] + "/"
        return lists

    for kind, quantity, args, position in unit.annotations:
        segment = unit.segment(position)
        if kind in ("computed", "published"):
            described = True
            if not args:
                problems.append(f"a {kind}: annotation that does not say how or where from")
        elif kind == "table":
            described = True
            block = facts.generated(args)
            if block is None:
                problems.append(f"table: {args}: no generated block of that name")
                continue
            for figure, _ in covered(unit, figures, position):
                number = FIGURE.match(figure)
                number = number["low"] + (f"–{number['high']}" if number["high"] else "")
                if number not in block:
                    problems.append(f"{figure} is not in the generated block {args} (it says what it says now)")
        elif kind == "ratio":
            separators = [token for token in args.replace(";", " ; ").split() if token in ("/", ";")]
            if separators != ["/", ";"] * (len(separators) // 2) + ["/"]:
                problems.append(f"ratio: {args!r} is not B-files / A-files; B-files / A-files ...")
                continue
            listed = sides(args)
            pairs = [listed[index:index + 2] for index in range(0, len(listed), 2)]
            claims.append(("ratio", [found for pair in pairs for side in pair for found in side], pairs, segment))
        else:
            named = [found for side in sides(args) for found in side]
            claims.append((kind, named, [], segment))
            if kind == "range" and quantity:
                problems += range_values(unit, covered(unit, figures, position), named, facts, quantity)
    ranged = {found for kind, named, _, _ in claims if kind == "range" for found in named}
    linked = [found for target in unit.links for found in
              (files(target.split("#")[0]) if target.split("#")[0].endswith(".json")
               and not re.match(r"[a-z]+:", target) else [])]
    linked += [found for code in unit.codes if "/" in code and re.search(r"\.json$|\*", code) and " " not in code
               for found in facts.expand(code, base)]  # a code span that names no file is a name, not a source
    if linked:
        claims.append(("link", [found for found in linked if found not in ranged], [], None))
    if figures and not any(named for _, named, _, _ in claims) and not described and not unit.covered_by_header():
        shown = ", ".join(figure for figure, _ in figures[:4])
        problems.append(f"{shown}: no source (a link to a committed file or a <!-- from: --> annotation)")
        return [f"{unit}: {problem}" for problem in problems]

    def runs(paths):
        return [facts.runs[path] for path in paths if path in facts.runs]

    cited = {found for _, named, _, _ in claims for found in named}
    for kind, named, pairs, segment in claims:
        # like for like, or said: one from: or the links are one comparison's sides; a ratio pair by pair
        if kind in ("from", "link"):
            group = runs(named)
            problems += across_words(unit, segment, len({run["machine"] for run in group}) > 1,
                                     len({(run["commit"], json.dumps(run["software"], sort_keys=True))
                                          for run in group}) > 1)
        for b_paths, a_paths in pairs:
            b_runs, a_runs = runs(b_paths), runs(a_paths)
            problems += across_words(unit, segment, any(not same_devices(b, a) for b in b_runs for a in a_runs),
                                     any(not analysis.same_build(b, a) for b in b_runs for a in a_runs))
        if kind != "range" and any(facts.comparisons.get(path, {}).get("like_for_like") is False for path in named):
            problems += across_words(unit, segment, True, True)
        # a range names every committed repeat
        if kind == "range":
            for run in runs(named):
                missing = [other for other in facts.repeats.get(run["config"], []) if resolved(other) not in named]
                if run["status"] == "ok" and missing:
                    shown = ", ".join(facts.relative(resolved(other)) for other in missing[:3])
                    problems.append(f"a range that leaves out {len(missing)} committed repeat(s) of the configuration "
                                    f"of {facts.relative(resolved(run))}: {shown}")
        # picks are said: noisy sources, the best of several runs, one comparison of several
        noisy = [path for path in named if (path in facts.runs and facts.runs[path]["noisy"])
                 or (facts.comparisons.get(path, {}).get("noisy_rounds") or 0) > 0]
        if kind != "range" and noisy and not unit.says("noisy", segment=segment):
            problems.append(f"{facts.relative(noisy[0])} is noisy (a noisy result, or noisy rounds), "
                            "and the sentence does not say \"noisy\" with it")
        speeds = named if kind != "ratio" else [found for b_side, _ in pairs for found in b_side]  # not A's
        for run in runs(speeds) if kind != "range" and not unit.in_table else []:
            group = facts.repeats.get(run["config"], []) if run["status"] == "ok" else []
            others = [other for other in group if other is not run]
            quoted = f"{run['images_per_second']:,.0f}" in unit.text  # the run's own speed is what is cited
            best = len(group) >= 3 and run["images_per_second"] > max(other["images_per_second"] for other in others)
            if (best and quoted and not any(resolved(other) in cited for other in others)
                    and not unit.says("best of", "fastest of", segment=segment)):
                problems.append(f"{facts.relative(resolved(run))} is the fastest of {len(group)} repeats of its "
                                "configuration, cited alone, and the sentence does not say \"best of\"")
        for path in named if kind != "range" else []:
            if path not in facts.comparisons:
                continue
            same = [other for other, each in facts.comparisons.items()
                    if each.get("commands") == facts.comparisons[path].get("commands")]
            left_out = [other for other in same if other not in cited]
            if left_out:
                problems.append(f"{facts.relative(path)} is one of {len(same)} committed comparisons of the same "
                                f"commands, and {', '.join(facts.relative(other) for other in left_out)} is not named")
        # a dirty tree is said
        dirty = [run for run in runs(named) if run["dirty"]]
        if dirty and not unit.says("dirty", segment=segment):
            problems.append(f"{facts.relative(resolved(dirty[0]))} was written from a dirty tree (its commit does "
                            "not say which code ran), and the sentence does not say \"dirty\" with it")
    return [f"{unit}: {problem}" for problem in dict.fromkeys(problems)]


def range_values(unit, figures, paths, facts, quantity):
    """The last range among the figures before a `range img/s:` annotation is the lowest and highest img/s of the
    named ok runs, written as the figure writes them."""
    ranges = [FIGURE.match(figure) for figure, _ in figures]
    ranges = [match for match in ranges if match and match["high"]]
    values = [facts.runs[path]["images_per_second"] for path in paths
              if path in facts.runs and facts.runs[path]["status"] == "ok"]
    if not ranges or not values:
        return [f"range {quantity}: no range before the annotation, or no ok result named"]
    low, high = ranges[-1]["low"], ranges[-1]["high"]
    digits = len(low.split(".")[1]) if "." in low else 0
    expected = (f"{min(values):,.{digits}f}", f"{max(values):,.{digits}f}")
    if (low, high) != expected:
        return [f"the range {low}–{high} {quantity} is not the named runs' {expected[0]}–{expected[1]}"]
    return []


def check_document(document, facts=None, root=REPOSITORY, text=None):
    """Every problem of one document's prose, one line each."""
    facts = facts or evidence(pathlib.Path(root))
    path = pathlib.Path(root) / document
    text = path.read_text(encoding="utf-8") if text is None else text
    problems = []
    for unit in units_of(document, text):
        problems += check_unit(unit, facts, path.parent)
    return problems


def main(argv=None):
    problems = [problem for document in (argv or documents()) for problem in check_document(document)]
    print("\n".join(problems) or "every figure has its source")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
