"""The ceiling on data-parallel efficiency at N GPUs: what communication and data parallelism's own work at a link
leave of a measured one-GPU step, per strategy, each beside how far below their ceiling published runs fell.

    python scaling_model.py RESULT.json [RESULT.json ...] --gpus 8,64,512 --link nvlink4
    python scaling_model.py RESULT.json --gpus 2 --probe probe.json      # the link collective_probe.py measured
    python scaling_model.py RESULT.json --gpus 2 --bandwidth 10 --latency 25
    python scaling_model.py --validate results/ --published my_table.json --json validation.json

RESULT: one-GPU results of ddp_resnet50.py or its Lightning twin, of one workload. The ceiling is not a prediction:
the input pipeline, stragglers and the framework's host work only lower the measured figure (docs/scaling.md).
--validate checks every multi-rank result under the folders (default results/) and every row of the published tables
(--published FILE, repeatable; default docs/published/resnet50_multi_gpu.json, whose README gives the format)
against the ceiling: per subset, the rows above it by more than their noise, named, and the points lost below it.
Exit codes: 0 ok, 2 bad input (one line).
"""
import argparse
import math
import re
import sys

from resnet50_ddp_benchmarks.analysis import (OneLineArgumentParser, UsageError, check_writable, run_cli,
                                              write_json_atomically)
from resnet50_ddp_benchmarks.scaling import (CEILING, LINK_PRESETS, PUBLISHED, REPOSITORY, STRATEGIES, Topology,
    ceiling, ceiling_table, given_link, load_json, local_costs, one_gpu_baseline, preset_link, probe_link,
    published_losses, spread_text, validate, validation_table, workload_of)

PROG = "scaling_model.py"


def parse_arguments(argv):
    parser = OneLineArgumentParser(prog=PROG, description=__doc__.split("\n")[0], allow_abbrev=False,
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add("results", nargs="*", help="one-GPU result JSON files of one workload (one per GPU)")
    add("--gpus", default="2,8,64,512", help="the GPU counts, comma-separated")
    add("--strategies", default=",".join(STRATEGIES), help="the strategies, comma-separated")
    link = parser.add_mutually_exclusive_group()
    link.add_argument("--link", choices=sorted(LINK_PRESETS), help="the link between a node's GPUs, from a preset")
    link.add_argument("--bandwidth", type=float, help="the link's bus bandwidth, GB/s (with --latency)")
    link.add_argument("--probe", help="collective_probe.py's JSON (or a result holding one): the measured link")
    add("--latency", type=float, help="with --bandwidth: a 2-rank all-reduce's latency, us")
    add("--inter-node-link", choices=sorted(LINK_PRESETS), default="ib-ndr400", help="the link between nodes")
    add("--gpus-per-node", type=int, default=8, help="GPUs joined by --link in each node")
    add("--nics-per-node", type=int, help="inter-node NICs per node (default: one per GPU)")
    add("--json", help="write the ceilings (or the validation) to this JSON file")
    add("--validate", nargs="*", metavar="FOLDER", help="check the multi-rank results under these folders (default "
                                                        "results/) and the published tables against the ceiling")
    add("--published", action="append", metavar="FILE", help="with --validate: a table of published measurements "
                                                             f"(repeatable; default {PUBLISHED.relative_to(REPOSITORY)})")
    return parser.parse_args(argv)


def check_arguments(args):
    """Every bad option refused in one line before any work, the output included: (GPU counts, strategies)."""
    if bool(args.results) == (args.validate is not None):
        raise UsageError("give one-GPU RESULT files, or --validate")
    if args.published and args.validate is None:
        raise UsageError("--published goes with --validate")
    if (args.bandwidth is None) != (args.latency is None):
        raise UsageError("--bandwidth and --latency go together")
    if args.bandwidth is not None and not (0 < args.bandwidth < math.inf and 0 <= args.latency < math.inf):
        raise UsageError("--bandwidth must be positive and --latency not negative")
    if args.gpus_per_node < 1 or (args.nics_per_node is not None and args.nics_per_node < 1):
        raise UsageError("--gpus-per-node and --nics-per-node must be positive")
    if args.results and args.link is None and args.bandwidth is None and args.probe is None:
        raise UsageError("give the link: --link PRESET, --bandwidth GB/s --latency us, or --probe FILE")
    for path in args.published or []:
        load_json(path, "table of published measurements")
    if args.json:
        check_writable(args.json, "--json")
    if not re.fullmatch(r"\s*\d{1,7}(\s*,\s*\d{1,7})*\s*", args.gpus or "") or min(map(int, args.gpus.split(","))) < 1:
        raise UsageError(f"--gpus {args.gpus!r}: give GPU counts of 1 or more such as 8,64,512")
    chosen = [part.strip() for part in args.strategies.split(",") if part.strip()]
    if not chosen or set(chosen) - set(STRATEGIES):
        raise UsageError(f"--strategies: {', '.join(set(chosen) - set(STRATEGIES)) or 'none'} not among "
                         f"{', '.join(STRATEGIES)}")
    return [int(part) for part in args.gpus.split(",")], chosen


def read_probe(path):
    data = load_json(path, "probe")
    probe = data.get("collective_probe", data) if isinstance(data, dict) else None
    if not isinstance(probe, dict) or not str(probe.get("schema", "")).startswith("collective_probe/"):
        raise UsageError(f"{path}: no collective_probe.py output (nor a result holding one)")
    return probe


def main_ceilings(args, counts, strategies):
    probe = read_probe(args.probe) if args.probe else None
    baseline = one_gpu_baseline(args.results)
    intra = probe_link(probe, args.probe) if probe else given_link(args.bandwidth, args.latency) \
        if args.bandwidth is not None else preset_link(args.link)
    topology = Topology(intra, preset_link(args.inter_node_link), args.gpus_per_node,
                        args.nics_per_node or args.gpus_per_node)
    local = local_costs(baseline.results[0], probe, args.probe)
    tops = [ceiling(s, n, baseline, workload_of(baseline.config, s), topology, local) for s in strategies
            for n in counts]
    c = baseline.config
    print(f"{c.get('model', 'resnet50')}, {c['image_size']} px, {c['batch_size_per_device']} images per GPU, "
          f"{c['precision']}: one GPU {baseline.images_per_second:,.0f} img/s ({', '.join(baseline.paths)})")
    print(f"link: {topology.describe()}\nper-kernel and copy costs: {local.source}")
    print(f"Each figure is {CEILING}, not a prediction: measured runs fall below it by what the model leaves out.")
    print(ceiling_table(tops, args.gpus_per_node))
    if args.json:
        write_json_atomically(args.json, {
            "model": PROG, "what": CEILING, "one_gpu_runs": baseline.paths, "link": topology.describe(),
            "local_costs": local.source, "ceilings": [
                {"strategy": t.strategy, "gpus": t.n, "ceiling_efficiency": round(t.efficiency, 5),
                 "images_per_second_at_most": round(t.images_per_second, 1), "step_ms_at_least": round(t.step_ms, 4),
                 "published_runs_fell_below": None if t.n == 1 else spread_text(
                     published_losses()[t.n <= args.gpus_per_node]),
                 "terms_ms": {k: round(v, 4) for k, v in t.terms.items()}} for t in tops]})
    return 0


def main(argv=None):
    args = parse_arguments(sys.argv[1:] if argv is None else argv)
    counts, strategies = check_arguments(args)
    if args.validate is None:
        return main_ceilings(args, counts, strategies)
    validation = validate(args.validate or [REPOSITORY / "results"], args.published or [PUBLISHED])
    print(validation_table(validation), end="")
    if args.json:
        write_json_atomically(args.json, validation)
    return 0


if __name__ == "__main__":
    run_cli(main, PROG)
