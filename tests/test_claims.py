"""Every measured figure in README.md, docs/ and lightning/README.md is checked by value (the package's claims.py):
it is in a block report.py generates from the committed results, or an analytic figure whose expression gives it.
The tests plant a changed digit in every figure, of each kind of source, and see the check fail."""
import re

import pytest

from resnet50_ddp_benchmarks import analysis, claims
from conftest import ROOT, load_script

report = load_script(ROOT / "report.py", "report_for_claims")
GENERATED_DOCUMENTS = analysis.DOCUMENTS


@pytest.fixture(scope="module")
def blocks():
    """Every generated block as report.py writes it now, computed once: {name: function of the document}."""
    runs, comparisons = report.load_documents([ROOT / "results"])
    cache = {}

    def cached(name, build):
        def block(document):
            if (name, document) not in cache:
                cache[name, document] = build(document)
            return cache[name, document]
        return block
    return {name: cached(name, build) for name, build in report.sections(runs, comparisons).items()}


def planted(text, start, end):
    """The text with the last digit of the number at start..end changed."""
    last = max(index for index in range(start, end) if text[index].isdigit())
    return text[:last] + str((int(text[last]) + 1) % 10) + text[last + 1:]


@pytest.mark.parametrize("document", claims.DOCUMENTS)
def test_every_figure_of_the_prose_is_computed_and_holds(document):
    problems = claims.check_text(document, (ROOT / document).read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("document", claims.DOCUMENTS)
def test_a_changed_digit_of_a_computed_figure_fails(document):
    text = (ROOT / document).read_text()
    found, computed = claims.figures(text)
    for figure, start, end in found:
        assert claims.check_text(document, planted(text, start, end)), f"{document}: {figure} changed, unnoticed"


def test_a_hand_written_figure_fails_and_words_pass():
    assert claims.check_text("x.md", "The default runs 4,695 img/s on one H200.\n")
    assert claims.check_text("x.md", "Two GPUs scale 97.7 % eager.\n")
    assert claims.check_text("x.md", "It holds 48.7 MiB<!-- computed: 2 * 2 -->.\n")
    assert claims.check_text("x.md", "It holds 4<!-- computed: __import__('os') -->.\n")
    assert not claims.check_text("x.md", "The default keeps one H200 busy with 256 images on 2 GPUs.\n")
    assert not claims.check_text("x.md", "P is 97.49 MiB<!-- computed: 25557032 * 4 / 2**20 -->.\n")


def test_what_is_not_prose_is_not_checked():
    text = ("<!-- generated:performance -->\n| a | 1.716 |\n<!-- /generated:performance -->\n\n"
            "Inline <!-- generated:interleaved-1 -->0.956 (0.953–0.960)<!-- /generated:interleaved-1 --> ends.\n\n"
            "```\nB is 4.1 % slower than A\n```\n\n"
            "Run `python compare.py --rounds 5 --until-interval 1.5` (torch 2.11.0, NCCL 2.28.9, 2026-12-01);\n"
            "an H200 (141 GB, 989 TFLOP/s) with 256 images and 2 GPUs, a 95 % interval.\n\n"
            "    indented code 12.5 ms\n")
    assert claims.check_text("x.md", text) == []


@pytest.mark.parametrize("document", GENERATED_DOCUMENTS)
def test_a_changed_digit_of_any_generated_figure_fails(document, blocks):
    """Each figure of each generated block (tables and inline ones alike), a digit changed, makes its block stale
    against what report.py writes from the committed results: --check-docs (test_docs.py) fails."""
    text = (ROOT / document).read_text()
    assert analysis.regenerated(document, text, blocks)[1] == [], f"{document}: stale before any plant"
    plants = 0
    for block in analysis.GENERATED.finditer(text):
        for match in claims.FIGURE.finditer(block["body"]):
            if not re.search(r"\d", match[0]) or (match["high"] is None and not match["unit"] and "." not in
                                                 match["low"] and "," not in match["low"]):
                continue  # a count, which the tests of report.py check
            start = block.start("body") + match.start()
            stale = analysis.regenerated(document, planted(text, start, start + len(match[0])), blocks)[1]
            assert stale == [block["name"]], f"{document}: {match[0]} in {block['name']} changed, unnoticed"
            plants += 1
    assert plants, f"{document}: no generated figure"
