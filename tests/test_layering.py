"""The layering holds: every import in the code (module level and inside functions) is read, and
the arrows the design forbids, and any cycle between packages (the top-level ones and the parts of
``roles/`` and ``scripts/``), fail this test. The checker's own tests build their probes in a
temporary tree: nothing is written into the source tree."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

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
    ("roles.coordinator", "roles.workbench.sandbox", "the coordinator runs no checks itself: it asks roles.operations.watch"),
    ("roles.coordinator", "roles.workbench.workspace", "the coordinator reads no history itself: it asks roles.operations.watch"),
    ("roles.coordinator", "roles.workbench", "the coordinator runs no checks itself: it asks roles.operations.watch"),
    ("roles.supervisor", "roles.operations", "the supervisor runs roles; commands are the human's"),
    ("roles.operations", "roles.base.transport_link", "a human command sends as itself (transport.wake), not through a role's link"),
    ("scripts", "roles.base.transport_link", "a human command sends as itself (transport.wake), not through a role's link"),
    ("knowledge", "roles", "knowledge reads recorded facts, not a role's code"),
    ("skills", "roles", "skills read recorded facts, not a role's code"),
]
# the two layers under the roles (roles/base/, roles/workbench/) never import a role
ROLES = ("roles.coordinator", "roles.loop_agent", "roles.eval_agent", "roles.curator", "roles.supervisor",
         "roles.operations")
LAYERS = ("roles.base", "roles.workbench")
NEVER += [(layer, role, f"{layer.replace('.', '/')}/ is under the roles: it never imports one")
          for layer in LAYERS for role in ROLES]
# Known and tracked: each entry must still exist (so the list stays true) until it is removed.
KNOWN: set[tuple[str, str]] = set()


def _module_of(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path, root: Path = ROOT) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    here = _module_of(path, root).split(".")
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


def _edges(root: Path = ROOT) -> list[tuple[str, str]]:
    """(file relative to ``root``, module it imports) for every import of the sources under ``root``."""
    edges = []
    for top in SOURCES:
        for path in sorted((root / top).rglob("*.py")):
            for mod in _imports(path, root):
                edges.append((str(path.relative_to(root)), mod))
    return edges


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _crossings(root: Path = ROOT) -> tuple[list[str], set[tuple[str, str]]]:
    """The imports under ``root`` that cross a NEVER arrow, and the KNOWN entries met."""
    found, broken = set(), []
    for path, mod in _edges(root):
        src = _module_of(root / path, root)
        for a, b, why in NEVER:
            if _under(src, a) and _under(mod, b) and not _under(src, b):
                known = next((k for k in KNOWN if k[0] == path and _under(mod, k[1])), None)
                if known is not None:
                    found.add(known)
                    continue
                broken.append(f"{path} imports {mod}: never {a} -> {b} ({why})")
    return sorted(set(broken)), found


def test_no_import_crosses_a_forbidden_arrow():
    broken, found = _crossings()
    assert not broken, "\n".join(broken)
    assert found == KNOWN, f"known exceptions that no longer exist (remove them from KNOWN): {KNOWN - found}"


def _package(module: str, root: Path = ROOT, top: bool = False) -> str:
    """The package ``module`` belongs to: its top-level one (``top``), else a part of roles/ or
    scripts/ that is a folder, else its top-level one."""
    parts = module.split(".")
    if not top and parts[0] in ("roles", "scripts") and len(parts) > 1:
        sub = root.joinpath(*parts[:2])
        return ".".join(parts[:2]) if sub.is_dir() else parts[0]
    return parts[0]


def _cycles(root: Path = ROOT, top: bool = False) -> list[str]:
    """The import cycles between packages under ``root`` (top-level packages only with ``top``)."""
    graph: dict[str, set[str]] = {}
    for path, mod in _edges(root):
        a, b = _package(_module_of(root / path, root), root, top), _package(mod, root, top)
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
    return cycles


def test_packages_import_each_other_without_cycles():
    cycles = _cycles()
    assert not cycles, "package cycles:\n" + "\n".join(cycles)


def test_top_level_packages_import_each_other_without_cycles():
    cycles = _cycles(top=True)
    assert not cycles, "top-level package cycles:\n" + "\n".join(cycles)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_checker_sees_function_level_imports(tmp_path):
    """The test can fail: an import inside a function is an arrow too (the probe lives in tmp_path)."""
    root = _tree(tmp_path, {"roles/__init__.py": "", "roles/eval_agent/__init__.py": "",
                            "roles/eval_agent/probe.py": "def f():\n    from roles.loop_agent import engine\n"})
    assert ("roles/eval_agent/probe.py", "roles.loop_agent") in _edges(root)
    assert any("never roles.eval_agent -> roles.loop_agent" in b for b in _crossings(root)[0])


def test_a_cycle_between_top_level_packages_is_seen(tmp_path):
    """knowledge -> roles -> knowledge is a cycle of top-level packages even when no two parts of
    roles/ form one."""
    root = _tree(tmp_path, {"knowledge/__init__.py": "", "knowledge/findings.py": "from roles.eval_agent import evidence\n",
                            "roles/__init__.py": "", "roles/eval_agent/__init__.py": "",
                            "roles/eval_agent/evidence.py": "", "roles/curator/__init__.py": "",
                            "roles/curator/pipeline.py": "from knowledge import findings\n"})
    assert _cycles(root) == []
    assert _cycles(root, top=True) == ["knowledge -> roles -> knowledge"]


@pytest.mark.parametrize("layer", ["roles/base", "roles/workbench", "roles/workbench/sandbox"])
@pytest.mark.parametrize("role", ROLES)
def test_the_layers_under_the_roles_never_import_a_role(tmp_path, layer, role):
    """The prefix rules hold for everything in roles/base/ and roles/workbench/, at any depth."""
    module = f"{layer}/probe.py"
    root = _tree(tmp_path, {"roles/__init__.py": "", module: f"import {role}.process\n"})
    broken, _ = _crossings(root)
    assert broken and all(f"-> {role} " in b for b in broken), broken
