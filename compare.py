"""How fast is B against A? Two benchmark commands, run alternately on one machine, with a 95 % interval.

Each round is a whole run of a benchmark script that writes its own result: compare.py adds `--output
<rounds folder>/<a|b>-<pair>.json` to the command and reads the result's `throughput.images_per_second`. Pairs
run in ABBA order (pair 1: A B, pair 2: B A, pair 3: A B, ...), so that a drift of the machine's pace hits both.

    # an option against the default, one GPU
    python compare.py --a 'python ddp_resnet50.py' --b 'python ddp_resnet50.py --compile' --rounds 5 --output cmp.json
    # host-bound: the twin against native at 32 images, until the interval is within +-1 %, for at most 20 minutes
    python compare.py --a 'python ddp_resnet50.py --batch-size-per-device 32' \\
        --b 'python lightning/ddp_resnet50.py --batch-size-per-device 32' \\
        --rounds 30 --until-interval 1 --max-minutes 20 --output twin-32.json
    # all GPUs of a node; leading NAME=value words set a command's environment
    python compare.py --a 'torchrun --standalone --nproc-per-node 8 ddp_resnet50.py' \\
        --b 'NCCL_P2P_DISABLE=1 torchrun --standalone --nproc-per-node 8 ddp_resnet50.py' --rounds 4 --output p2p.json
    # inside a Slurm allocation (slurm/compare.sbatch submits one)
    python compare.py --a 'srun python ddp_resnet50.py' --b 'srun python ddp_resnet50.py --cuda-graphs' ...

Numbers: each pair gives B/A of its two rounds' img/s; `ratio` is the geometric mean of the pair ratios and
`interval_95` its 95 % interval (Student's t on their logarithms: the pairs are the repeats). Every round must run
on the hosts and GPUs of its side's first round, and one side's GPUs must be among the other's (one GPU against
two of one machine is a comparison, two machines are not). A and B may differ in commit or software: the result
lists it in `differences`. Output: FILE.json (schema/compare.schema.json) and FILE.rounds/ beside it (each round's
result and log). Exit codes: 0 done, 1 a round failed (the comparison so far is written, status "failed"), 2 bad
input or rounds on different machines (one line, no comparison written), 130 interrupted by a signal.
"""
import contextlib
import datetime
import json
import math
import os
import pathlib
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "lib"))
from analysis import (EXIT_FAILED, SOFTWARE, OneLineArgumentParser, UsageError, describe_machine,  # noqa: E402
                      machine_of, run_cli, write_json_atomically)

EXIT_INTERRUPTED = 130
ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
ROUND_FILE = re.compile(r"^[ab]-\d+\.(json|log)$")
# Student's t, two-sided 95 % (the 0.975 quantile), for 1 to 30 degrees of freedom
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


class RoundFailed(Exception):
    """A round's command failed or its result is not ok: the comparison stops there."""


def parse_arguments(argv):
    parser = OneLineArgumentParser(prog="compare.py", description=__doc__.split("\n")[0], allow_abbrev=False)
    add = parser.add_argument
    add("--a", required=True, metavar="COMMAND", help="the baseline's command line, shell-quoted")
    add("--b", required=True, metavar="COMMAND", help="the command compared with it")
    add("--rounds", type=int, required=True, metavar="N", help="pairs to run (at most, with the stop options)")
    add("--output", required=True, metavar="FILE.json", help="the comparison; its rounds go to FILE.rounds/")
    add("--until-interval", type=float, metavar="P", help="stop once the 95 %% interval is within +-P %%")
    add("--max-minutes", type=float, metavar="M", help="start no new pair after M minutes")
    add("--overwrite", action="store_true", help="replace an existing comparison and its rounds")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        raise UsageError(f"--rounds {args.rounds}: an interval needs at least 2 pairs")
    if args.until_interval is not None and not args.until_interval > 0:
        raise UsageError(f"--until-interval {args.until_interval}: give a width in per cent above 0")
    if args.max_minutes is not None and not args.max_minutes > 0:
        raise UsageError(f"--max-minutes {args.max_minutes}: give minutes above 0")
    return args


def parse_command(text, flag):
    """(environment, argv) of one COMMAND; --output is compare.py's to add."""
    try:
        words = shlex.split(text)
    except ValueError as error:
        raise UsageError(f"{flag} {text!r}: {error}") from None
    environment = {}
    while words and ENV_WORD.match(words[0]):
        name, value = words.pop(0).split("=", 1)
        environment[name] = value
    if not words:
        raise UsageError(f"{flag} {text!r} has no command: give one such as 'python ddp_resnet50.py'")
    if any(word == "--output" or word.startswith("--output=") for word in words):
        raise UsageError(f"{flag} {text!r} has --output: compare.py gives each round its own --output")
    if shutil.which(words[0]) is None:
        raise UsageError(f"{flag} {text!r}: {words[0]} is not a command found here")
    return environment, words


def prepare_output(args):
    """The comparison's path and its empty rounds folder."""
    output = pathlib.Path(args.output)
    if output.suffix != ".json":
        raise UsageError(f"--output {output}: name a .json file (its rounds go beside it, in a .rounds folder)")
    rounds_dir = output.with_suffix(".rounds")
    if (output.exists() or output.is_symlink()) and not args.overwrite:
        raise UsageError(f"--output {output} exists: pass --overwrite to replace it")
    if output.is_dir():
        raise UsageError(f"--output {output} is a folder")
    old_rounds = [path for path in rounds_dir.glob("*") if ROUND_FILE.match(path.name)]
    if old_rounds and not args.overwrite:
        raise UsageError(f"{rounds_dir} holds another comparison's rounds: pass --overwrite to replace them")
    try:
        rounds_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--output {output}: cannot make {rounds_dir}: {error.strerror}") from None
    for path in old_rounds:
        path.unlink()
    return output, rounds_dir


def pair_order(pair):
    """ABBA: odd pairs run A first, even pairs B first."""
    return ("a", "b") if pair % 2 == 1 else ("b", "a")


def t_975(degrees):
    if degrees <= len(T_975):
        return T_975[degrees - 1]
    z = 1.959964  # beyond the table, the Cornish-Fisher expansion of t around the normal quantile
    return z + (z ** 3 + z) / (4 * degrees) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * degrees ** 2)


def summarize(ratios):
    """(geometric mean, [low, high] 95 % interval, its half-width in per cent) of the pair ratios."""
    if not ratios:
        return None, None, None
    logs = [math.log(ratio) for ratio in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), None, None
    half = t_975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), [math.exp(mean - half), math.exp(mean + half)], 100 * (math.exp(half) - 1)


def verdict(ratio, interval, pairs, noisy_rounds=0, rounds=0):
    counted = f"{pairs} pair{'s' if pairs != 1 else ''}"
    noise = f"; {noisy_rounds} of {rounds} rounds noisy" if noisy_rounds else ""
    if ratio is None:
        return "no complete pair: no comparison"
    if interval is None:
        return f"B/A {ratio:.3f} from {counted}: no interval (it needs 2 pairs){noise}"
    low, high = interval
    if low <= 1 <= high:
        return (f"no difference detectable at this noise: B is between {100 * (1 - low):.1f} % slower and "
                f"{100 * (high - 1):.1f} % faster than A (95 % interval, {counted}{noise})")
    if high < 1:
        return (f"B is {100 * (1 - ratio):.1f} % slower than A "
                f"(95 % interval {100 * (1 - high):.1f}–{100 * (1 - low):.1f} %, {counted}{noise})")
    return (f"B is {100 * (ratio - 1):.1f} % faster than A "
            f"(95 % interval {100 * (low - 1):.1f}–{100 * (high - 1):.1f} %, {counted}{noise})")


def last_line(path):
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def run_to_end(argv, environment, log):
    """The command's exit code; when compare.py is interrupted, the command gets SIGTERM and time to write its
    result (the scripts stop every rank after the same step and keep the steps so far)."""
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, **environment})
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        with contextlib.suppress(KeyboardInterrupt, subprocess.TimeoutExpired):
            process.wait(timeout=60)
        raise


def run_round(command, side, pair, order, rounds_dir, folder):
    """One whole run of a side's command; its round record, or RoundFailed naming the round and why."""
    environment, words = command
    result_path = rounds_dir / f"{side}-{pair}.json"
    log_path = rounds_dir / f"{side}-{pair}.log"
    argv = [*words, "--output", str(result_path)]
    name = f"round {order} (pair {pair}, {side.upper()})"
    started = time.monotonic()
    with open(log_path, "w") as log:
        code = run_to_end(argv, environment, log)
    record = {"order": order, "pair": pair, "side": side, "command": shlex.join(argv),
              "result": os.path.relpath(result_path, folder), "log": os.path.relpath(log_path, folder),
              "exit_code": code, "wall_s": time.monotonic() - started, "status": None, "images_per_second": None,
              "noisy": None, "noise_reason": None}
    if not result_path.exists():
        raise RoundFailed(record, f"{name} failed: exit {code}, no result at {result_path}: {last_line(log_path)}")
    try:
        result = json.loads(result_path.read_text())
    except ValueError as error:
        raise RoundFailed(record, f"{name} failed: {result_path} is not JSON ({error})") from None
    record["status"] = result.get("status")
    record["images_per_second"] = (result.get("throughput") or {}).get("images_per_second")
    stability = result.get("stability") or {}
    record["noisy"], record["noise_reason"] = stability.get("noisy"), stability.get("reason")
    if record["status"] != "ok" or code != 0 or not record["images_per_second"]:
        reason = (result.get("failure") or {}).get("message") or last_line(log_path)
        raise RoundFailed(record, f"{name} failed: exit {code}, status {record['status']}: {reason}")
    return record, result


def check_same_machine(machine, side, record, firsts):
    """Every round on its side's first round's hosts and GPUs; one side's hosts and GPUs among the other's."""
    name, other = f"round {record['order']} (pair {record['pair']}, {side.upper()})", "b" if side == "a" else "a"
    if side in firsts and machine != firsts[side]:
        raise UsageError(f"{name} ran on {describe_machine(machine)}, {side.upper()}'s first round on "
                         f"{describe_machine(firsts[side])}: compare on one machine")
    if other in firsts and not nested(machine, firsts[other]):
        raise UsageError(f"{name} ran on {describe_machine(machine)}, {other.upper()}'s rounds on {describe_machine(firsts[other])}: "
                         f"compare on one machine")
    firsts.setdefault(side, machine)


def nested(one, other):
    """True when one machine's hosts and GPUs are all among the other's, or the other way round."""
    def within(small, large):
        return (set(small["hostnames"]) <= set(large["hostnames"])
                and set(small["gpu_uuids"]) <= set(large["gpu_uuids"]))
    return one["cpu"] == other["cpu"] and (within(one, other) or within(other, one))


def provenance(results):
    """Per side its first round's machine, git and software versions; what differs between A and B or in a side."""
    sides, differences = {}, []
    for side in ("a", "b"):
        facts = [{"machine": machine_of(result), "git": result.get("git") or {},
                  "software": {key: (result.get("software") or {}).get(key) for key in SOFTWARE}}
                 for result_side, result in results if result_side == side]
        if facts:
            sides[side] = facts[0]
        if any(fact["git"] != facts[0]["git"] or fact["software"] != facts[0]["software"] for fact in facts):
            differences.append(f"{side.upper()}'s rounds differ among themselves in commit or software")
    for group, keys in (("git", ("commit", "dirty")), ("software", SOFTWARE)):
        for key in keys if len(sides) == 2 else ():
            a, b = sides["a"][group].get(key), sides["b"][group].get(key)
            if a != b:
                differences.append(f"{group} {key}: A {a}, B {b}")
    return sides, differences


def pairs_of(rounds):
    """Complete pairs, each with its order, both img/s and B/A."""
    pairs = []
    for pair in sorted({record["pair"] for record in rounds}):
        sides = {record["side"]: record for record in rounds if record["pair"] == pair and record["status"] == "ok"}
        if len(sides) == 2:
            a, b = sides["a"]["images_per_second"], sides["b"]["images_per_second"]
            pairs.append({"pair": pair, "order": "".join(pair_order(pair)).upper(), "a_images_per_second": a,
                          "b_images_per_second": b, "ratio": b / a})
    return pairs


def progress(record, rounds_total, rounds):
    ratio, interval, _ = summarize([pair["ratio"] for pair in pairs_of(rounds)])
    running = "-" if ratio is None else f"{ratio:.3f}"
    if interval is not None:
        running += f" ({interval[0]:.3f}–{interval[1]:.3f})"
    print(f"pair {record['pair']}/{rounds_total} {record['side'].upper()}: {record['images_per_second']:.2f} img/s, "
          f"running B/A {running}", flush=True)


def run_comparison(args, commands, rounds_dir, folder):
    """The rounds in ABBA order until a stop rule; (rounds, results, status, stop reason, failure line)."""
    rounds, results, firsts = [], [], {}
    started = time.monotonic()
    stop = "rounds"
    try:
        for pair in range(1, args.rounds + 1):
            if args.max_minutes is not None and time.monotonic() - started >= 60 * args.max_minutes:
                stop = "max_minutes"
                break
            for side in pair_order(pair):
                record, result = run_round(commands[side], side, pair, len(rounds) + 1, rounds_dir, folder)
                check_same_machine(machine_of(result), side, record, firsts)
                rounds.append(record)
                results.append((side, result))
                progress(record, args.rounds, rounds)
            half_width = summarize([each["ratio"] for each in pairs_of(rounds)])[2]
            if args.until_interval is not None and half_width is not None and half_width < args.until_interval:
                stop = "until_interval"
                break
    except RoundFailed as failure:
        record, line = failure.args
        rounds.append(record)
        return rounds, results, "failed", "failed", line
    except KeyboardInterrupt:
        return rounds, results, "interrupted", "interrupted", "interrupted by a signal"
    return rounds, results, "ok", stop, None


def build_comparison(args, rounds, results, status, stop, failure, started_at):
    pairs = pairs_of(rounds)
    ratio, interval, half_width = summarize([pair["ratio"] for pair in pairs])
    sides, differences = provenance(results)
    noisy = sum(1 for record in rounds if record.get("noisy"))
    return {"schema_version": 2, "tool": "compare.py", "status": status, "stop_reason": stop, "failure": failure,
            "commands": {"a": args.a, "b": args.b},
            "options": {"rounds": args.rounds, "until_interval_percent": args.until_interval,
                        "max_minutes": args.max_minutes},
            "ratio": ratio, "interval_95": interval, "interval_half_width_percent": half_width,
            "verdict": verdict(ratio, interval, len(pairs), noisy, len(rounds)), "noisy_rounds": noisy,
            "pairs": pairs, "rounds": rounds,
            **{group: {side: facts[group] for side, facts in sides.items()}
               for group in ("machine", "git", "software")},
            "like_for_like": not differences, "differences": differences,
            "started_at": started_at, "finished_at": utc_now()}


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def interrupt(signum, frame):
    raise KeyboardInterrupt()  # SIGTERM (a Slurm time limit, scancel) ends the comparison as Ctrl-C does


def main(argv=None):
    args = parse_arguments(argv)
    commands = {"a": parse_command(args.a, "--a"), "b": parse_command(args.b, "--b")}
    output, rounds_dir = prepare_output(args)
    started_at = utc_now()
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        rounds, results, status, stop, failure = run_comparison(args, commands, rounds_dir, output.parent)
    finally:
        signal.signal(signal.SIGTERM, previous)
    comparison = build_comparison(args, rounds, results, status, stop, failure, started_at)
    write_json_atomically(output, comparison, overwrite=args.overwrite)
    if failure:
        print(f"compare.py: {failure}", file=sys.stderr, flush=True)
    ratios = ", ".join(f"{pair['ratio']:.3f}" for pair in comparison["pairs"])
    print(f"B/A per pair: {ratios or '-'}")
    print(comparison["verdict"])
    if comparison["differences"]:
        print(f"not like for like: {'; '.join(comparison['differences'])}")
    print(f"comparison: {output} ({status}, stopped by {stop})", flush=True)
    return {"ok": 0, "failed": EXIT_FAILED, "interrupted": EXIT_INTERRUPTED}[status]


if __name__ == "__main__":
    run_cli(main, "compare.py")
