"""The layering of DESIGN.md, read from the source with ``ast``.

Every import of a project module counts, at the top of a file or inside a function:

- no cycle between two modules (a package's ``__init__`` is a module too);
- no import from a lower layer into a higher one (``LAYERS``, lowest first);
- at most ``MAX_LOCAL_IMPORTS`` imports of project modules inside functions, each
  with a comment saying why (on its line or the line above);
- no module longer than ``MAX_LINES`` lines;
- no import by name at run time (``importlib.import_module``, ``__import__``,
  ``sys.modules``), which would hide an import from the checks above, except where
  ``RUNTIME_IMPORTS`` says why.
"""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
# folder -> the package it is installed as (pyproject's package-dir): runtime/ and
# codegen/ are subpackages of compiled_autograd, and layers of their own below and
# above its front end.
PACKAGES = {"runtime": "compiled_autograd.runtime", "compiled_autograd": "compiled_autograd",
            "codegen": "compiled_autograd.codegen"}

# Lowest first. A module belongs to the longest prefix that names it; a module may
# import its own layer (without a cycle) and the layers below.
LAYERS = (
    "compiled_autograd.runtime",
    "compiled_autograd.ir",          # the graph IR: imports no Tensor
    "compiled_autograd.autograd",    # Tensor, ops, Nodes, engine, hooks, Function, checkpoint
    "compiled_autograd.memory",      # accounting, planned schedule, reports
    "compiled_autograd.compiled",    # compiled args, cache, tracer, entry points, backends
    "compiled_autograd.planning",    # what to recompute for a memory budget (ca.memory.plan_checkpoints)
    "compiled_autograd.distributed",  # the MPI process group, collectives, comm hooks (optional extra)
    "compiled_autograd.nn",
    "compiled_autograd.utils",
    "compiled_autograd.optim",       # ca.optim: optimizers, schedulers, in_backward
    "compiled_autograd",             # the public facade (ca.*)
    "compiled_autograd.examples",
    "compiled_autograd.demo",
    "compiled_autograd.cli",
    "compiled_autograd.__main__",
    "compiled_autograd.codegen",
)
MAX_LOCAL_IMPORTS = 5
MAX_LINES = 600
# Modules that may import by name at run time, and why.
RUNTIME_IMPORTS = {
    "compiled_autograd.compiled.backends": "resolves a backend's 'module:function' path, so "
                                           "the front end reaches codegen only by name",
}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [package, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(module: str, path: Path, node) -> list[str]:
    """The project modules an import statement names (a submodule if it is one,
    else the package or module the name comes from)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".")
            if path.name != "__init__.py":
                base = base[:-1]
            base = base[:len(base) - (node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module
        names = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in MODULES else origin
                 for a in node.names]
    found = []
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.append(name)
    return found


def _imports():
    """(module, imported module, line, inside a function, comment on it) for every
    import of a project module."""
    out = []
    for module, path in MODULES.items():
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        local = set()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                local.update(id(n) for n in ast.walk(fn)
                             if isinstance(n, (ast.Import, ast.ImportFrom)))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                line = lines[node.lineno - 1]
                above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
                commented = "#" in line or above.startswith("#")
                for target in _resolve(module, path, node):
                    out.append((module, target, node.lineno, id(node) in local, commented))
    return out


def layer_of(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS.index(best)


def import_graph(imports=None) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    for module, target, *_ in imports if imports is not None else _imports():
        graph.add_edge(module, target)
    return graph


def cycles(graph) -> list[list[str]]:
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


def upward_imports(imports=None) -> list[str]:
    return [f"{m}:{line} imports {t} (layer {LAYERS[layer_of(t)]} is above "
            f"{LAYERS[layer_of(m)]})"
            for m, t, line, *_ in (imports if imports is not None else _imports())
            if layer_of(t) > layer_of(m)]


def test_every_module_is_in_a_layer():
    assert all(any(m == p or m.startswith(p + ".") for p in LAYERS) for m in MODULES)


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_no_upward_import():
    assert upward_imports() == []


def test_few_commented_imports_inside_functions():
    local = [(m, t, line, commented) for m, t, line, inside, commented in _imports() if inside]
    assert len(local) <= MAX_LOCAL_IMPORTS, local
    assert [x for x in local if not x[3]] == []


def test_no_module_over_max_lines():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def _runtime_imports(module, tree):
    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        elif isinstance(node, ast.Attribute) and node.attr == "modules" and \
                getattr(node.value, "id", None) == "sys":
            name = "sys.modules"
        if name in ("import_module", "__import__", "sys.modules"):
            found.append(f"{module}:{node.lineno} {name}")
    return found


def test_no_import_by_name_at_run_time():
    found = [f for m, p in MODULES.items() if m not in RUNTIME_IMPORTS
             for f in _runtime_imports(m, ast.parse(p.read_text()))]
    assert found == []


def test_the_guard_sees_an_upward_import_and_a_cycle():
    """The checks above are not vacuous: an engine that imported the compiled path
    (as it once did) is both an upward import and a cycle."""
    imports = _imports() + [("compiled_autograd.autograd.engine",
                             "compiled_autograd.compiled.api", 1, False, False)]
    assert any("autograd.engine:1 imports compiled_autograd.compiled.api" in s
               for s in upward_imports(imports))
    assert any("compiled_autograd.autograd.engine" in c
               for c in cycles(import_graph(imports)))
    # runtime and codegen are compiled_autograd's subpackages, yet layers of their
    # own: the runtime importing the facade, or codegen, is upward; the facade
    # importing codegen (it only names it to the backend registry) is too.
    for m, t in (("compiled_autograd.runtime.prims", "compiled_autograd"),
                 ("compiled_autograd.runtime.prims", "compiled_autograd.autograd.tensor"),
                 ("compiled_autograd.runtime.memory", "compiled_autograd.codegen.c"),
                 ("compiled_autograd", "compiled_autograd.codegen.c_run")):
        assert any(s.startswith(f"{m}:1 imports {t} ") for s in upward_imports([(m, t, 1, False, False)]))
    hidden = ast.parse("import importlib\nimportlib.import_module('compiled_autograd')\n"
                       "__import__('compiled_autograd.codegen')\nimport sys\n"
                       "sys.modules['compiled_autograd.codegen']\n")
    assert len(_runtime_imports("compiled_autograd.autograd.engine", hidden)) == 3


def layer_edges(imports=None) -> dict:
    """{layer: {imported layer: number of (module, imported module) pairs}}, between
    different layers."""
    out = {layer: {} for layer in LAYERS}
    for m, t in {(m, t) for m, t, *_ in (imports if imports is not None else _imports())}:
        a, b = LAYERS[layer_of(m)], LAYERS[layer_of(t)]
        if a != b:
            out[a][b] = out[a].get(b, 0) + 1
    return out


if __name__ == "__main__":
    # python tests/test_layering.py: the layers, lowest first, and what each imports.
    imports = _imports()
    sizes = {layer: 0 for layer in LAYERS}
    for m in MODULES:
        sizes[LAYERS[layer_of(m)]] += 1
    print("layer (lowest first)         modules  imports from (module pairs)")
    for layer, uses in layer_edges(imports).items():
        used = ", ".join(f"{LAYERS[i]} ({uses[LAYERS[i]]})" for i in range(len(LAYERS))
                         if LAYERS[i] in uses)
        print(f"{layer.replace('compiled_autograd', 'ca'):<28} {sizes[layer]:>7}  "
              f"{used.replace('compiled_autograd', 'ca') or '-'}")
    print(f"cycles: {len(cycles(import_graph(imports)))}, upward imports: "
          f"{len(upward_imports(imports))}, imports inside functions: "
          f"{sum(1 for *_, inside, _ in imports if inside)}")
