"""The package is what the tools share: none of its modules imports a top-level tool or benchmark script, and no tool
edits sys.path or loads another tool by its file."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "resnet50_ddp_benchmarks"
BENCHMARKS = ("ddp_resnet50.py", "oss_benchmark.py")
TOOLS = sorted(path.stem for path in ROOT.glob("*.py")) + sorted(path.stem for path in (ROOT / "tools").glob("*.py"))


def imported_names(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("import_module", "run_path",
                                                                               "spec_from_file_location"):
            yield from (arg.value.split(".")[0].removesuffix(".py") for arg in node.args
                        if isinstance(arg, ast.Constant) and isinstance(arg.value, str))


@pytest.mark.parametrize("module", sorted(PACKAGE.glob("*.py")), ids=lambda path: path.name)
def test_no_package_module_imports_a_top_level_tool(module):
    assert not set(imported_names(module)) & set(TOOLS), module.name


@pytest.mark.parametrize("tool", [path for path in [*ROOT.glob("*.py"), *(ROOT / "tools").glob("*.py"),
                                                      *PACKAGE.glob("*.py")] if path.name not in BENCHMARKS],
                         ids=lambda path: path.relative_to(ROOT).as_posix())
def test_no_tool_edits_sys_path_or_loads_a_file_but_a_benchmark_script(tool):
    lines = tool.read_text(encoding="utf-8").splitlines()
    assert not [line for line in lines if "sys.path" in line], tool
    loads = [line for line in lines if "spec_from_file_location" in line or "run_path(" in line]
    assert all(any(script in line for script in BENCHMARKS) for line in loads), loads
