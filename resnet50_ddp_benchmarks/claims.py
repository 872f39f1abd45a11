"""Every measured figure in the documents is checked by value (tests/test_claims.py).

A measured figure lives in a generated block (`<!-- generated:NAME -->`, a table or inline within a sentence), which
report.py writes from the committed results and `report.py --check-docs` compares with what it would write now, so
that a changed digit there is a stale block. In the hand-written prose there are no measured figures: there a
number is an analytic one, followed by `<!-- computed: EXPRESSION -->` (arithmetic on numbers), whose value, rounded
as the figure is written, must be the figure; or words say what a number would add nothing to.

A figure is a number with a decimal point or thousands separators, a percentage, a ratio written with ×, a signed
difference, a range (`3,498–3,632`) or a number with a unit (`55 ms`, `11,360 MiB`). Bare counts and settings
(`256 images`, `2 GPUs`), versions and dates are not figures, nor hardware data and settings written with a unit
(NOT_MEASURED). Generated blocks, code blocks, code spans, link targets and comments are not prose.
"""
import ast
import operator
import re

from resnet50_ddp_benchmarks.analysis import GENERATED

# The documents whose measured figures are checked (docs/results.md is one generated block; docs/scaling.md and
# docs/published/ are scaling_model.py's documents, which it checks).
DOCUMENTS = ("README.md", "docs/noise.md", "docs/performance.md", "docs/sharding.md", "lightning/README.md")

# Figures that were not measured here: (pattern over the prose, why). Only the matched span is exempt.
NOT_MEASURED = [
    (r"95 % interval", "a confidence level"),
    (r"141 GB", "the H200's memory (datasheet)"),
    (r"989 TFLOP/s", "the H200's dense bf16/fp16 peak (datasheet)"),
    (r"700 W", "the H200's power limit (nvidia-smi)"),
    (r"\d+ MB buckets?", "DDP's bucket size, a setting"),
    (r"every 100 ms", "a sampling setting"),
    (r"\d+–\d+ GPUs", "a span of GPU counts, a setting"),
    (r"torchrun's: 30 s", "a launcher's default grace period, a setting"),
    (r"\d+×\d+", "a kernel or block size"),
    (r"7,162 img/s|7,950", "MLPerf's published per-GPU ResNet-50 figures (DGX H100 v4.0, 8 × H200)"),
]

FENCE = re.compile(r"^```.*?^```[^\n]*$", re.DOTALL | re.MULTILINE)
COMMENT = re.compile(r"<!--(.*?)-->", re.DOTALL)
COMPUTED = re.compile(r"<!--\s*computed:\s*(?P<expression>.*?)\s*-->", re.DOTALL)
LINK_TARGET = re.compile(r"\]\([^)\s]+\)|^\[[^\]]+\]:\s*\S+", re.MULTILINE)
CODE = re.compile(r"`+[^`]+?`+")
VERSION = re.compile(r"\b(?:torch|PyTorch|NCCL|cuDNN|CUDA|Python|Lightning|fairscale|Slurm|torchvision|cu)"
                     r"\s?(?:after |before )?\d+(?:\.\d+)+\+?\w*"
                     r"|\b\d+\.\d+\.\d+\b|\b\d{4}-\d{2}-\d{2}\b|\bv\d+(?:\.\d+)+")
NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
UNIT = r"%|ms\b|µs\b|MiB\b|MB\b|GiB\b|GB\b|img/s|W\b|MHz\b|TB/s|TFLOP/s|GFLOP\b|s\b|points?\b"
FIGURE = re.compile(rf"(?<![\w.,/\-–])(?P<sign>[+−±]|×)?(?P<low>{NUMBER})"
                    rf"(?:\s?–\s?[+−]?(?P<high>{NUMBER}))?(?![\d,]*\.\d)(?![\w])(?P<unit>×(?!\d)|\s?(?:{UNIT}))?")
INDENTED = re.compile(r"(?:^\n)((?: {4}.*\n?)+)", re.MULTILINE)
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.Pow: operator.pow, ast.USub: operator.neg}


def blank(match):
    """The match's text as spaces (newlines kept), so that offsets and line numbers hold."""
    return re.sub(r"[^\n]", " ", match[0])


def figures(text):
    """[(figure, start, end)] of the measured figures in a document's prose, and [(expression, start)] of its
    computed: annotations."""
    text = FENCE.sub(blank, GENERATED.sub(blank, text))
    text = INDENTED.sub(lambda match: match[0] if re.match(r"\s*(?:[-*]|\d+\.)\s", match[1]) else blank(match), text)
    computed = [(match["expression"], match.start()) for match in COMPUTED.finditer(text)]
    for pattern in (COMMENT, LINK_TARGET, CODE, VERSION):
        text = pattern.sub(blank, text)
    exempt = [match.span() for pattern, _ in NOT_MEASURED for match in re.finditer(pattern, text)]
    found = []
    for match in FIGURE.finditer(text):
        low, high, unit, sign = match["low"], match["high"], (match["unit"] or "").strip(), match["sign"]
        bare = high is None and not unit and not sign and re.fullmatch(r"\d+", low)
        if not bare and not any(start <= match.start() < end for start, end in exempt):
            found.append((match[0].strip(), match.start(), match.end()))
    return found, computed


def evaluate(expression):
    """The value of an arithmetic expression of numbers (+ - * / **, parentheses); ValueError otherwise."""
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.operand))
        raise ValueError(f"not arithmetic: {ast.unparse(node)}")
    return value(ast.parse(expression, mode="eval").body)


def check_text(document, text):
    """Every problem of one document's prose, one line each: a measured figure outside a generated block, or a
    computed figure that is not its expression's value."""
    found, computed = figures(text)
    line = lambda offset: text.count("\n", 0, offset) + 1  # noqa: E731
    problems, checked = [], set()
    for expression, position in computed:
        before = [figure for figure in found if figure[2] <= position and figure not in checked]
        if not before or text[before[-1][2]:position].strip(" \n.,;:)"):
            problems.append(f"{document}:{line(position)}: computed: {expression}: no figure right before it")
            continue
        figure, start, _ = before[-1]
        checked.add(before[-1])
        written = FIGURE.match(figure)["low"]
        digits = len(written.split(".")[1]) if "." in written else 0
        try:
            expected = f"{evaluate(expression):,.{digits}f}"
        except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as error:
            problems.append(f"{document}:{line(start)}: computed: {expression}: {error}")
            continue
        if expected.replace(",", "") != written.replace(",", ""):
            problems.append(f"{document}:{line(start)}: {figure} is not {expression} = {expected}")
    problems += [f"{document}:{line(start)}: {figure}: a measured figure outside a generated block (generate it, "
                 "or say it in words)" for figure, start, end in found if (figure, start, end) not in checked]
    return problems
