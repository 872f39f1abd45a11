"""How fast is B against A? Two benchmark commands, run alternately on one machine, with a 95 % interval.

    python compare.py --a 'python ddp_resnet50.py' --b 'python ddp_resnet50.py --compile' --rounds 30 \\
        --until-interval 1 --max-minutes 20 --output cmp.json

Each round is a whole run of a side's command (leading NAME=value words set its environment) with `--output
FILE.rounds/<a|b>-<pair>.json` added, in ABBA order (A B, B A, A B, ...) so that a drift of the machine hits both.
`ratio` is the geometric mean of the pairs' B/A img/s, `interval_95` its 95 % interval (Student's t on their logs);
below 4 pairs the verdict gives no interval (t's 1 or 2 degrees of freedom make it 13 or 4 spreads wide) and says
how many pairs to run; --until-interval stops no earlier than 4.
Every round runs on its side's first round's hosts and GPUs, one side's among the other's; A and B may differ in commit
or software (`differences`). Output: FILE.json (schema/compare.schema.json) and FILE.rounds/, which one run holds at a
time. Exit codes: 0 done; 1 a round failed (the comparison so far is written) or the comparison could not be written
(the verdict is printed); 2 bad input, an output that cannot be written or rounds on different machines (one line;
before any round where it can be told); 130 interrupted.
"""
import contextlib
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

from resnet50_ddp_benchmarks.analysis import (EXIT_FAILED, MIN_PAIRS, SOFTWARE, OneLineArgumentParser, UsageError,
    build_of, check_writable, half_width_percent, describe_machine, machine_of, read_result_file, result_validator, run_cli,
    write_json_atomically)

EXIT_CODES = {"ok": 0, "failed": EXIT_FAILED, "interrupted": 130}
ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
UTC = "%Y-%m-%dT%H:%M:%SZ"
ROUND_FILE = re.compile(r"^[ab]-\d+\.(json|log)$")
ORDER = {0: ("b", "a"), 1: ("a", "b")}  # ABBA: pair % 2 gives the order of the pair's sides, odd pairs A first


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
    for flag, value in (("--until-interval", args.until_interval), ("--max-minutes", args.max_minutes)):
        if value is not None and not value > 0:
            raise UsageError(f"{flag} {value}: give a number above 0")
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


def output_paths(args):
    """The comparison's path and its rounds folder's."""
    output = pathlib.Path(args.output)
    if output.suffix != ".json":
        raise UsageError(f"--output {output}: name a .json file (its rounds go beside it, in a .rounds folder)")
    if (output.exists() or output.is_symlink()) and not args.overwrite:
        raise UsageError(f"--output {output} exists: pass --overwrite to replace it")
    if output.is_dir():
        raise UsageError(f"--output {output} is a folder")
    return output, output.with_suffix(".rounds")


@contextlib.contextmanager
def claimed(rounds_dir, output):
    """The rounds folder's .lock file while the comparison runs: a second run with the same --output is refused."""
    lock = rounds_dir / ".lock"
    try:
        rounds_dir.mkdir(parents=True, exist_ok=True)
        os.close(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as error:
        if lock.exists():
            raise UsageError(f"--output {output}: another compare.py holds it (remove {lock} if none runs)") from None
        raise UsageError(f"--output {output}: cannot write in {rounds_dir}: {error.strerror}") from None
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)  # removed by hand meanwhile


def clear_rounds(args, output, rounds_dir):
    """Remove an old comparison's rounds (--overwrite) once the comparison's folder has taken a file."""
    old_rounds = [path for path in rounds_dir.iterdir() if ROUND_FILE.match(path.name)]
    if old_rounds and not args.overwrite:
        raise UsageError(f"{rounds_dir} holds another comparison's rounds: pass --overwrite to replace them")
    for path in old_rounds:
        if path.is_dir():
            raise UsageError(f"{path} is a folder, not a round's file: remove it or choose another --output")
    check_writable(output)
    for path in old_rounds:
        try:
            path.unlink()
        except OSError as error:
            raise UsageError(f"--overwrite: cannot remove {path}: {error.strerror}") from None


def require_scipy():
    try:
        import scipy.stats  # noqa: F401  (Student's t, in half_width_percent)
    except ImportError:
        raise UsageError("compare.py needs scipy: pip install scipy (or pip install -e '.[report]')") from None


def summarize(ratios):
    """(geometric mean, [low, high] 95 % interval, its half-width in per cent) of the pair ratios."""
    if not ratios:
        return None, None, None
    mean = math.exp(statistics.fmean(math.log(ratio) for ratio in ratios))
    if len(ratios) < 2:
        return mean, None, None
    half_width = half_width_percent(ratios, len(ratios))
    return mean, [mean / (1 + half_width / 100), mean * (1 + half_width / 100)], half_width


def pairs_for(ratios, percent=1.0):
    """The pairs whose 95 % interval would be within +-percent at the spread of these pair ratios (at least
    MIN_PAIRS; None where the spread is unknown)."""
    if len(ratios) < 2:
        return None
    return next((n for n in range(MIN_PAIRS, 10_000) if half_width_percent(ratios, n) <= percent), 10_000)


def verdict(ratio, interval, pairs, noisy_rounds=0, rounds=0, ratios=()):
    counted = f"{pairs} pair{'s' if pairs != 1 else ''}"
    noise = f"; {noisy_rounds} of {rounds} rounds noisy" if noisy_rounds else ""
    if ratio is None:
        return "no complete pair: no comparison"
    if pairs < MIN_PAIRS:  # Student's t with 1 or 2 degrees of freedom: an interval of 13 or 4 sd, no answer
        needed = pairs_for(ratios)
        spread = f"; about {needed:,} for +-1 % at this spread" if needed else ""
        return (f"too few pairs for an interval: B/A {ratio:.3f} from {counted}; run at least {MIN_PAIRS} pairs "
                f"(--rounds {MIN_PAIRS}){spread}{noise}")
    low, high = (100 * abs(end - 1) for end in interval)
    if interval[0] <= 1 <= interval[1]:
        return (f"no difference detectable at this noise: B is between {low:.1f} % slower and {high:.1f} % faster "
                f"than A (95 % interval, {counted}{noise})")
    near, far = sorted((low, high))
    return (f"B is {100 * abs(ratio - 1):.1f} % {'faster' if ratio > 1 else 'slower'} than A "
            f"(95 % interval {near:.1f}–{far:.1f} %, {counted}{noise})")


def last_line(path):
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def run_to_end(argv, environment, log):
    """The command's exit code; when compare.py is interrupted, the command gets SIGTERM and a minute to finish."""
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
    result, problem = read_result_file(result_path)  # the schema's rules: a positive, finite img/s where ok
    if problem:
        raise RoundFailed(record, f"{name} failed: exit {code}, its result {result_path}: {problem}")
    record["status"] = result["status"]
    record["images_per_second"] = (result["throughput"] or {}).get("images_per_second")
    record["noisy"], record["noise_reason"] = ((result.get("stability") or {}).get(key) for key in ("noisy", "reason"))
    if record["status"] != "ok" or code != 0:
        reason = (result["failure"] or {}).get("message") or last_line(log_path)
        raise RoundFailed(record, f"{name} failed: exit {code}, status {record['status']}: {reason}")
    return record, result


def check_same_machine(machine, side, record, firsts):
    """Every round on its side's first round's hosts and GPUs; one side's hosts and GPUs among the other's."""
    name, other = f"round {record['order']} (pair {record['pair']}, {side.upper()})", "b" if side == "a" else "a"
    if side in firsts and machine != firsts[side]:
        raise UsageError(f"{name} ran on {describe_machine(machine)}, {side.upper()}'s first round on "
                         f"{describe_machine(firsts[side])}: compare on one machine")
    if other in firsts and not nested(machine, firsts[other]):
        raise UsageError(f"{name} ran on {describe_machine(machine)}, {other.upper()}'s rounds on "
                         f"{describe_machine(firsts[other])}: compare on one machine")
    firsts.setdefault(side, machine)


def nested(one, other):
    """True when one machine's hosts and GPUs are all among the other's, or the other way round."""
    mine, theirs = ({*machine["hostnames"], *machine["gpu_uuids"]} for machine in (one, other))
    return one["cpu"] == other["cpu"] and (mine <= theirs or theirs <= mine)


def provenance(results):
    """Per side its first round's machine, git and software versions; what differs between A and B or in a side."""
    sides, differences = {}, []
    for side in ("a", "b"):
        facts = [{"machine": machine_of(result), "git": result["git"], "software": build_of(result)["software"]}
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
    """Complete pairs of good rounds, each with its order, both img/s and B/A."""
    pairs = []
    for pair in sorted({record["pair"] for record in rounds}):
        sides = {record["side"]: record for record in rounds if record["pair"] == pair}
        if len(sides) == 2:
            a, b = sides["a"]["images_per_second"], sides["b"]["images_per_second"]
            pairs.append({"pair": pair, "order": "".join(ORDER[pair % 2]).upper(), "a_images_per_second": a,
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
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # a Slurm time limit or scancel: as Ctrl-C
    try:
        for pair in range(1, args.rounds + 1):
            if args.max_minutes is not None and time.monotonic() - started >= 60 * args.max_minutes:
                stop = "max_minutes"
                break
            for side in ORDER[pair % 2]:
                record, result = run_round(commands[side], side, pair, len(rounds) + 1, rounds_dir, folder)
                check_same_machine(machine_of(result), side, record, firsts)
                rounds.append(record)
                results.append((side, result))
                progress(record, args.rounds, rounds)
            half_width = summarize([each["ratio"] for each in pairs_of(rounds)])[2]
            if (args.until_interval is not None and half_width is not None and half_width < args.until_interval
                    and pair >= MIN_PAIRS):
                stop = "until_interval"
                break
    except RoundFailed as failure:
        record, line = failure.args
        rounds.append(record)
        return rounds, results, "failed", "failed", line
    except KeyboardInterrupt:
        return rounds, results, "interrupted", "interrupted", "interrupted by a signal"
    finally:
        signal.signal(signal.SIGTERM, previous)
    return rounds, results, "ok", stop, None


def build_comparison(args, rounds, results, status, stop, failure, started_at):
    pairs = pairs_of(rounds[:-1] if status == "failed" else rounds)  # a failed round is the last
    ratio, interval, half_width = summarize([pair["ratio"] for pair in pairs])
    sides, differences = provenance(results)
    noisy = sum(1 for record in rounds if record.get("noisy"))
    return {"schema_version": 2, "tool": "compare.py", "status": status, "stop_reason": stop, "failure": failure,
            "commands": {"a": args.a, "b": args.b},
            "options": {"rounds": args.rounds, "until_interval_percent": args.until_interval,
                        "max_minutes": args.max_minutes},
            "ratio": ratio, "interval_95": interval, "interval_half_width_percent": half_width,
            "verdict": verdict(ratio, interval, len(pairs), noisy, len(rounds), [pair["ratio"] for pair in pairs]),
            "noisy_rounds": noisy,
            "pairs": pairs, "rounds": rounds,
            **{group: {side: facts[group] for side, facts in sides.items()}
               for group in ("machine", "git", "software")},
            "like_for_like": not differences, "differences": differences,
            "started_at": started_at, "finished_at": time.strftime(UTC, time.gmtime())}


def tell(comparison, output, unwritten):
    if comparison["failure"]:
        print(f"compare.py: {comparison['failure']}", file=sys.stderr, flush=True)
    ratios = ", ".join(f"{pair['ratio']:.3f}" for pair in comparison["pairs"])
    print(f"B/A per pair: {ratios or '-'}")
    print(comparison["verdict"])
    if comparison["differences"]:
        print(f"not like for like: {'; '.join(comparison['differences'])}")
    if unwritten:
        print(f"compare.py: error: {unwritten}; the rounds are in {output.with_suffix('.rounds')}", file=sys.stderr)
    else:
        print(f"comparison: {output} ({comparison['status']}, stopped by {comparison['stop_reason']})")


def main(argv=None):
    args = parse_arguments(argv)
    commands = {"a": parse_command(args.a, "--a"), "b": parse_command(args.b, "--b")}
    require_scipy(), result_validator()  # the libraries that the statistics and the rounds' results need
    output, rounds_dir = output_paths(args)
    with claimed(rounds_dir, output):
        clear_rounds(args, output, rounds_dir)
        started_at = time.strftime(UTC, time.gmtime())
        outcome = run_comparison(args, commands, rounds_dir, output.parent)
        comparison = build_comparison(args, *outcome, started_at)
        try:
            write_json_atomically(output, comparison, overwrite=args.overwrite)
            unwritten = None
        except (OSError, UsageError) as error:  # a full disk; UsageError: another run wrote the file meanwhile
            unwritten = f"cannot write {output}: {getattr(error, 'strerror', None) or error}"
    tell(comparison, output, unwritten)
    return EXIT_FAILED if unwritten else EXIT_CODES[comparison["status"]]


if __name__ == "__main__":
    run_cli(main, "compare.py")
