"""The harness is repeated on purpose in every single-file script; the copies must stay identical."""
import subprocess
import sys

import pytest

from conftest import LIGHTNING, NATIVE, OSS, ROOT, load_script

SYNC = ROOT / "tools" / "sync_harness.py"


def test_every_script_carries_the_identical_harness():
    tool = load_script(SYNC, "sync_harness_under_test")

    def harness(path):
        text = path.read_text()
        start, stop = tool.harness_block(text, path)  # exactly one begin and one end marker, in that order
        return text[start:stop]

    master = harness(NATIVE)
    for copy in (LIGHTNING, OSS):
        assert harness(copy) == master, f"{copy.name}: run `python tools/sync_harness.py`"


def test_the_sync_tool_agrees():
    proc = subprocess.run([sys.executable, str(SYNC), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_block_is_what_lies_between_the_markers():
    tool = load_script(SYNC, "sync_harness_under_test")
    text = f"head\n{tool.BEGIN}shared\n{tool.END}tail\n"
    start, stop = tool.harness_block(text, "made-up")
    assert text[start:stop] == f"{tool.BEGIN}shared\n{tool.END}"
    for broken in (f"{tool.END}{tool.BEGIN}", f"{tool.BEGIN}x\n", f"{tool.BEGIN}{tool.BEGIN}{tool.END}"):
        with pytest.raises(SystemExit):
            tool.harness_block(broken, "made-up")


def test_the_sync_tool_renumbers_the_lightning_code_map(tmp_path, monkeypatch):
    """Copying the harness moves the twin's lines; the tool puts the README's line numbers back."""
    import re
    tool = load_script(SYNC, "sync_harness_under_test")
    readme = (ROOT / "lightning" / "README.md").read_text()
    shifted = re.sub(r"(— line |at line )(\d+)", lambda m: f"{m[1]}{int(m[2]) + 3}", readme)
    assert shifted != readme
    copy = tmp_path / "README.md"
    copy.write_text(shifted)
    monkeypatch.setattr(tool, "TWIN_README", copy)
    assert tool.renumber_code_map() is True
    assert copy.read_text() == readme  # the committed README is right (test_lightning checks it against the file)
    assert tool.renumber_code_map() is False


def test_the_sync_tool_names_a_code_map_entry_it_cannot_find(tmp_path, monkeypatch):
    tool = load_script(SYNC, "sync_harness_under_test")
    copy = tmp_path / "README.md"
    copy.write_text("| `no_such_function()` — line 12 | gone |\n")
    monkeypatch.setattr(tool, "TWIN_README", copy)
    with pytest.raises(SystemExit, match="names no_such_function\\(\\), which lightning/ddp_resnet50.py no longer defines"):
        tool.renumber_code_map()
