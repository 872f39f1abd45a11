"""--help for the benchmark scripts without importing torch, which takes seconds (tens on a cold file cache).

A script in this repository calls print_help() before its own imports when --help is on its command line. Its
top-level statements that need nothing outside the standard library run (constants, the option parser), the rest
(imports, models, classes built on torch's) is skipped; benchmark_extras.py, whose options join --help, is read the
same way. The help is the one that the script prints after importing torch, as it does when copied alone.
"""
import ast
import contextlib
import os
import sys
import types


def third_party_imports(statement):
    """The top-level modules outside the standard library that a statement imports (in a try: block too)."""
    names = set()
    for node in ast.walk(statement):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names |= {(node.module or "").split(".")[0]} if node.level == 0 else {"."}
    return names - set(sys.stdlib_module_names)


def standard_library_part(path, name):
    """The names that a file's top-level statements define when those needing anything else are skipped."""
    with open(path) as stream:
        tree = ast.parse(stream.read(), path)
    namespace = {"__name__": name, "__file__": path, "__doc__": ast.get_docstring(tree, clean=False)}
    for node in tree.body:
        if not third_party_imports(node):
            with contextlib.suppress(Exception):  # a statement that needs a skipped import defines nothing
                exec(compile(ast.Module([node], []), path, "exec"), namespace)
    return namespace


def print_help(script):
    """The script's --help (and its exit: 0, or 2 with one line for bad input), benchmark_extras.py's options in."""
    here = os.path.dirname(os.path.abspath(script))
    for folder in (here, os.path.dirname(here)):
        extras = os.path.join(folder, "benchmark_extras.py")
        if os.path.exists(extras) and "benchmark_extras" not in sys.modules:
            sys.modules["benchmark_extras"] = types.SimpleNamespace(**standard_library_part(extras, "extras"))
    namespace = standard_library_part(os.path.abspath(script), "help")
    namespace["run_guarded"](namespace["parse_arguments"], namespace["SCRIPT"])
