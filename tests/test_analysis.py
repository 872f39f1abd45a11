"""The package's analysis.py, what the analysis tools share: the one writer, the one-line errors and the generated-docs engine
(reading results is tested through report.py in test_report.py)."""
import errno
import os

import pytest

from resnet50_ddp_benchmarks import analysis


def test_the_writer_takes_its_mode_from_the_umask_and_refuses_a_path_that_exists(tmp_path):
    path = tmp_path / "out.json"
    old = os.umask(0o027)
    try:
        analysis.write_json_atomically(path, {"a": 1}, overwrite=False)
    finally:
        os.umask(old)
    assert path.read_text() == '{\n "a": 1\n}\n' and path.stat().st_mode & 0o777 == 0o640
    # Two runs given one output: the second finds the path taken and says so; the first's file stays whole.
    with pytest.raises(analysis.UsageError, match="out.json exists"):
        analysis.write_atomically(path, "second", overwrite=False)
    assert path.read_text() == '{\n "a": 1\n}\n'
    path.chmod(0o600)
    analysis.write_atomically(path, "replaced")  # overwriting keeps the replaced file's mode
    assert path.read_text() == "replaced" and path.stat().st_mode & 0o777 == 0o600
    assert sorted(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_a_failed_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "out.md"
    path.write_text("old")

    def full_disk(descriptor):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError):
        analysis.write_atomically(path, "new")
    assert path.read_text() == "old" and sorted(tmp_path.iterdir()) == [path]


def test_bad_input_is_one_line_and_exit_2(capsys):
    def main():
        raise analysis.UsageError("--x: no such thing")
    with pytest.raises(SystemExit) as exit_info:
        analysis.run_cli(main, "tool.py")
    assert exit_info.value.code == 2 and capsys.readouterr().err == "tool.py: error: --x: no such thing\n"
    with pytest.raises(SystemExit) as exit_info:
        analysis.run_cli(lambda: 1, "tool.py")
    assert exit_info.value.code == 1


def test_the_engine_rebuilds_only_its_blocks_and_refuses_unknown_names(tmp_path, capsys):
    text = ("intro\n<!-- generated:a -->\nold\n<!-- /generated:a -->\nprose\n"
            "<!-- generated:b -->\nB\n<!-- /generated:b -->\nend <!-- generated:b -->B<!-- /generated:b --> inline\n")
    (tmp_path / "doc.md").write_text(text)
    sections = {"a": lambda document: f"A of {document}", "b": lambda document: "B"}
    assert analysis.check_documents(sections, ["doc.md"], tmp_path) == 1
    assert "doc.md (a)" in capsys.readouterr().err
    assert (tmp_path / "doc.md").read_text() == text  # a check writes nothing
    assert analysis.update_documents(sections, ["doc.md"], tmp_path) == 0
    assert (tmp_path / "doc.md").read_text() == text.replace("\nold\n", "\nA of doc.md\n")  # inline stays inline
    assert analysis.check_documents(sections, ["doc.md"], tmp_path) == 0
    with pytest.raises(analysis.UsageError, match="doc.md: no generated section named 'a'"):
        analysis.check_documents({"b": sections["b"]}, ["doc.md"], tmp_path)
    with pytest.raises(analysis.UsageError, match="no block for the generated sections c in doc.md"):
        analysis.check_documents({**sections, "c": sections["b"]}, ["doc.md"], tmp_path)
