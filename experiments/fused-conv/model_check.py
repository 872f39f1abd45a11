"""--fused-batch-norm keeps torchvision's ResNet-50: one training step of the fused model against the same step in
float64, on the GPU, beside stock torchvision's autocast step against the same float64 reference.

The model has random batch-norm weights, biases and running statistics (not 1, 0, 0 and 1, which would hide their
misuse). One forward (training mode) and backward of the cross-entropy loss, under autocast in --precision (fp16's
loss scaled by LOSS_SCALE and the gradients unscaled in float64, as fp16 training does: unscaled, its gradients
underflow), from one batch of --batch images at --image-size px, channels_last:
    reference   the same model and batch in float64 (no autocast): logits, every parameter's gradient, and every
                buffer after the step (the running statistics and batch counts)
    stock       torchvision's model under autocast
    fused       the same model with the package's fused batch norm (apply_computation_options), under autocast;
                "repeat": a second copy through the graphs the first built and cached
Each is judged by its relative error ||got - reference|| / ||reference||, per tensor. The fused model passes when
its logits' and loss's errors, and its worst and median error over the parameters' gradients and over the running
statistics, are each at most --factor times stock's own (rounding in the same precision) plus 8 units of rounding,
and so are the repeat's. Whether a second step repeats the first bit for bit is recorded, for stock and fused, not
judged. fused_batch_norm.LAYERS says which layers ran each of their four cuDNN graphs fused.

    python experiments/fused-conv/model_check.py --precision fp16 --json FILE   # GPU, nvidia-cudnn-frontend
    python experiments/fused-conv/model_check.py --device cpu --image-size 32 --batch 2   # CPU: PyTorch's ops
    python experiments/fused-conv/model_check.py --summary CHECK.json COMPARE.json   # the README's figures
"""
import copy
import json
import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import probe_common as common  # noqa: E402
from resnet50_ddp_benchmarks import benchmark_extras, fused_batch_norm  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
UNIT_ROUNDING = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "fp32": 2.0 ** -24}
LOSS_SCALE = {"fp16": 1024.0}  # the fastest mode's --loss-scale
KEYS = ("logits", "loss", "grads_worst", "grads_median", "running_worst", "running_median")


def errors(got, want):
    want = want.double()
    scale = want.norm().item()
    return ((got.double() - want).norm().item() / scale) if scale > 0 else (got.double() - want).norm().item()


def step(model, images, labels, dtype, device, scale=1.0):
    """One training step's logits, loss, gradients (by name, unscaled in float64) and buffers after it (by name)."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=dtype, enabled=dtype not in (None, torch.float32)):
        logits = model(images)
        loss = F.cross_entropy(logits, labels)
    (loss * scale).backward()
    return {"logits": logits.detach(), "loss": loss.detach(),
            "grads": {name: p.grad.detach().double() / scale for name, p in model.named_parameters()},
            "buffers": {name: b.detach().clone() for name, b in model.named_buffers()}}


def judged(got, want):
    grads = [errors(got["grads"][name], want["grads"][name]) for name in want["grads"]]
    stats = [errors(got["buffers"][name], want["buffers"][name]) for name in want["buffers"]
             if "running" in name]
    return {"logits": errors(got["logits"], want["logits"]), "loss": errors(got["loss"], want["loss"]),
            "grads_worst": max(grads), "grads_median": statistics.median(grads),
            "running_worst": max(stats), "running_median": statistics.median(stats),
            "batches_tracked_equal": all(torch.equal(got["buffers"][name], want["buffers"][name])
                                         for name in want["buffers"] if name.endswith("num_batches_tracked"))}


def bitwise_equal(one, two):
    return torch.equal(one["logits"], two["logits"]) and all(torch.equal(one["grads"][name], two["grads"][name])
                                                            for name in one["grads"])


def summary(check_path, compare_path):
    """The README's figures: the check's errors, and the eager comparison's img/s, ratios and losses (its rounds'
    results in COMPARE.rounds/)."""
    check = json.loads(pathlib.Path(check_path).read_text())
    compare = json.loads(pathlib.Path(compare_path).read_text())
    fused = ", ".join(f"{pattern} {count}" for pattern, count in check["fused_patterns"].items())
    print(f"{check['device']}, {check['precision']}, batch {check['batch']} at {check['image_size']} px, torch "
          f"{check['torch']}, cuDNN {check['cudnn']}:\n{check['graphs_built']} graphs built, "
          f"{check['graphs_refused']} refused; units fused, of {len(check['layers'])}: {fused}\n")
    print("| step against float64 | logits | loss | gradients, median / worst | running statistics, median / worst |")
    print("|---|---|---|---|---|")
    for name in ("stock", "fused", "fused_repeat"):
        if name in check:
            e = check[name]
            print(f"| {name.replace('_', ' ')} | {e['logits']:.2e} | {e['loss']:.2e} | {e['grads_median']:.2e} / "
                  f"{e['grads_worst']:.2e} | {e['running_median']:.2e} / {e['running_worst']:.2e} |")
    rounds = pathlib.Path(str(compare_path)[:-len(".json")] + ".rounds")
    losses = {path.stem: json.loads(path.read_text())["loss_per_step"] for path in sorted(rounds.glob("*.json"))}
    side = lambda letter: [pair[f"{letter}_images_per_second"] for pair in compare["pairs"]]  # noqa: E731
    low, high = lambda values: f"{min(values):,.0f}", lambda values: f"{max(values):,.0f}"  # noqa: E731
    a, b = [v for k, v in losses.items() if k.startswith("a")], [v for k, v in losses.items() if k.startswith("b")]
    early = 13  # the steps before the synthetic run's loss first jumps
    gap = lambda ones, others: max(abs(x - y) for one in ones for other in others  # noqa: E731
                                   for x, y in zip(one[:early], other[:early]))
    per_pair = ", ".join(f"{pair['ratio']:.3f}" for pair in compare["pairs"])
    dirty = " (uncommitted changes)" if compare["git"]["a"]["dirty"] or compare["git"]["b"]["dirty"] else ""
    print(f"\n- eager, batch 256: A (without) {low(side('a'))}–{high(side('a'))} img/s, B (with) {low(side('b'))}–"
          f"{high(side('b'))} img/s{dirty};\n  B/A {compare['ratio']:.3f} from {len(compare['pairs'])} pairs (per "
          f"pair {per_pair}), {compare['noisy_rounds']} of {2 * len(compare['pairs'])} rounds noisy")
    after = lambda runs: ", ".join(f"{one[3]:.3f}" for one in runs)  # noqa: E731
    print(f"- loss after the first update (step 4): A {after(a)}, B {after(b)};\n  largest difference over the first "
          f"{early} steps: B against A {gap(b, a):.3f}, A against A {gap(a, a[1:]):.3f}")


def main(argv=None):
    parser = common.OneLineArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=sorted(DTYPES), default="fp16")
    parser.add_argument("--batch", type=common.positive_int, default=32)
    parser.add_argument("--image-size", type=common.positive_int, default=224)
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--json")
    parser.add_argument("--summary", nargs=2, metavar=("CHECK", "COMPARE"), help="print the README's figures, stop")
    args = parser.parse_args(argv)
    if args.summary:
        summary(*args.summary)
        return 0
    common.check_json_path(args.json)
    if args.device == "cuda":
        missing = fused_batch_norm.available()
        if missing:
            raise common.UsageError(missing)
    device, dtype = torch.device(args.device), DTYPES[args.precision]
    torch.manual_seed(0)
    import torchvision
    model = torchvision.models.resnet50()
    with torch.no_grad():
        for norm in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
            norm.running_mean.uniform_(-0.5, 0.5)
            norm.running_var.uniform_(0.5, 2.0)
    layout = torch.channels_last
    model = model.to(device, memory_format=layout)
    images = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device).contiguous(
        memory_format=layout)
    labels = torch.randint(0, 1000, (args.batch,), device=device)
    scale = LOSS_SCALE.get(args.precision, 1.0)
    reference = step(copy.deepcopy(model).double(), images.double(), labels, None, device)
    stock, stock_again = (step(copy.deepcopy(model), images, labels, dtype, device, scale) for _ in range(2))
    config = {"stem_conv": "torchvision", "max_pool_backward": "torchvision", "batch_norm": "fused"}
    fused_model = benchmark_extras.apply_computation_options(copy.deepcopy(model), config)
    started = time.perf_counter()
    fused = step(fused_model, images, labels, dtype, device, scale)  # the first step builds the graphs
    first_s = time.perf_counter() - started
    again = step(benchmark_extras.apply_computation_options(copy.deepcopy(model), dict(config)), images, labels,
                 dtype, device, scale)  # a second model: the cached graphs
    result = {"precision": args.precision, "batch": args.batch, "image_size": args.image_size, "factor": args.factor,
              "loss_scale": scale,
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
              "stock": judged(stock, reference), "fused": judged(fused, reference),
              "fused_repeat": judged(again, reference), "stock_repeat_bitwise_equal": bitwise_equal(stock, stock_again),
              "fused_repeat_bitwise_equal": bitwise_equal(fused, again), "first_step_s": first_s,
              "layers": fused_batch_norm.LAYERS, "graphs_built": sum(v is not None for v in
                                                                     fused_batch_norm.GRAPHS.values()),
              "graphs_refused": sum(v is None for v in fused_batch_norm.GRAPHS.values()),
              "refusals": fused_batch_norm.REFUSALS}
    result["fused_patterns"] = {pattern: sum(layer.get(pattern, False) for layer in result["layers"].values())
                                for pattern in fused_batch_norm.PATTERNS}
    slack = 8 * UNIT_ROUNDING[args.precision]
    result["pass"] = all(result[name][key] <= args.factor * result["stock"][key] + slack and
                         result[name]["batches_tracked_equal"] for name in ("fused", "fused_repeat") for key in KEYS)
    if args.json:
        common.write_json(args.json, result)
    print(json.dumps({key: value for key, value in result.items() if key != "layers"}, indent=1))
    print(f"model_check: {'pass' if result['pass'] else 'FAIL'}: fused {result['fused_patterns']} of "
          f"{len(result['layers'])} layers")
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    common.run_guarded(main)
