"""What the analysis tools (report.py, compare.py, scaling_model.py, tools/telemetry.py) share: reading and
validating result files, the machine and software a result ran on, atomic writes, one-line errors, and the engine
that writes generated blocks into the documents.

No benchmark script imports this module: they stay self-contained.
"""
import argparse
import contextlib
import errno
import functools
import json
import math
import os
import pathlib
import re
import stat
import statistics
import sys
import uuid

REPOSITORY = pathlib.Path(__file__).resolve().parent.parent
SCHEMA_PATH = REPOSITORY / "schema" / "result.schema.json"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
SCHEMA_VERSION = 2  # the result files' format that the analysis tools read (schema/result.schema.json)
MIN_PAIRS = 4  # compare.py: fewer pairs give no interval worth a verdict (t at 1-2 degrees of freedom)
# The packages whose versions a result records: results that differ in one of them are not like for like.
SOFTWARE = ("python", "torch", "cuda", "cudnn", "nccl", "torchvision", "lightning", "fairscale")
# A list of plain values longer than this is validated through a sample (schema_sample).
SAMPLED_LIST_LENGTH = 16
RESULT_LIMIT = 64 * 2**20  # bytes: a result or a document is a few MiB at most (a link to /dev/zero is endless)
READ = set()  # the real paths of the files this process was asked to read: write_atomically() replaces none


# ---------------------------------------------------------------------------- one-line errors

class UsageError(Exception):
    """Bad input: one line on stderr, exit code 2, no traceback."""


class OneLineArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def run_cli(main, program):
    """Exit with main()'s code; bad input (UsageError) as one line '<program>: error: ...' and exit 2."""
    try:
        sys.exit(main())
    except UsageError as error:
        print(f"{program}: error: {error}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USAGE)


# ---------------------------------------------------------------------------- reading files

def find_result_files(paths):
    """The *.json files under the given files and folders (searched recursively; hidden files and folders, such as
    a run's half-written .tmp-*.json, left out), each once, in the order given."""
    files, seen = [], set()
    for given in paths:
        path = pathlib.Path(given)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.json")
                           if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts))
        elif path.is_file():
            found = [path]
        else:
            raise UsageError(f"{given}: no such file or folder")
        for file in found:
            if file.resolve() not in seen:
                seen.add(file.resolve())
                files.append(file)
    return files


def open_regular(path, limit=None, record=True):
    """A binary stream of path if it is a regular file (of at most limit bytes), else OSError: a device, a FIFO or a
    link to one would be read for ever or until memory runs out. record: path joins READ."""
    if record:
        READ.add(os.path.realpath(path))
    stream = open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb")  # a FIFO opens without waiting for a writer
    status = os.fstat(stream.fileno())
    if not stat.S_ISREG(status.st_mode) or status.st_size > (limit or math.inf):
        stream.close()
        raise OSError(errno.EINVAL, f"not a regular file{f' of at most {limit >> 20} MiB' if limit else ''}", path)
    return stream


def read_json(path):
    """(document, None) or (None, why it cannot be read, in a few words)."""
    try:
        with open_regular(path, RESULT_LIMIT) as stream:
            text = stream.read().decode("utf-8")
    except FileNotFoundError:
        return None, "no such file"
    except (OSError, UnicodeDecodeError) as error:
        return None, f"cannot be read ({error.__class__.__name__}: {error})"
    try:
        return json.loads(text), None
    except RecursionError:
        return None, "not readable JSON (nested too deeply)"
    except ValueError as error:
        return None, f"not JSON ({error})"


def load_json(path, what="file"):
    """The document at path, or UsageError naming the path and why it cannot be read."""
    document, problem = read_json(path)
    if problem:
        raise UsageError(f"{path}: {problem}" if problem == "no such file" else f"{path}: not a JSON {what}: {problem}")
    return document


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def half_width_percent(ratios, pairs):
    """The half-width (per cent) of the 95 % interval of B/A after this many pairs at the spread of these pair
    ratios: t(0.975, pairs - 1) x the standard deviation of their logs / sqrt(pairs); the smallest detectable."""
    from scipy.stats import t
    spread = statistics.stdev(math.log(ratio) for ratio in ratios)
    return 100 * (math.exp(t.ppf(0.975, pairs - 1) * spread / math.sqrt(pairs)) - 1)


def is_harness_cost(document):
    """A measurement of tools/harness_cost.py (the loop's own cost, docs/performance.md), not a benchmark result."""
    return isinstance(document, dict) and document.get("tool") == "harness_cost" and "ratio_pooled" in document


def is_comparison(document):
    """A comparison file of compare.py (B against A over paired rounds), not a benchmark result."""
    return isinstance(document, dict) and document.get("tool") == "compare.py"


@functools.lru_cache(maxsize=1)
def result_validator():
    try:
        import jsonschema
    except ImportError:
        raise UsageError("reading result files needs jsonschema: pip install jsonschema "
                         "(or pip install -e '.[report]')") from None
    return jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))


def schema_sample(value):
    """The document with each long list of plain values cut to a sample: one value of each type, and the smallest
    and largest number. The schema's rules on such lists (step times, losses, host leads) are per-value types and
    bounds, so the sample breaks a rule exactly when the list does, and validation takes a fraction of the time."""
    if isinstance(value, dict):
        return {key: schema_sample(item) for key, item in value.items()}
    if not isinstance(value, list):
        return value
    if len(value) <= SAMPLED_LIST_LENGTH or any(isinstance(item, (dict, list)) for item in value):
        return [schema_sample(item) for item in value]
    kinds = {}
    for item in value:
        kinds.setdefault(type(item), item)
    numbers = [item for item in value if type(item) in (int, float)]
    return list(kinds.values()) + ([min(numbers), max(numbers)] if numbers else [])


def schema_problem(document):
    """The first rule of the schema that the document breaks, in one short phrase, or None."""
    validator = result_validator()
    if validator.is_valid(schema_sample(document)):
        return None
    import jsonschema
    error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    where = ".".join(map(str, error.absolute_path)) or "the top level"
    message = error.message if len(error.message) <= 100 else error.message[:97] + "..."
    return f"{where}: {message}"


def semantic_problem(result):
    """Rules the schema cannot state: fields that must agree with each other, figures that must be finite."""
    config, world = result["config"], result["world"]
    for field in ("benchmark", "strategy"):
        if config[field] != result[field]:
            return f"config.{field} {config[field]!r} differs from {field} {result[field]!r}"
    if config["global_batch_size"] != config["batch_size_per_device"] * world["world_size"]:
        return "config.global_batch_size is not config.batch_size_per_device x world.world_size"
    throughput = result.get("throughput") or {}
    for field in ("images_per_second", "rank0_median_images_per_second", "rank0_mad_images_per_second"):
        if field in throughput and not is_number(throughput[field]):
            return f"throughput.{field} is {throughput[field]!r}, not a finite number"
    return None


def document_problem(document):
    """Why a parsed JSON document cannot be read as a result, or None."""
    if not isinstance(document, dict) or "schema_version" not in document:
        return "not a benchmark result (no schema_version)"
    if document["schema_version"] != SCHEMA_VERSION:
        return f"schema_version {document['schema_version']!r}, the analysis tools read version {SCHEMA_VERSION}"
    try:
        return schema_problem(document) or semantic_problem(document)
    except RecursionError:
        return "nested too deeply"


def read_result_file(path):
    """(a valid result, None) or (None, why it is not one)."""
    document, problem = read_json(path)
    if problem:
        return None, problem
    if is_comparison(document):
        return None, "a comparison (compare.py), not a result"
    problem = document_problem(document)
    return (None, problem) if problem else (document, None)


def read_inputs(paths, program, what="input"):
    """(results, comparisons): [(path, result)] of every valid result under paths and [(path, document)] of every
    compare.py comparison. Every other file is skipped with a one-line warning on stderr (tools/harness_cost.py's
    measurements silently: they are no results); when every file found is skipped, one UsageError says so."""
    results, comparisons, skipped = [], [], []
    for path in find_result_files(paths):
        document, problem = read_json(path)
        if problem is None and is_comparison(document):
            comparisons.append((path, document))
            continue
        if problem is None and is_harness_cost(document):
            continue
        problem = problem or document_problem(document)
        if problem:
            skipped.append((path, problem))
        else:
            results.append((path, document))
    if skipped and not results and not comparisons:
        named = "; ".join(f"{path}: {problem}" for path, problem in skipped[:3])
        more = f"; {len(skipped) - 3} more" if len(skipped) > 3 else ""
        count = f"{len(skipped)} file{'s' * (len(skipped) > 1)}"
        raise UsageError(f"{'--check-against ' if what == 'reference' else ''}{', '.join(map(str, paths))}: "
                         f"no valid result file, {count} skipped as invalid ({named}{more})")
    for path, problem in skipped:
        print(f"{program}: warning: {what} {path}: skipped: {problem}", file=sys.stderr)
    return results, comparisons


# ---------------------------------------------------------------------------- machine and software

def machine_of(result):
    """The hosts, GPUs (their UUIDs, one per rank, and models) and CPU model a result ran on."""
    hardware = result.get("hardware") or {}
    ranks = [rank for rank in hardware.get("ranks") or [] if isinstance(rank, dict)]
    return {"hostnames": sorted(host for host in hardware.get("hostnames") or [] if isinstance(host, str)),
            "gpu_uuids": [rank["gpu_uuid"] for rank in ranks if rank.get("gpu_uuid")],
            "gpu_names": sorted({rank["gpu_name"] for rank in ranks if rank.get("gpu_name")}),
            "cpu": hardware.get("cpu")}


def describe_machine(machine):
    hosts = ", ".join(machine["hostnames"]) or "an unnamed host"
    gpus = f"{', '.join(machine['gpu_names'])} {', '.join(machine['gpu_uuids'])}" if machine["gpu_uuids"] else "no GPU"
    return f"{hosts} with {gpus} ({machine['cpu']})"


def devices_of(result):
    """What identifies the devices a run used, for pairing: its GPUs' UUIDs, or on the CPU its hosts with their CPU
    model; empty where the result does not say (a run that failed before it looked at its hardware)."""
    hardware = result.get("hardware") or {}
    if result["config"]["device"] == "cuda":
        uuids = [rank.get("gpu_uuid") if isinstance(rank, dict) else None for rank in hardware.get("ranks") or []]
        return frozenset(uuids) if uuids and all(isinstance(uuid, str) and uuid for uuid in uuids) else frozenset()
    machine = machine_of(result)
    return frozenset(f"{host} ({machine['cpu']})" for host in machine["hostnames"])


def rank_devices(result):
    """Each rank's device, rank 0 first: its GPU's UUID, else its host (a CPU run)."""
    ranks = (result.get("hardware") or {}).get("ranks") or []
    return [rank.get("gpu_uuid") or rank.get("hostname") or "cpu" for rank in ranks] or ["cpu"]


def build_of(result):
    """The git commit and the versions of SOFTWARE a result ran."""
    software = result.get("software") or {}
    return {"commit": (result.get("git") or {}).get("commit"),
            "software": {name: software.get(name) for name in SOFTWARE}}


def same_build(a, b):
    """The same commit and the same version of every package both builds record (build_of)."""
    return a["commit"] == b["commit"] and all(
        a["software"][name] == b["software"][name] for name in SOFTWARE
        if a["software"][name] is not None and b["software"][name] is not None)


# ---------------------------------------------------------------------------- atomic writes

def write_atomically(path, text, overwrite=True):
    """Write text (str, or bytes such as an image) to path whole or not at all: a temporary file in the same folder
    (its mode from the umask, or the replaced file's), synced, then renamed over path (overwrite) or linked to it,
    which refuses a path that exists, even one that another run wrote meanwhile (UsageError). A full disk or a kill
    leaves the old file whole."""
    path = pathlib.Path(path)
    if os.path.realpath(path) in READ:
        raise UsageError(f"{path} is a file this run reads: not written over")
    temporary = temporary_path(path)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
    try:
        with os.fdopen(descriptor, "wb") as stream:
            if overwrite and path.is_file():
                os.fchmod(stream.fileno(), path.stat().st_mode & 0o777)
            stream.write(text.encode() if isinstance(text, str) else text)
            stream.flush()
            os.fsync(stream.fileno())
        if overwrite:
            os.replace(temporary, path)
        else:
            os.link(temporary, path)
    except FileExistsError:
        raise UsageError(f"{path} exists (another run may have written it meanwhile): not replaced") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def write_json_atomically(path, document, overwrite=True):
    write_atomically(path, json.dumps(document, indent=1) + "\n", overwrite)


def temporary_path(path):
    """A fresh name beside path for write_atomically's temporary file (hidden, so that readers skip it)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")


def check_writable(path, flag="--output"):
    """UsageError unless write_atomically could create its temporary file for path now: a folder that refuses it
    (its permissions, a read-only disk, a name too long) is found before the work, not after it."""
    if os.path.realpath(path) in READ:
        raise UsageError(f"{flag} {path} is a file this run reads: not written over")
    probe = temporary_path(pathlib.Path(path))
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as error:
        raise UsageError(f"{flag} {path}: cannot write in {probe.parent}: {error.strerror}") from None


# ---------------------------------------------------------------------------- generated blocks in documents

# The documents that hold generated blocks, and the one marker syntax:
#     <!-- generated:NAME -->
#     ...what the section NAME writes...
#     <!-- /generated:NAME -->
# or inline, within a sentence: <!-- generated:NAME -->text<!-- /generated:NAME -->.
DOCUMENTS = ("README.md", "docs/noise.md", "docs/performance.md", "docs/results.md", "docs/scaling.md",
             "docs/sharding.md", "lightning/README.md")
GENERATED = re.compile(r"(?P<open><!-- generated:(?P<name>[a-z0-9-]+) -->\n?)(?P<body>.*?)"
                       r"(?P<close><!-- /generated:(?P=name) -->)", re.DOTALL)


def regenerated(document, text, sections):
    """(text with each generated block rebuilt, names of the blocks that changed). sections: {name: function of the
    document's path (relative to the repository) giving the block's Markdown}; a block no section names is an
    error."""
    stale = []

    def rebuild(match):
        name = match["name"]
        if name not in sections:
            raise UsageError(f"{document}: no generated section named {name!r} (known: {', '.join(sorted(sections))})")
        body = sections[name](document).strip() + "\n" * match["open"].endswith("\n")  # a block, or inline
        if body != match["body"]:
            stale.append(name)
        return match["open"] + body + match["close"]

    return GENERATED.sub(rebuild, text), stale


def regenerate_documents(sections, documents=DOCUMENTS, root=REPOSITORY):
    """{document: (new text, stale block names)} of every document; every section must have a block."""
    found, documents_text = set(), {}
    for document in documents:
        path = pathlib.Path(root) / document
        try:
            with open_regular(path, RESULT_LIMIT, record=False) as stream:  # a section then writes it
                text = stream.read().decode("utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise UsageError(f"{path}: cannot be read ({getattr(error, 'strerror', None) or error})") from None
        found |= {match["name"] for match in GENERATED.finditer(text)}
        documents_text[document] = regenerated(document, text, sections)
    missing = sorted(set(sections) - found)
    if missing:
        raise UsageError(f"no block for the generated sections {', '.join(missing)} in {', '.join(documents)}")
    return documents_text


def update_documents(sections, documents=DOCUMENTS, root=REPOSITORY):
    """Rewrite the stale generated blocks of the documents in place; the text around them is left alone."""
    for document, (text, stale) in regenerate_documents(sections, documents, root).items():
        if stale:
            write_atomically(pathlib.Path(root) / document, text)
            print(f"wrote {document} ({', '.join(stale)})")
    return EXIT_OK


def check_documents(sections, documents=DOCUMENTS, root=REPOSITORY):
    """EXIT_FAILED with one line naming each stale block, or EXIT_OK: every generated block is what its section
    writes now."""
    stale = [f"{document} ({', '.join(names)})"
             for document, (_, names) in regenerate_documents(sections, documents, root).items() if names]
    if stale:
        print(f"stale generated blocks in {'; '.join(stale)}: run python report.py --docs", file=sys.stderr)
        return EXIT_FAILED
    print(f"every generated block of {', '.join(documents)} is current")
    return EXIT_OK
