"""A benchmark script run through a symbolic link, from another folder, finds its clone's package (the options of
benchmark_extras.py), whether the package is installed (pip install -e .) or not."""
import shutil
import subprocess
import sys
import sysconfig

import pytest

from conftest import LIGHTNING, NATIVE, ROOT, clean_env


@pytest.mark.parametrize("script,installed", [(NATIVE, False), (LIGHTNING, False), (LIGHTNING, True)],
                         ids=["native", "twin", "twin-installed"])
def test_a_script_run_through_a_link_finds_its_clones_package(tmp_path, script, installed):
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "resnet50_ddp_benchmarks", clone / "resnet50_ddp_benchmarks",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (clone / script.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(script, clone / script.relative_to(ROOT))
    link = tmp_path / "elsewhere" / "bench.py"
    link.parent.mkdir()
    link.symlink_to(clone / script.relative_to(ROOT))
    # not installed: no site-packages' .pth files (the editable install's finder), the libraries alone on the path
    command = [sys.executable, str(link), "--help"] if installed else [sys.executable, "-S", str(link), "--help"]
    env = clean_env() if installed else clean_env(PYTHONPATH=sysconfig.get_paths()["purelib"])
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=link.parent, timeout=120)
    assert proc.returncode == 0 and "--bucket-cap-mb" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
