"""The package's import graph, read from the source with ast: no cycles, and the layers of docs/architecture.md."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "lopd_ray"
# Command-line entry points: each runs the start-up path of lopd_ray.startup; no library module imports them. The
# commands live in lopd_ray/cli/; `python -m lopd_ray.<name>` is a one-line module at the root that calls one.
COMMAND_NAMES = ("train", "eval", "report", "build_bank", "cold_start", "build_model")
COMMANDS = {f"lopd_ray.cli.{name}" for name in COMMAND_NAMES} | {f"lopd_ray.{name}" for name in COMMAND_NAMES}
ACTORS = {"lopd_ray.rollout.worker", "lopd_ray.learner.policy_learner", "lopd_ray.teacher.worker",
          "lopd_ray.bank.bank"}
# The package's layers, bottom up (docs/architecture.md): a package may import the layers below its own, and of its
# own layer only what SIBLING_IMPORTS allows; never a layer above, nor what BELOW_REFUSED names.
LAYERS = (
    ("lopd_ray.errors",),
    ("lopd_ray.utils", "lopd_ray.data"),
    ("lopd_ray.config",),
    ("lopd_ray.algorithms", "lopd_ray.envs"),
    ("lopd_ray.modeling", "lopd_ray.models"),
    ("lopd_ray.rollout", "lopd_ray.learner", "lopd_ray.bank", "lopd_ray.teacher"),
)
SIBLING_IMPORTS = {("lopd_ray.utils", "lopd_ray.data"), ("lopd_ray.data", "lopd_ray.utils"),
                   ("lopd_ray.teacher", "lopd_ray.bank")}  # the teacher reads the bank's trace text
# Model code every actor shares depends on no config, algorithm or env; the bank's vectors on no model code; the
# learner gets what it needs of a model resolved.
BELOW_REFUSED = {"lopd_ray.modeling": ("lopd_ray.config", "lopd_ray.algorithms", "lopd_ray.envs"),
                 "lopd_ray.models": ("lopd_ray.algorithms", "lopd_ray.envs"), "lopd_ray.bank": ("lopd_ray.modeling",),
                 "lopd_ray.learner": ("lopd_ray.models",)}


def forbidden() -> dict[str, tuple[str, ...]]:
    """Package -> the top-level modules and packages of lopd_ray it must not import."""
    everything = {f"lopd_ray.{p.stem}" for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    everything.discard("lopd_ray.__init__")
    refused = {}
    for level, layer in enumerate(LAYERS):
        below = {package for lower in LAYERS[:level] for package in lower}
        for package in layer:
            allowed = (below - set(BELOW_REFUSED.get(package, ()))) | {package} | {
                other for other in layer if (package, other) in SIBLING_IMPORTS}
            refused[package] = tuple(sorted(everything - allowed))
    return refused


FORBIDDEN = forbidden()


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (at any depth of its code, lazy imports included)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}

    def resolve(name: str):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            targets |= {t for t in map(resolve, (c for c in candidates if c.startswith("lopd_ray"))) if t}
        # A package's __init__ is where its submodules are found, not a dependency on them.
        graph[name] = {t for t in targets if t != name and not name.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_every_command_exists_under_cli_and_its_entry_point_only_calls_it():
    graph = import_graph()
    assert COMMANDS <= set(graph)
    assert {m for m in graph if m.startswith("lopd_ray.cli.")} == {f"lopd_ray.cli.{name}" for name in COMMAND_NAMES}
    for name in COMMAND_NAMES:
        assert graph[f"lopd_ray.{name}"] == {f"lopd_ray.cli.{name}"}
        assert len((PACKAGE / f"{name}.py").read_text().splitlines()) <= 8


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_lower_layers_never_import_upward(layer):
    bad = {(module, target) for module, targets in import_graph().items()
           if module == layer or module.startswith(layer + ".")
           for target in targets if target.startswith(FORBIDDEN[layer]) and target != module}
    assert not bad, f"{layer} imports upward: {sorted(bad)}"


def test_only_commands_import_commands_and_nothing_below_the_actors_imports_them():
    graph = import_graph()
    assert not {(m, t) for m, targets in graph.items() if m not in COMMANDS for t in targets if t in COMMANDS}
    algorithm_side = [m for m in graph if m.startswith(("lopd_ray.algorithms", "lopd_ray.data", "lopd_ray.utils",
                                                        "lopd_ray.envs"))]
    assert not {(m, t) for m in algorithm_side for t in graph[m] if t in ACTORS}
