"""The layering holds: every import in the code (module level and inside functions) is read, and
the arrows the design forbids, and any cycle between packages, fail this test."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("roles", "state_db", "transport", "knowledge", "skills", "scripts")

# (from package, to package, why): a package is a dotted prefix; "roles.*" is any role or part of roles
NEVER = [
    ("state_db", "roles", "the state layer knows no role"),
    ("state_db", "transport", "truth does not depend on delivery"),
    ("state_db", "scripts", "the state layer knows no CLI"),
    ("transport", "roles", "the seam knows no role"),
    ("knowledge", "transport", "curation is pure over state"),
    ("skills", "transport", "skills are pure over state"),
    ("roles.eval_agent", "roles.loop_agent", "the judge shares no code path with the doer"),
    ("roles.loop_agent", "roles.eval_agent", "the doer cannot call the judge directly"),
    ("roles.loop_agent", "roles.coordinator", "roles meet only through transport and state"),
    ("roles.coordinator", "roles.loop_agent", "roles meet only through transport and state"),
    ("roles", "scripts", "roles never import the CLI"),
    ("roles.operations", "roles.loop_agent", "commands do not reach into a role"),
    ("roles.workbench.workspace", "roles.loop_agent", "the workbench knows no role"),
    ("roles.workbench.workspace", "roles.eval_agent", "the workbench knows no role"),
    ("roles.workbench.sandbox", "roles.loop_agent", "the workbench knows no role"),
    ("roles.workbench.sandbox", "roles.eval_agent", "the workbench knows no role"),
]
# Known and tracked: each entry must still exist (so the list stays true) until it is removed.
KNOWN: set[tuple[str, str]] = set()


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    here = _module_of(path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return {m for m in out if m.split(".")[0] in SOURCES}


def _edges() -> list[tuple[str, str]]:
    edges = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            for mod in _imports(path):
                edges.append((str(path.relative_to(ROOT)), mod))
    return edges


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_no_import_crosses_a_forbidden_arrow():
    found, broken = set(), []
    for path, mod in _edges():
        src = _module_of(ROOT / path)
        for a, b, why in NEVER:
            if _under(src, a) and _under(mod, b) and not _under(src, b):
                known = next((k for k in KNOWN if k[0] == path and _under(mod, k[1])), None)
                if known is not None:
                    found.add(known)
                    continue
                broken.append(f"{path} imports {mod}: never {a} -> {b} ({why})")
    assert not broken, "\n".join(sorted(set(broken)))
    assert found == KNOWN, f"known exceptions that no longer exist (remove them from KNOWN): {KNOWN - found}"


def _package(module: str) -> str:
    parts = module.split(".")
    if parts[0] in ("roles", "scripts") and len(parts) > 1:
        sub = ROOT.joinpath(*parts[:2])
        return ".".join(parts[:2]) if sub.is_dir() else parts[0]
    return parts[0]


def test_packages_import_each_other_without_cycles():
    graph: dict[str, set[str]] = {}
    for path, mod in _edges():
        a, b = _package(_module_of(ROOT / path)), _package(mod)
        if a != b:
            graph.setdefault(a, set()).add(b)
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]) if nxt in stack else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "package cycles:\n" + "\n".join(cycles)


def test_the_checker_sees_function_level_imports(tmp_path):
    """The test can fail: an import inside a function is an arrow too."""
    probe = ROOT / "roles" / "eval_agent" / "_layering_probe.py"
    probe.write_text("def f():\n    from roles.loop_agent import engine\n")
    try:
        assert ("roles/eval_agent/_layering_probe.py", "roles.loop_agent") in _edges()
    finally:
        probe.unlink()
