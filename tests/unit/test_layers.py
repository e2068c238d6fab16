"""The shell's layers, as a checked contract over the imports (docs/architecture.md, "Folders
and layers").

Read with `ast` from the source tree (every `import` and `from ... import`, also those inside
functions), each module placed in its folder: `events`, `projections`, and each package or
loose module under `services/` (`services.nats`, `services.scheduler`, `services.runtime`,
...).  The contract:

1. the decision core (`services/scheduler/core/`) imports nothing but itself and `events`,
   and `services.native`, which finds its compiled form (that is all its `__init__` asks);
2. `events` (the contract) imports nothing of `services` or `projections`;
3. `services/nats/` (the plumbing every service shares) imports only itself, `events` and the
   process's settings and logs: neither the scheduler, nor the configuration, nor any service;
4. no folder imports a private name (`_x`) of another folder;
5. no cycle between folders.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPS = {"services": "quotasched.services", "events": "quotasched.events",
        "projections": "quotasched.projections"}  # fmt: skip
CORE = "quotasched.services.scheduler.core"


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    dotted = [*TOPS[parts[0]].split("."), *parts[1:]]
    return ".".join(dotted[:-1] if dotted[-1] == "__init__" else dotted)


def folder_of(module: str) -> str:
    """`services.<package or loose module>`, `events`, `projections` (or `quotasched`)."""
    parts = module.split(".")
    if parts[:2] == ["quotasched", "services"] and len(parts) > 2:
        return f"services.{parts[2]}"
    return parts[1] if len(parts) > 1 else parts[0]


def imports_of(path: Path) -> Iterator[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for every import in the file."""
    me = module_of(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                yield base, alias.name


def sources() -> list[Path]:
    return sorted(path for top in TOPS for path in (ROOT / top).rglob("*.py")
                  if "_native" not in path.parts)  # fmt: skip (the compiled core's build)


def edges() -> list[tuple[str, str, str, str | None]]:
    """(importing module, imported module, file, name) for imports within quotasched."""
    found = []
    for path in sources():
        me = module_of(path)
        for module, name in imports_of(path):
            if module == "quotasched.services" and name is not None:  # `from ... import x`
                module, name = f"{module}.{name}", None
            if module.startswith("quotasched."):
                found.append((me, module, str(path.relative_to(ROOT)), name))
    return found


def folder_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one folder (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(set(graph) | {o for targets in graph.values() for o in targets}):
        if node not in index:
            visit(node)
    return cycles


@pytest.fixture(scope="module")
def imports() -> list[tuple[str, str, str, str | None]]:
    return edges()


def test_the_core_imports_only_itself_and_the_contract(imports):
    wrong = [(file, module) for me, module, file, _ in imports
             if me.startswith(CORE) and not module.startswith((CORE, "quotasched.events"))
             and module != "quotasched.services.native"]  # fmt: skip
    assert wrong == []


def test_the_contract_imports_no_service(imports):
    wrong = [(file, module) for me, module, file, _ in imports
             if me.startswith("quotasched.events")
             and module.startswith(("quotasched.services", "quotasched.projections"))]  # fmt: skip
    assert wrong == []


def test_the_nats_plumbing_imports_no_service_and_no_configuration(imports):
    allowed = ("quotasched.services.nats", "quotasched.events", "quotasched.services.settings",
               "quotasched.services.logs")  # fmt: skip
    wrong = [(file, module) for me, module, file, _ in imports
             if me.startswith("quotasched.services.nats") and not module.startswith(allowed)]
    assert wrong == []


def test_no_folder_takes_another_folders_private_name(imports):
    wrong = [(file, f"{module}.{name}") for me, module, file, name in imports
             if name is not None and name.startswith("_") and not name.startswith("__")
             and folder_of(me) != folder_of(module)]  # fmt: skip
    assert wrong == []


def test_no_cycle_between_folders(imports):
    graph: dict[str, set[str]] = {}
    for me, module, _, _ in imports:
        if folder_of(me) != folder_of(module) and folder_of(module) != "quotasched":
            graph.setdefault(folder_of(me), set()).add(folder_of(module))
    cycles = folder_cycles(graph)
    detail = {tuple(c): sorted({(folder_of(me), folder_of(m), f) for me, m, f, _ in imports
                                if folder_of(me) in c and folder_of(m) in c
                                and folder_of(me) != folder_of(m)})
              for c in cycles}  # fmt: skip
    assert cycles == [], detail


def test_the_cycle_finder_finds_a_loop_of_three_and_not_a_diamond():
    """The checker itself: a cycle through three folders is found, a diamond is not one."""
    loop = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert folder_cycles(loop) == [["a", "b", "c"]]
    diamond = {"a": {"b", "c"}, "b": {"d"}, "c": {"d"}}
    assert folder_cycles(diamond) == []


def test_the_reader_resolves_relative_imports_and_names_the_folder(tmp_path):
    assert folder_of("quotasched.services.nats.bus") == "services.nats"
    assert folder_of("quotasched.services.runtime") == "services.runtime"
    assert folder_of("quotasched.events.facts") == "events"
    path = ROOT / "services" / "nats" / "bus.py"
    assert module_of(path) == "quotasched.services.nats.bus"
    assert ("quotasched.services.nats", "natsfix") in set(imports_of(path))
