"""Host time per step of the twins at 32 images per GPU, from the cProfile files of `gpu_evidence.sh scale4`.

    python docs/diagnostics/ddp-scaling/host_profile.py docs/diagnostics/ddp-scaling/{native,lightning}-1gpu-bf16-32.prof.gz
"""
import gzip
import marshal
import pstats
import sys


def load(path):
    stats = pstats.Stats()  # pstats reads files by name; the committed ones are gzipped
    with gzip.open(path, "rb") as handle:
        stats.stats = marshal.load(handle)
    stats.get_top_level_stats()
    return stats


def per_call_ms(stats, file_suffix, function):
    for (path, _, name), (_, calls, _, cumulative, _) in stats.stats.items():
        if path.endswith(file_suffix) and name == function:
            return calls, 1e3 * cumulative / calls
    return 0, float("nan")


def main(native_path, lightning_path):
    native, lightning = load(native_path), load(lightning_path)
    n_calls, n_ms = per_call_ms(native, "ddp_resnet50.py", "train_step")
    l_calls, l_ms = per_call_ms(lightning, "training_epoch_loop.py", "advance")
    own = sum(row[2] for (path, _, _), row in lightning.stats.items() if "/lightning/" in path and "packages" in path)
    print(f"native train_step: {n_calls} calls, {n_ms:.2f} ms each (cumulative, warm-up included)")
    print(f"Lightning _TrainingEpochLoop.advance: {l_calls} calls, {l_ms:.2f} ms each; "
          f"{100 * (l_ms / n_ms - 1):+.1f} % against native")
    print(f"time inside Lightning's own functions: {own:.3f} s, {1e3 * own / l_calls:.2f} ms a step")


if __name__ == "__main__":
    main(*sys.argv[1:3])
