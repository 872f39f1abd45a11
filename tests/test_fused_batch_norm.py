"""--fused-batch-norm on the CPU: it names its dependency and its GPU in one line (exit 2, nothing written); its units
are PyTorch operators that torch.compile traces whole; and the fused model, with every layer in PyTorch's operators
(cuDNN's graphs run on the GPU: experiments/fused-conv/model_check.py), is torchvision's ResNet-50 in float64.
tests/test_speed_options.py checks it beside the other computation options."""
import copy
import json
import sys
import types

import pytest

from conftest import NATIVE, ROOT, SMALL, clean_env, expect_usage_error, one_error_line, pretend_gpus, run_script

CHECK = ROOT / "experiments" / "fused-conv" / "model_check.py"


@pytest.fixture
def fused(native):
    from resnet50_ddp_benchmarks import fused_batch_norm
    return fused_batch_norm


@pytest.mark.parametrize("case", ["no package", "CPU device", "with sums"])
def test_it_names_what_it_needs_in_one_line(case, native, fused, tmp_path, monkeypatch, capsys):
    """Without nvidia-cudnn-frontend, on the CPU (where the harness's own rule finds no GPU for --device cuda), and
    beside --sums-batch-norm, which replaces the same batch norms: exit 2, one line, nothing written."""
    monkeypatch.setitem(sys.modules, "cudnn", None if case == "no package" else types.ModuleType("cudnn"))
    pretend_gpus(monkeypatch, 1)
    argv = ["--fused-batch-norm", *(["--device", "cpu"] if case == "CPU device" else []),
            *(["--sums-batch-norm"] if case == "with sums" else [])]
    expect_usage_error(native, argv, "--fused-batch-norm", tmp_path / "r.json", monkeypatch, capsys)


def test_without_the_package_the_command_line_exits_2_in_one_line(tmp_path):
    stub = tmp_path / "stub" / "cudnn"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('no cuDNN frontend here')\n")
    output = tmp_path / "r.json"
    proc = run_script(NATIVE, [*SMALL, "--fused-batch-norm", "--output", str(output)],
                      env=clean_env(PYTHONPATH=str(stub.parent)))
    assert proc.returncode == 2 and len(one_error_line(proc.stderr)) == 1, proc.stderr
    assert not output.exists()


def unit_inputs(torch, layout):
    torch.manual_seed(0)
    x = (torch.randn(3, 6, 7, 7, dtype=torch.float64) * 2 + 0.5).contiguous(memory_format=layout)
    weight = torch.randn(8, 6, 3, 3, dtype=torch.float64).contiguous(memory_format=layout)
    gamma, beta = torch.rand(6, dtype=torch.float64) + 0.5, torch.rand(6, dtype=torch.float64) - 0.5
    var, mean = torch.var_mean(x, dim=(0, 2, 3), unbiased=False)
    return x, weight, gamma, beta, mean, torch.rsqrt(var + 1e-5)


@pytest.mark.parametrize("layout", ["contiguous_format", "channels_last"])
def test_the_unit_is_batch_norm_relu_conv_with_its_statistics(fused, layout):
    """In float64: y = conv(ReLU(BN(x))) with x's batch statistics, y's sum and sum of squares, and autograd's
    gradients of x (through the batch statistics too), W, gamma and beta; the outputs keep x's memory format."""
    import torch
    x, weight, gamma, beta, mean, invstd = unit_inputs(torch, getattr(torch, layout))
    leaves = [t.clone().requires_grad_(True) for t in (x, weight, gamma, beta)]
    want = torch.nn.functional.conv2d(torch.relu(torch.nn.functional.batch_norm(
        leaves[0], None, None, leaves[2], leaves[3], training=True, eps=1e-5)), leaves[1], None, 2, 1)
    dy = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, leaves, dy)
    leaves = [t.clone().requires_grad_(True) for t in (x, weight, gamma, beta)]
    y, total, squares = fused.bn_relu_conv(*leaves, mean, invstd, 2, 1, "unit")
    grads = torch.autograd.grad(y, leaves, dy)
    assert torch.allclose(y, want, rtol=1e-10, atol=1e-12)
    assert torch.allclose(total, want.sum((0, 2, 3))) and torch.allclose(squares, (want * want).sum((0, 2, 3)))
    for got, expected in zip(grads, want_grads):
        assert torch.allclose(got, expected, rtol=1e-9, atol=1e-11)
    assert y.is_contiguous(memory_format=getattr(torch, layout))
    assert fused.LAYERS["unit"] == dict.fromkeys(fused.PATTERNS, False)  # no cuDNN graph on the CPU


def test_the_units_are_operators_that_compile_traces_whole(fused):
    """PyTorch's own operator checks (schema, fake tensors, autograd registration), and the fused model compiled
    with fullgraph=True (a graph break raises) gives eager's loss and gradients."""
    import torch
    inputs = unit_inputs(torch, torch.channels_last)
    torch.library.opcheck(fused.bn_relu_conv, (inputs[0].requires_grad_(True), *inputs[1:], 1, 1, "unit"))
    torch.manual_seed(0)
    model = fused.FusedBottleneck(256, 64).double()
    model.fused_names = ("block.conv2", "block.conv3")  # what fuse_batch_norms names a model's blocks' layers
    twin = copy.deepcopy(model)
    x = torch.randn(2, 256, 8, 8, dtype=torch.float64)
    eager = model(x).square().mean()
    compiled = torch.compile(twin, backend="aot_eager", fullgraph=True)(x).square().mean()
    grads = [torch.autograd.grad(loss, list(net.parameters())) for loss, net in ((eager, model), (compiled, twin))]
    assert torch.allclose(eager, compiled, rtol=1e-12)
    assert all(torch.allclose(a, b, rtol=1e-10, atol=1e-14) for a, b in zip(*grads))


def test_it_refuses_a_model_that_is_not_resnets(fused):
    import torch
    import torchvision
    model = torchvision.models.resnet50()
    model.layer1[0].bn1 = torch.nn.BatchNorm2d(64, momentum=None)  # a cumulative average: not ResNet's
    with pytest.raises(ValueError):
        fused.fuse_batch_norms(model)


def test_the_gpu_check_runs_and_judges_on_the_cpu(tmp_path):
    """experiments/fused-conv/model_check.py end to end on the CPU (every layer in PyTorch's operators, fp32 against
    float64): it passes, records all 32 units and writes its JSON."""
    output = tmp_path / "check.json"
    proc = run_script(CHECK, ["--device", "cpu", "--precision", "fp32", "--image-size", "64", "--batch", "4",
                              "--json", str(output)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(output.read_text())
    assert result["pass"] and len(result["layers"]) == 32 and result["fused_patterns"]["forward"] == 0


def test_the_readme_figures_are_what_the_committed_data_gives(capsys):
    """experiments/fused-conv/README.md's lines on the option are `model_check.py --summary` of the committed
    check and comparison, line for line."""
    data = CHECK.parent / "data"
    proc = run_script(CHECK, ["--summary", str(data / "model-check-fp16.json"), str(data / "eager-fused.json")])
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    readme = (CHECK.parent / "README.md").read_text().splitlines()
    assert proc.returncode == 0 and len(lines) == 10 and all(line in readme for line in lines), proc.stderr
