"""The import rules of docs/ARCHITECTURE.md, checked on every module's imports (top-level and inside
functions): a package imports only packages of a lower layer (and itself), no package cycle, no
private name imported across packages, core never imports torch, and a function-level import of
another trainperf package says why in a comment.

Run as a script to print the package graph: ``python tests/unit/test_layers.py``.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "trainperf"

# bottom first; a package may import only packages of a strictly lower layer
LAYERS = [
    {"core"},
    {"store"},
    {"mlperf"},
    {"model", "data"},
    {"parallel", "workloads"},
    {"train"},
    {"plan", "preflight", "trace"},
    {"report"},
    {"runner"},
    {"cli"},
]
LEVEL = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
TOP_LEVEL_MODULES = {"__init__": -1, "__main__": len(LAYERS)}  # the version string; `python -m trainperf`
TORCH_FREE = {"core", "mlperf", "store"}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path):
    """(imported module, imported names, line, inside a function, comment on the line) of every import."""
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    me = module_name(path)
    is_pkg = path.name == "__init__.py"
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    inside = {id(n) for f in funcs for n in ast.walk(f) if n is not f}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, [], node.lineno, id(node) in inside, _comment(lines, node)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = me.split(".") if is_pkg else me.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield mod, [a.name for a in node.names], node.lineno, id(node) in inside, _comment(lines, node)


def _comment(lines: list[str], node) -> str:
    """The comment on an import's lines, or on the line just above it."""
    text = " ".join(lines[node.lineno - 1: node.end_lineno])
    above = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
    found = text.split("#", 1)[1] if "#" in text else ""
    return found or (above[1:] if above.startswith("#") else "")


def modules():
    return sorted(SRC.rglob("*.py"))


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in modules():
        src = package_of(module_name(path))
        for mod, names, *_ in imports(path):
            if mod == "trainperf":  # `from trainperf import __version__` / `from trainperf import core`
                targets = [n if (SRC / n).exists() or (SRC / f"{n}.py").exists() else "__init__" for n in names]
            elif mod.startswith("trainperf."):
                targets = [package_of(mod)]
            else:
                continue
            graph[src].update(t for t in targets if t != src)
    return graph


def level(pkg: str) -> int:
    return TOP_LEVEL_MODULES.get(pkg, LEVEL.get(pkg, -99))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one package (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


def test_every_package_has_a_layer():
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(LEVEL), f"packages without a layer, or layers without a package: {packages ^ set(LEVEL)}"


def test_no_upward_or_sideways_import():
    bad = []
    for path in modules():
        src = package_of(module_name(path))
        for mod, names, line, _, _ in imports(path):
            if not mod.startswith("trainperf"):
                continue
            targets = [package_of(mod)] if mod != "trainperf" else ["__init__"]
            for dst in targets:
                if dst != src and level(dst) >= level(src):
                    bad.append(f"{path.relative_to(SRC.parent)}:{line}: {src} (layer {level(src)}) imports {mod} "
                               f"({dst}, layer {level(dst)})")
    assert not bad, "imports that break the layers:\n" + "\n".join(bad)


def test_no_package_cycle():
    assert cycles(package_graph()) == []


def test_no_private_name_crosses_a_package():
    bad = []
    for path in modules():
        src = package_of(module_name(path))
        for mod, names, line, _, _ in imports(path):
            if not mod.startswith("trainperf.") or package_of(mod) == src:
                continue
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            private += [p for p in mod.split(".") if p.startswith("_") and not p.startswith("__")]
            if private:
                bad.append(f"{path.relative_to(SRC.parent)}:{line}: {', '.join(private)} from {mod}")
    assert not bad, "private names imported from another package:\n" + "\n".join(bad)


def test_torch_free_packages_never_import_torch():
    bad = []
    for path in modules():
        if package_of(module_name(path)) not in TORCH_FREE:
            continue
        for mod, _, line, _, _ in imports(path):
            if mod.split(".")[0] in ("torch", "triton", "torchao"):
                bad.append(f"{path.relative_to(SRC.parent)}:{line}: imports {mod}")
    assert not bad, "\n".join(bad)


def test_function_level_imports_of_trainperf_say_why():
    bad = []
    for path in modules():
        src = package_of(module_name(path))
        for mod, names, line, inside, comment in imports(path):
            if inside and mod.startswith("trainperf") and (mod == "trainperf" or package_of(mod) != src) and not comment.strip():
                bad.append(f"{path.relative_to(SRC.parent)}:{line}: from {mod} import {', '.join(names)}")
    assert not bad, "function-level imports of another package without a comment saying why:\n" + "\n".join(bad)


def test_the_rules_catch_a_forbidden_edge(tmp_path, monkeypatch):
    """The checker itself: a model module importing the trainer is reported."""
    pkg = tmp_path / "trainperf"
    for name in LEVEL:
        (pkg / name).mkdir(parents=True)
        (pkg / name / "__init__.py").write_text("")
    (pkg / "model" / "bad.py").write_text("def f():\n    from trainperf.train.loop import train\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", pkg)
    try:
        test_no_upward_or_sideways_import()
    except AssertionError as exc:
        assert "model (layer 3) imports trainperf.train.loop" in str(exc)
    else:
        raise AssertionError("an upward import was not reported")
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


if __name__ == "__main__":
    graph = package_graph()
    for i, layer in reversed(list(enumerate(LAYERS))):
        for pkg in sorted(layer):
            print(f"{i}  {pkg:10s} -> {', '.join(sorted(graph.get(pkg, ()), key=lambda p: -level(p))) or '-'}")
    found = cycles(graph)
    print("cycles:", found or "none")
    sys.exit(1 if found else 0)
