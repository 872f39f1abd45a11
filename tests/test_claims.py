"""Every measured figure in the documents' hand-written prose names its committed source, and what it claims holds
in the committed files (the package's claims.py): ratios like for like or said not to be, ranges over every committed repeat,
noisy rounds, the best of several runs, one comparison of several and dirty trees said.

The committed results are read once for the module (claims.evidence()). The checker's own rules are tested on
sentences written to break each one, against the same committed files."""
import pytest

from resnet50_ddp_benchmarks import claims

S11 = "nvidia-h200-x2-2026-11-30f"
S14 = "nvidia-h200-x2-2026-11-30i"
S17 = "nvidia-h200-x2-2026-12-01"
DDP2 = "nvidia-h200-x2-2026-11-30"
BF16 = "cmp-fastest-bf16-vs-default.json"


@pytest.fixture(scope="module")
def facts():
    return claims.evidence()


@pytest.mark.parametrize("document", claims.documents())
def test_every_figure_of_the_prose_names_its_source_and_holds(document, facts):
    problems = claims.check_document(document, facts)
    assert not problems, "\n".join(problems)


def problems_of(text, facts, document="docs/performance.md"):
    return claims.check_document(document, facts, text=text)


# Each: a sentence that breaks one rule, the words of the problem it must raise, and the sentence put right.
PLANTED = {
    "a figure without a source": (  # the kinds of figure that did not hold, each planted back
        "The fastest mode runs 1.716 times the default.\n",
        "no source",
        f"The fastest mode runs 1.716 times the default (noisy<!-- from: nvidia-h200-2026-12-02a/{BF16}\n"
        f"nvidia-h200-2026-12-01e/{BF16} -->).\n"),
    "a ratio across commits": (
        f"Without the buffer broadcast it scaled 98.8 %<!-- ratio: {S11}/s11-native-2gpu-bf16-256-nobb-b.json /\n"
        f"{S11}/s11-native-1gpu-bf16-256-gpu0.json {S11}/s11-native-1gpu-bf16-256-gpu1.json -->.\n",
        "different commits",
        f"Without the buffer broadcast it scaled 98.8 % across commits<!-- ratio:\n"
        f"{S11}/s11-native-2gpu-bf16-256-nobb-b.json /\n"
        "s11-native-1gpu-bf16-256-gpu0.json s11-native-1gpu-bf16-256-gpu1.json -->.\n"),
    "a ratio across GPUs": (
        f"The stem options made the step 2.6 % faster (7,839 against 7,638<!-- ratio:\n"
        f"{S17}/s17-native-1gpu-fp16ls-256-compile-cdt-graphs-fast-cold-gpu0.json /\n"
        f"{S17}/s17-native-1gpu-fp16ls-256-compile-cdt-graphs-cold-gpu1.json -->).\n",
        "different GPUs",
        f"The stem options made the step 2.6 % faster across GPUs (7,839 against 7,638<!-- ratio:\n"
        f"{S17}/s17-native-1gpu-fp16ls-256-compile-cdt-graphs-fast-cold-gpu0.json /\n"
        f"{S17}/s17-native-1gpu-fp16ls-256-compile-cdt-graphs-cold-gpu1.json -->).\n"),
    "a range that leaves out a repeat": (
        f"Captured, 32 images ran 3,498–3,632 img/s<!-- range: {S14}/s14-native-1gpu-bf16-32-graphs-*.json -->.\n",
        "leaves out 1 committed repeat",
        f"Captured, 32 images ran 3,476–3,632 img/s<!-- range img/s: {S14}/s14-native-1gpu-bf16-32-graphs-*.json\n"
        "nvidia-h200-x2-2026-11-29/native-1gpu-bf16-32-graphs.json -->.\n"),
    "a range whose ends are not the runs'": (
        f"Captured, 32 images ran 3,498–3,632 img/s<!-- range img/s: {S14}/s14-native-1gpu-bf16-32-graphs-*.json\n"
        "nvidia-h200-x2-2026-11-29/native-1gpu-bf16-32-graphs.json -->.\n",
        "is not the named runs' 3,476–3,632",
        f"Captured, 32 images ran 3,476–3,632 img/s<!-- range img/s: {S14}/s14-native-1gpu-bf16-32-graphs-*.json\n"
        "nvidia-h200-x2-2026-11-29/native-1gpu-bf16-32-graphs.json -->.\n"),
    "a headline on noisy rounds": (
        f"In bf16 the fastest mode runs 1.716 times the default<!-- from: nvidia-h200-2026-12-02a/{BF16}\n"
        f"nvidia-h200-2026-12-01e/{BF16} -->.\n",
        "does not say \"noisy\"",
        f"In bf16 the fastest mode runs 1.716 times the default, its rounds noisy<!-- from:\n"
        f"nvidia-h200-2026-12-02a/{BF16} nvidia-h200-2026-12-01e/{BF16} -->.\n"),
    "one comparison of several": (
        f"In bf16 the fastest mode runs 1.716 times the default, its rounds noisy<!-- from:\n"
        f"nvidia-h200-2026-12-02a/{BF16} -->.\n",
        f"nvidia-h200-2026-12-01e/{BF16} is not named",
        "In bf16 the fastest mode runs 1.716 times the default, its rounds noisy (and 1.683 in another\n"
        f"comparison<!-- from: nvidia-h200-2026-12-02a/{BF16} nvidia-h200-2026-12-01e/{BF16} -->).\n"),
    "the best of several runs": (
        "The fastest mode reaches 8,115 img/s<!-- from:\n"
        "nvidia-h200-2026-12-01d/native-1gpu-fp16ls-256-best.json -->.\n",
        "does not say \"best of\"",
        "The fastest mode reaches 8,115 img/s at best of 12 runs<!-- from:\n"
        "nvidia-h200-2026-12-01d/native-1gpu-fp16ls-256-best.json -->.\n"),
    "a dirty tree": (
        f"Without bucket views it scaled 97.2 %<!-- ratio: {DDP2}/ddp2-native-2gpu-bf16-256-default.json /\n"
        f"{DDP2}/ddp2-native-1gpu-bf16-256-gpu0.json {DDP2}/ddp2-native-1gpu-bf16-256-gpu1.json -->.\n",
        "dirty tree",
        "Without bucket views it scaled 97.2 % (dirty tree)<!-- ratio:\n"
        f"{DDP2}/ddp2-native-2gpu-bf16-256-default.json /\n"
        f"{DDP2}/ddp2-native-1gpu-bf16-256-gpu0.json {DDP2}/ddp2-native-1gpu-bf16-256-gpu1.json -->.\n"),
    "a generated figure restated out of date": (
        "Two GPUs scale 97.6–98.3 % eager<!-- table: performance -->.\n",
        "is not in the generated block performance",
        "Two GPUs scale 97.7–98.3 % eager<!-- table: performance -->.\n"),
    "a source that is no committed file": (
        f"It ran 9,999 img/s<!-- from: {DDP2}/no-such-run.json -->.\n",
        "which is no committed file",
        f"It ran 9,298 img/s (dirty tree<!-- from: {DDP2}/ddp2-native-2gpu-bf16-256-bv.json -->).\n"),
    "linked runs of two machines compared": (
        f"Twin against native: 9,130 against 9,266 ([a](../results/{DDP2}/final2-lightning-2gpu-bf16-256.json),\n"
        f"[b](../results/{DDP2}/twins2-native-2gpu-bf16-256-bv.json)), dirty tree.\n",
        "different GPUs",
        "Twin against native: 9,130 against 9,266 across machines\n"
        f"([a](../results/{DDP2}/final2-lightning-2gpu-bf16-256.json),\n"
        f"[b](../results/{DDP2}/twins2-native-2gpu-bf16-256-bv.json)), dirty tree.\n"),
}


@pytest.mark.parametrize("name", PLANTED)
def test_a_planted_figure_fails_and_its_repair_passes(name, facts):
    planted, why, repaired = PLANTED[name]
    problems = problems_of(planted, facts)
    assert any(why in problem for problem in problems), f"{name}: {problems}"
    assert problems_of(repaired, facts) == [], name


def test_what_is_not_prose_is_not_checked(facts):
    text = ("<!-- generated:performance -->\n| a | 1.716 |\n<!-- /generated:performance -->\n\n"
            "```\nB is 4.1 % slower than A\n```\n\n"
            "Run `python compare.py --rounds 5 --until-interval 1.5` (torch 2.11.0, NCCL 2.28.9, 2026-12-01);\n"
            "an H200 (141 GB, 989 TFLOP/s) with 256 images and 2 GPUs, a 95 % interval.\n\n"
            "    indented code 12.5 ms\n")
    assert problems_of(text, facts) == []


def test_a_table_header_names_the_source_of_its_rows(facts):
    header = ("| mode | img/s<!-- from: nvidia-h200-2026-12-01d/native-1gpu-bf16-256-[ab].json --> |\n"
              "|---|---|\n| eager | 4,704 and 4,717 |\n")
    assert problems_of(header, facts) == []
    assert "no source" in problems_of(header.replace("<!-- from:", "<!-- nothing:"), facts)[0]


def test_an_annotation_after_the_full_stop_belongs_to_its_sentence(facts):
    text = ("It ran 4,704 img/s. <!-- from: nvidia-h200-2026-12-01d/native-1gpu-bf16-256-a.json --> "
            "Then 1.5 ms more.\n")
    problems = problems_of(text, facts)
    assert len(problems) == 1 and "1.5 ms" in problems[0] and "no source" in problems[0]


def test_a_name_without_a_folder_is_in_the_folder_of_the_name_before_it(facts):
    base = facts.root / "docs"
    assert facts.expand("nvidia-h200-2026-12-01d/native.json", base) == [
        facts.root / "results/nvidia-h200-2026-12-01d/native.json"]
    assert len(facts.expand(f"{S14}/s14-{{lightning,native}}-2gpu-bf16-32-graphs-{{c,d}}.json", base)) == 4
    text = (f"Twin against native 0.994<!-- ratio: {S14}/s14-lightning-2gpu-bf16-32-compile-graphs-c.json /\n"
            "s14-native-2gpu-bf16-32-compile-graphs-c.json -->.\n")
    assert problems_of(text, facts) == []
