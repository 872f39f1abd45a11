"""The ceiling on data-parallel efficiency at N GPUs: what communication and data parallelism's own work at a link
leave of a measured one-GPU step, per strategy, each beside how far below their ceiling published runs fell.

    python scaling_model.py RESULT.json [RESULT.json ...] --gpus 8,64,512 --link nvlink4   # or --probe probe.json
    python scaling_model.py --validate results/ --published my_table.json --json validation.json

RESULT: one-GPU results of ddp_resnet50.py or its Lightning twin, of one workload. --validate checks the multi-rank
results under the folders and every row of the published tables (docs/published/README.md gives the format) against
the ceiling: per subset, the rows above it beyond their noise, named, and the points lost below it (docs/scaling.md).
Exit codes: 0 ok, 2 bad input (one line).
"""
import argparse
import re
import sys

from resnet50_ddp_benchmarks.analysis import (OneLineArgumentParser, UsageError, check_writable, run_cli,
                                              write_json_atomically)
from resnet50_ddp_benchmarks.scaling import (CEILING, LINK_PRESETS, PUBLISHED, REPOSITORY, STRATEGIES, Topology,
    ceiling, ceiling_table, load_json, local_costs, one_gpu_baseline, preset_link, probe_link,
    published_losses, spread, validate, validation_table, workload_of)

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
    link.add_argument("--probe", help="collective_probe.py's JSON (or a result holding one): the measured link")
    add("--inter-node-link", choices=sorted(LINK_PRESETS), default="ib-ndr400", help="the link between nodes")
    add("--gpus-per-node", type=int, default=8, help="GPUs joined by --link in each node")
    add("--nics-per-node", type=int, help="inter-node NICs per node (default: one per GPU)")
    add("--json", help="write the ceilings (or the validation) to this JSON file")
    add("--validate", nargs="*", metavar="FOLDER", help="check the multi-rank results under these folders (default "
                                                        "results/) and the published tables against the ceiling")
    add("--published", action="append", metavar="FILE", help="with --validate: a table of published measurements, "
                                                             "repeatable (default: docs/published/'s)")
    return parser.parse_args(argv)


def check_arguments(args):
    """Every bad option refused in one line before any work, the output included: (GPU counts, strategies)."""
    if bool(args.results) == (args.validate is not None):
        raise UsageError("give one-GPU RESULT files, or --validate")
    if args.published and args.validate is None:
        raise UsageError("--published goes with --validate")
    if args.gpus_per_node < 1 or (args.nics_per_node is not None and args.nics_per_node < 1):
        raise UsageError("--gpus-per-node and --nics-per-node must be positive")
    if args.results and args.link is None and args.probe is None:
        raise UsageError("give the link: --link PRESET or --probe FILE")
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


def main_ceilings(args, counts, strategies):
    probe = load_json(args.probe, "probe") if args.probe else None
    if isinstance(probe, dict) and "collective_probe" in probe:  # a result holding one
        probe = probe["collective_probe"]
    baseline = one_gpu_baseline(args.results)
    intra = probe_link(probe, args.probe) if probe else preset_link(args.link)
    topology = Topology(intra, preset_link(args.inter_node_link), args.gpus_per_node,
                        args.nics_per_node or args.gpus_per_node)
    local = local_costs(baseline.results[0], probe, args.probe)
    c = baseline.results[0]["config"]
    tops = [ceiling(s, n, baseline, workload_of(c, s), topology, local) for s in strategies for n in counts]
    print(f"{c.get('model', 'resnet50')}, {c['image_size']} px, {c['batch_size_per_device']} images per GPU, "
          f"{c['precision']}: one GPU {baseline.images_per_second:,.0f} img/s ({', '.join(baseline.paths)})")
    link = (f"{intra.name} ({intra.source}); between nodes of {topology.per_node} GPUs: {args.inter_node_link} x "
            f"{topology.nics} NICs per node ({topology.inter.source})")
    print(f"link: {link}")
    print(f"Each figure is {CEILING}, not a prediction: measured runs fall below it by what the model leaves out.")
    print(ceiling_table(tops, args.gpus_per_node))
    if args.json:
        write_json_atomically(args.json, {
            "model": PROG, "what": CEILING, "one_gpu_runs": baseline.paths, "link": link, "ceilings": [
                {"strategy": t.strategy, "gpus": t.n, "ceiling_efficiency": round(t.efficiency, 5),
                 "step_ms_at_least": round(t.step_ms, 4),
                 "published_runs_fell_below_points": None if t.n == 1 else dict(zip(
                     ("median", "least", "most", "rows"), spread(published_losses()[t.n <= args.gpus_per_node]))),
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
