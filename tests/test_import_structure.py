"""The package's imports point one way: no import cycle anywhere in ``layerscale_jax`` (counting imports inside
functions too), ``layers/`` imports nothing from the subpackages built on top of it, the storage layer ``storage/``
nothing from the loop above it, and ``train/`` reaches the compile planner ``plan/`` only from its command. Read
statically from the source (``ast``), so a lazy import that would close a cycle is caught without running it. And no
file of the code is named like a standard-library module, which it would hide from whatever runs as a script beside
it."""
import ast
import functools
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "layerscale_jax"
ABOVE_LAYERS = ("models", "optim", "data", "storage", "train", "plan", "convert", "bench")
ABOVE_STORAGE = ("train", "plan", "convert", "bench", "lora", "api")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    """``{dotted module name: file}`` of every module of ``layerscale_jax``."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The ``layerscale_jax`` modules that the file at ``path`` imports anywhere in its code (module level or inside a
    function, or named in a ``lazy_names`` table), resolved to modules in ``known``: ``from pkg import sub`` names the
    submodule when ``sub`` is one, and a dotted import also runs each enclosing package's ``__init__``."""
    me = module_name(path)
    own_package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    names = set()
    source = path.read_text()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:                                  # relative: from package . (level 1) or .. (level 2)
                anchor = own_package.split(".")[:len(own_package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    if "lazy_names(" in source:               # layerscale_jax.lazy: a table of names → the modules they load from
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("."):
                names.add(own_package + node.value)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known:
                names.add(node.value)
    out = set()
    for name in names:
        if not name.startswith("layerscale_jax."):
            continue
        parts = name.split(".")
        # every enclosing package's __init__ runs too (the root's, imported first by any import, and one's own
        # ancestors', already running, are not edges)
        out.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
    return {m for m in out if m in known and not (me == m or me.startswith(m + "."))}


@functools.cache                                    # the package is read once per test session
def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imported_modules(path, set(modules)) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_reader_sees_imports_inside_functions_and_resolves_submodules():
    graph = import_graph()
    assert "layerscale_jax.layers.common" in graph["layerscale_jax.layers.blocks"]
    assert "layerscale_jax.models" in graph["layerscale_jax"]
    assert "layerscale_jax.optim.config" in graph["layerscale_jax.train.config"]


def test_there_is_no_import_cycle_in_the_package():
    found = cycles(import_graph())
    assert not found, "import cycles (each a set of modules that import each other): " + "; ".join(
        " ↔ ".join(c) for c in found)


def test_layers_import_nothing_from_the_packages_built_on_them():
    above = tuple(f"layerscale_jax.{p}" for p in ABOVE_LAYERS)
    wrong = {name: sorted(m for m in imports if m.startswith(above))
             for name, imports in import_graph().items() if name.startswith("layerscale_jax.layers")}
    assert not {k: v for k, v in wrong.items() if v}


def test_storage_imports_nothing_from_the_loop_and_what_is_built_on_it():
    """``storage/`` (checkpoints, the workdir and its lock, the compile cache) sits below ``train/``: the loop hands
    it the values it stores, and ``train/`` imports it, never the reverse."""
    graph = import_graph()
    assert "layerscale_jax.storage.checkpoint" in graph["layerscale_jax.train.loop"]
    above = tuple(f"layerscale_jax.{p}" for p in ABOVE_STORAGE)
    wrong = {name: sorted(m for m in imports if m.startswith(above))
             for name, imports in graph.items() if name.startswith("layerscale_jax.storage")}
    assert not {k: v for k, v in wrong.items() if v}


def test_the_planner_sits_above_training_which_reaches_it_only_from_its_command():
    """``plan/`` (compiling a run for hardware that is not here) builds on ``train/``; of ``train/`` only the command
    (``train.__main__``: ``--compile_for``) imports it, and nothing below ``train`` does."""
    graph = import_graph()
    assert "layerscale_jax.train.loop" in graph["layerscale_jax.plan.compile_for"]
    below = ("layerscale_jax.train", "layerscale_jax.storage", "layerscale_jax.layers", "layerscale_jax.models",
             "layerscale_jax.optim", "layerscale_jax.data", "layerscale_jax.convert", "layerscale_jax.lora")
    wrong = {name: sorted(m for m in imports if m.startswith("layerscale_jax.plan"))
             for name, imports in graph.items()
             if name.startswith(below) and name != "layerscale_jax.train.__main__"}
    assert not {k: v for k, v in wrong.items() if v}


def test_no_module_or_folder_is_named_like_a_standard_library_module():
    """A script's folder comes first on ``sys.path``: ``bench/timm_worker.py`` (run as a script by the timm Python) and
    the scripts in ``experiments/``, ``benchmarks/`` and ``scripts/`` would import a ``profile.py`` beside them instead
    of the standard library's (which torch imports through ``cProfile``)."""
    files = [p for folder in ("layerscale_jax", "experiments", "benchmarks", "scripts")
             for p in (REPO / folder).rglob("*") if p.suffix == ".py" or (p / "__init__.py").exists()]
    assert len(files) > 50
    clashes = sorted(str(p.relative_to(REPO)) for p in files if p.stem in sys.stdlib_module_names)
    assert not clashes, f"named like a standard-library module: {clashes}"
