"""The house rules of docs/ARCHITECTURE.md, checked on the source (ast, no imports run):
modules of one idea and a size a reader can hold, no import circle, a shallow batch wing,
each wing reached only through its seam, no private name of another module used, the
benchmarks outside the product."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("packer", "reader", "kernels", "tools")   # dlpack_io.<name> = <name>/
TREES = PACKAGES + ("benchmarks",)                  # benchmarks/: run from the repository root
# A module is one idea (most land at 100-400 lines); these bounds only catch a module or a
# function that grew past what one reading holds, they are no target to cut towards.
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80
MAX_BATCH_FLOORS = 6  # the batch wing (reader/batch + reader/transforms): import levels
# Fewer, cohesive modules: a wing that needs more than this splits an idea too finely.
MAX_MODULES = {"reader": 51, "packer": 25}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts if parts[0] == "benchmarks" else ["dlpack_io", *parts])


def _sources() -> dict[str, tuple[Path, ast.Module]]:
    out = {}
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            out[_module_name(path)] = (path, ast.parse(path.read_text(), str(path)))
    return out


SOURCES = _sources()


def _imports(name: str, tree: ast.Module):
    """(imported module, imported names or None) for every import in the module, lazy
    ones inside functions included; relative imports resolved."""
    package = name if SOURCES[name][0].name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([module] if module else []))
            yield module, [alias.name for alias in node.names]


def _ours(module: str) -> bool:
    return module.split(".")[0] in ("dlpack_io", "benchmarks")


def _edges(name: str, tree: ast.Module):
    """Our modules that ``name`` imports (``from pkg import module`` counts as the module)."""
    for module, names in _imports(name, tree):
        if not _ours(module):
            continue
        subs = [f"{module}.{n}" for n in names or () if f"{module}.{n}" in SOURCES]
        native = [n for n in names or () if (ROOT / Path(*module.split(".")[1:]) / f"{n}.c").exists()]
        yield from subs or ([module] if module in SOURCES and not native else [])


def test_the_trees_are_found():
    assert {"dlpack_io.reader.batch.loader", "dlpack_io.reader.remote.source",
            "dlpack_io.reader.format", "dlpack_io.packer", "dlpack_io.kernels"} <= set(SOURCES)


def test_the_batch_wing_is_shallow():
    """Each module of reader/batch and reader/transforms sits one floor above the highest it
    imports: at most MAX_BATCH_FLOORS floors, the Loader on top."""
    wing = ("dlpack_io.reader.batch", "dlpack_io.reader.transforms")
    graph = {n: {m for m in _edges(n, t) if m.startswith(wing) and m != n}
             for n, (_, t) in SOURCES.items() if n.startswith(wing)}
    floors = {}

    def floor(n):
        if n not in floors:
            floors[n] = 1 + max((floor(m) for m in graph[n]), default=0)
        return floors[n]
    deepest = max(graph, key=floor)
    assert floor(deepest) <= MAX_BATCH_FLOORS, f"{deepest} is on floor {floor(deepest)}"
    assert deepest == "dlpack_io.reader.batch.loader"


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_modules_and_functions_stay_small(name):
    path, tree = SOURCES[name]
    lines = path.read_text().count("\n")
    assert lines <= MAX_MODULE_LINES, f"{path}: {lines} lines, at most {MAX_MODULE_LINES}"
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            size = node.end_lineno - node.lineno + 1
            assert size <= MAX_FUNCTION_LINES, \
                f"{path}:{node.lineno} {node.name}() is {size} lines, at most {MAX_FUNCTION_LINES}"


@pytest.mark.parametrize("package", sorted(MAX_MODULES))
def test_each_package_holds_few_modules(package):
    modules = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / package).rglob("*.py"))
    assert len(modules) <= MAX_MODULES[package], \
        f"{package}/ holds {len(modules)} modules, at most {MAX_MODULES[package]}: {modules}"


def test_no_import_circle():
    graph = {name: set(_edges(name, tree)) - {name} for name, (_, tree) in SOURCES.items()}
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                circle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import circle: " + " -> ".join(circle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name)


ALLOWED_FROM_READER = ("dlpack_io.reader.format", "dlpack_io.reader.remote.storage",
                       "dlpack_io.reader.remote.clouds")


@pytest.mark.parametrize("name", sorted(n for n in SOURCES if n.startswith("dlpack_io.packer")))
def test_the_packer_reaches_the_reader_only_through_the_format_and_the_storage_seam(name):
    for module in _edges(name, SOURCES[name][1]):
        if module.startswith("dlpack_io.reader"):
            assert module.startswith(ALLOWED_FROM_READER), \
                f"{SOURCES[name][0]} imports {module}; the packer may use {ALLOWED_FROM_READER}"


WINGS = {"dlpack_io.reader.batch": "dlpack_io.reader.remote",
         "dlpack_io.reader.remote": "dlpack_io.reader.batch",
         "dlpack_io.reader.transforms": "dlpack_io.reader.batch",
         "dlpack_io.kernels": "dlpack_io.reader"}


@pytest.mark.parametrize("wing,other", sorted(WINGS.items()))
def test_wings_do_not_import_each_other(wing, other):
    for name, (path, tree) in SOURCES.items():
        if name.startswith(wing):
            bad = [m for m in _edges(name, tree) if m.startswith(other)]
            assert not bad, f"{path} imports {bad}: {wing} must not depend on {other}"


def test_the_product_never_imports_the_benchmarks():
    for name, (path, tree) in SOURCES.items():
        if not name.startswith("benchmarks"):
            bad = [m for m in _edges(name, tree) if m.startswith("benchmarks")]
            assert not bad, f"{path} imports {bad}: benchmarks live apart from the product"


def _top(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _own_module(importer: str, module: str, name: str) -> bool:
    """``from module import name`` brings in a module (Python, or the C extension built from
    ``name``.c) of the importer's own package: a private module may be used inside it."""
    if _top(module) != _top(importer):
        return False
    folder = ROOT / Path(*module.split(".")[1:])
    return f"{module}.{name}" in SOURCES or (folder / f"{name}.c").exists()


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_no_private_name_of_another_module_is_used(name):
    """No ``from x import _y``, no private module of another package, and no ``mod._y``
    where ``mod`` is one of our modules imported here."""
    path, tree = SOURCES[name]
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for module, names in _imports(name, ast.Module(body=[node], type_ignores=[])):
                if not _ours(module):
                    continue
                private = [n for n in names or () if n.startswith("_") and n != "__version__"
                           and not _own_module(name, module, n)]
                assert not private, f"{path}:{node.lineno} imports {private} from {module}"
                if _top(module) != _top(name):
                    assert not any(p.startswith("_") for p in module.split(".")), \
                        f"{path}:{node.lineno} imports {module}, private to another package"
                for alias in node.names:
                    aliases[alias.asname or alias.name.split(".")[0]] = True
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__") and isinstance(node.value, ast.Name) \
                and node.value.id in aliases:
            assert False, f"{path}:{node.lineno} reads {node.value.id}.{node.attr}, a private name"


def test_no_module_imports_a_folder_as_a_top_level_package():
    """``import reader`` would work in a checkout (pytest puts the repository root on the
    path for ``benchmarks``) and break in the wheel, and PyPI has packages of those names."""
    flat = {"packer", "reader", "kernels", "tools"}
    for name, (path, tree) in SOURCES.items():
        for module, _ in _imports(name, tree):
            assert module.split(".")[0] not in flat, f"{path} imports {module}: use dlpack_io."


def test_the_cli_imports_no_benchmark_until_bench_runs():
    """`dlpack --help` and every command but `dlpack bench` stay free of benchmark code."""
    import subprocess
    import sys

    code = ("import sys, dlpack_io.tools.cli; print([m for m in sys.modules "
            "if m.startswith(('dlpack_io.tools.bench', 'benchmarks'))])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_wheel_lists_every_package_of_the_tree():
    """pyproject.toml names the packages one by one (its package-dir maps dlpack_io.X to
    X/): a new sub-package left out of the list imports from the checkout and is missing
    from every installed wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {_module_name(init) for tree in PACKAGES for init in (ROOT / tree).rglob("__init__.py")}
    assert found == listed, f"missing from pyproject.toml: {sorted(found - listed)}; " \
                            f"listed but absent: {sorted(listed - found)}"
