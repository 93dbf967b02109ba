"""No import cycles: each module of both stages, the workflows and the shared contract can be read after what it imports.

The graph is read from the source (every import statement, those inside functions too: a deferred import
is still a dependency), so a cycle that only shows at run time is caught as well.
"""

import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("preprocess", "train", "pipelines", "dataset_contract")


def module_files() -> dict[str, pathlib.Path]:
    modules = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def import_graph(modules: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports (`from a import b` names a.b when b is a module)."""
    graph = {}
    for name, path in modules.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                for alias in node.names:
                    child = f"{node.module}.{alias.name}"
                    imported.add(child if child in modules else node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names if alias.name in modules)
        imported.discard(name)
        graph[name] = imported
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_packages_have_no_import_cycle():
    graph = import_graph(module_files())
    assert "train.config" in graph and "pipelines.tpu.launch" in graph  # the walk found the tree
    assert cycles(graph) == []


@pytest.mark.parametrize(
    "graph, expected",
    [
        ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set(), "c": {"a", "b"}}, []),
    ],
)
def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle(graph, expected):
    assert cycles(graph) == expected
