"""Does Python's garbage collector run during the timed steps? Runs a script (native or the Lightning twin) on
the CPU in this process with a gc callback, and prints the collections per generation and their time. Run it
with two step counts: collections that do not grow with the steps happen outside the timed loop.

    STEPS=20 python docs/diagnostics/ddp-scaling/gc_count.py ddp_resnet50.py
    STEPS=80 python docs/diagnostics/ddp-scaling/gc_count.py ddp_resnet50.py
    STEPS=20 python docs/diagnostics/ddp-scaling/gc_count.py lightning/ddp_resnet50.py   # and 80
"""
import gc
import os
import runpy
import sys
import tempfile
import time

counts, spent, started = {0: 0, 1: 0, 2: 0}, {0: 0.0, 1: 0.0, 2: 0.0}, {}


def on_collection(phase, info):
    generation = info["generation"]
    if phase == "start":
        started[generation] = time.perf_counter()
    else:
        counts[generation] += 1
        spent[generation] += time.perf_counter() - started[generation]


if __name__ == "__main__":
    script = sys.argv[1] if len(sys.argv) > 1 else "ddp_resnet50.py"
    output = os.path.join(tempfile.mkdtemp(), "result.json")
    sys.argv = [script, "--device", "cpu", "--image-size", "32", "--batch-size-per-device", "2", "--warmup-steps",
                "2", "--steps", os.environ.get("STEPS", "20"), "--output", output]
    gc.callbacks.append(on_collection)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        pass
    print(f"{script}, {os.environ.get('STEPS', '20')} timed steps: collections per generation {counts}, "
          f"ms {({k: round(v * 1e3, 1) for k, v in spent.items()})}")
