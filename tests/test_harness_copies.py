"""The harness is repeated on purpose in every single-file script; the copies must stay identical."""
import subprocess
import sys

from conftest import LIGHTNING, NATIVE, OSS, ROOT


def harness(path):
    text = path.read_text()
    begin = "# ============================================================================ harness\n"
    end = "# ============================================================================ end of harness\n"
    assert text.count(begin) == 1 and text.count(end) == 1, path
    return text[text.index(begin):text.index(end)]


def test_every_script_carries_the_identical_harness():
    master = harness(NATIVE)
    for copy in (LIGHTNING, OSS):
        assert harness(copy) == master, f"{copy.name}: run `python tools/sync_harness.py`"


def test_the_sync_tool_agrees():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "sync_harness.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
