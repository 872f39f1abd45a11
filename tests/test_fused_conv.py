"""experiments/fused-conv/fused_probe.py on the CPU: its shape table is ResNet-50's, the fused graphs' algebra is
autograd's, and bad input is refused in one line before anything is measured."""
import re

import pytest

from conftest import ROOT, load_script, pretend_gpus, run_script

PROBE = ROOT / "experiments" / "fused-conv" / "fused_probe.py"


def test_the_shapes_are_resnet50s_and_the_decomposed_unit_is_autograds():
    """experiments/fused-conv/README.md: 22 shapes, 52 convolutions (torchvision's model on the meta device); BN
    folded into scale + bias, ReLU's mask recomputed from x * S + B, BN's backward from saved statistics or from the
    two sums of dgrad_drelu_sums' epilogue give autograd's outputs and gradients in float64."""
    probe = load_script(PROBE, "fused_probe_under_test")
    probe.check()  # raises SystemExit on any difference
    assert sum(shape[5] for shape in probe.SHAPES) == 52


def test_the_two_numbers_of_a_shape():
    """The 3x3 convolution of the first stage at batch 256: 2 * 256 * 56^2 * 64 * 64 * 9 FLOPs forward, twice that
    backward; the fused forward moves x, W and y once (fp16)."""
    probe = load_script(PROBE, "fused_probe_under_test")
    numbers = probe.two_numbers((64, 64, 3, 1, 56, 3), 256)
    assert numbers["flops_fwd"] == 2 * 256 * 56 * 56 * 64 * 64 * 9 and numbers["flops_bwd"] == 2 * numbers["flops_fwd"]
    activation = 256 * 64 * 56 * 56 * 2
    assert numbers["bytes_fused_fwd"] == 2 * activation + 64 * 64 * 9 * 2
    assert probe.two_numbers((64, 64, 3, 2, 56, 1), 256)["flops_fwd"] == numbers["flops_fwd"] // 4  # 28 x 28 out
    strided = probe.two_numbers((256, 512, 1, 2, 56, 1), 256)  # a strided 1x1 reads only the pixels it samples
    assert strided["bytes_fused_fwd"] == 256 * 256 * 28 * 28 * 2 + 512 * 256 * 2 + 256 * 512 * 28 * 28 * 2


@pytest.mark.parametrize("argv,rule", [
    (["--shapes", "22"], "argument --shapes: must be 'all' or shape indices 0-21 joined by commas, got 22"),
    (["--shapes", "1,x"], "argument --shapes: must be 'all' or shape indices 0-21 joined by commas, got 1,x"),
    (["--precision", "fp8"], "argument --precision: invalid choice"),
    (["--rotate", "0"], "argument --rotate: must be a positive integer, got 0"),
    (["--json", "{file}/out.json"], "--json directory {file} cannot be written"),
    ([], "times cuDNN's fused convolution graphs on a CUDA GPU and none is visible (--check runs on the CPU)"),
])
def test_bad_input_is_refused_before_measuring(argv, rule, tmp_path, monkeypatch):
    pretend_gpus(monkeypatch, count=0)  # the same on a machine with a GPU
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    probe = load_script(PROBE, "fused_probe_under_test")
    with pytest.raises(probe.common.UsageError, match=re.escape(rule.format(file=a_file))):
        probe.main([arg.format(file=a_file) for arg in argv])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a-file"]


def test_without_the_cudnn_package_it_exits_2_in_one_line(tmp_path, monkeypatch):
    """A GPU but no nvidia-cudnn-frontend: one line naming the package, exit 2, no file."""
    pretend_gpus(monkeypatch, count=1)
    monkeypatch.setitem(__import__("sys").modules, "cudnn", None)  # import cudnn raises ImportError
    probe = load_script(PROBE, "fused_probe_under_test")
    with pytest.raises(probe.common.UsageError, match="needs the package nvidia-cudnn-frontend"):
        probe.main(["--json", str(tmp_path / "out.json")])
    assert list(tmp_path.iterdir()) == []


def test_bad_input_is_one_line_and_exit_2_on_the_command_line(tmp_path):
    proc = run_script(PROBE, ["--shapes", "99", "--json", str(tmp_path / "out.json")])
    assert (proc.returncode, proc.stdout, proc.stderr.count("\n")) == (2, "", 1)
    assert proc.stderr.startswith("fused_probe.py: error: argument --shapes")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_the_readme_tables_are_what_the_committed_data_gives(precision, capsys):
    """experiments/fused-conv/README.md's table rows and the lines of its patterns are --table's output of the
    committed JSON (the fp16 table in full; of the bf16 one, the README quotes only its pattern lines' content)."""
    probe = load_script(PROBE, "fused_probe_under_test")
    data = PROBE.parent / "data" / f"fused-{precision}.json"
    assert probe.main(["--table", str(data)]) == 0
    printed = capsys.readouterr().out
    readme = (PROBE.parent / "README.md").read_text()
    if precision == "fp16":
        rows = [line.replace("<!-- from: data/fused-fp16.json -->", "") for line in readme.splitlines()
                if line.startswith(("| shape", "| **52")) or line.startswith("| ") and "×" in line]
        assert len(rows) == 24 and all(row in printed for row in rows)  # the header, 22 shapes, the totals
    else:
        assert "- forward: fused for 0 of 22 shapes" in printed and "- wgrad: fused for 0 of 22 shapes" in printed
        assert "- dgrad_drelu__dbn: fused for 22 of 22 shapes" in printed
        assert "| 17.92 |" in printed and "17.92 ms" in readme
