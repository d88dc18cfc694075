"""The layering of docs/architecture.md: every import points down (or stays inside its own layer).

Imports are read with `ast`, wherever they stand (module level, inside functions, under `if`), and
so are imports by name: `importlib.import_module("x")`, `__import__("x")` and `sys.modules["x"]`
or `sys.modules.get("x")` with a literal name.
"""

from __future__ import annotations

import ast
import os
import textwrap

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("h2", "ditorch", "dicomm", "heteropp", "heteroauto")

# Each layer, and the layers it may import besides itself (the most specific name decides a module's
# layer). Nothing imports h2.cli; h2 itself (h2/__init__.py) imports nothing. Inside a layer, no two
# modules import each other, directly or through others (import_cycles).
MAY_IMPORT = {
    "h2.core": (),
    "ditorch": ("h2.core", ),
    "dicomm": ("h2.core", ),
    "h2.model": ("h2.core", ),
    "h2.data": ("h2.core", ),
    "heteroauto": ("h2.core", ),
    "heteropp": ("h2.core", "h2.model", "h2.data", "ditorch", "dicomm"),
    "h2.ps": ("h2.core", "h2.model", "h2.data"),
    "h2.train": ("h2.core", "h2.model", "h2.data", "ditorch", "dicomm", "heteropp", "h2.ps"),
    "h2.launch": ("h2.core", "h2.model", "h2.data", "ditorch", "dicomm", "heteropp", "heteroauto", "h2.ps", "h2.train"),
    "h2.cli": ("h2.core", "h2.model", "h2.data", "ditorch", "dicomm", "heteropp", "heteroauto", "h2.ps", "h2.train",
               "h2.launch"),
    "h2.__main__": ("h2.cli", ),
    "h2": (),
}
# Layers the planner uses without torch: torch may be imported inside functions only.
TORCH_FREE_AT_IMPORT = ("h2.core", "heteroauto")
# Modules that must not reach a package, by any chain of imports (a package's __init__ counts: Python
# runs it first): a rank runs the job the launcher resolved (h2.launch.job) and never plans.
MUST_NOT_REACH = {"h2.cli.rank": ("heteroauto", )}


def layer_of(module: str) -> str | None:
    matches = [name for name in MAY_IMPORT if module == name or module.startswith(name + ".")]
    return max(matches, key=len) if matches else None


def module_name(root: str, path: str) -> str:
    relative = os.path.relpath(path, root)[:-len(".py")].split(os.sep)
    if relative[-1] == "__init__":
        relative = relative[:-1]
    return ".".join(relative)


def _literal(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def imported_names(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import in `tree`, by statement or by name."""
    found: list[tuple[str, int, bool]] = []
    top_level = {id(node) for node in getattr(tree, "body", [])}

    def at_top(node: ast.AST) -> bool:
        return id(node) in top_level

    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno, at_top(node)) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            found.append((base, node.lineno, at_top(node)))
            found += [(f"{base}.{alias.name}", node.lineno, at_top(node)) for alias in node.names]
        elif isinstance(node, ast.Call):
            function = node.func
            name = ast.unparse(function)
            if name in ("importlib.import_module", "import_module", "__import__", "sys.modules.get") and node.args:
                literal = _literal(node.args[0])
                if literal:
                    found.append((literal, node.lineno, False))
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "sys.modules":
            literal = _literal(node.slice)
            if literal:
                found.append((literal, node.lineno, False))
    return found


def violations(root: str, packages=PACKAGES) -> list[str]:
    problems = []
    for package in packages:
        for folder, _, files in os.walk(os.path.join(root, package)):
            for file in sorted(files):
                if not file.endswith(".py"):
                    continue
                path = os.path.join(folder, file)
                module = module_name(root, path)
                own = layer_of(module)
                if own is None:
                    problems.append(f"{path}: module {module} belongs to no layer")
                    continue
                with open(path, encoding="utf-8") as handle:
                    tree = ast.parse(handle.read(), path)
                for name, line, top in imported_names(tree, module, file == "__init__.py"):
                    where = f"{os.path.relpath(path, root)}:{line}"
                    if top and own.startswith(TORCH_FREE_AT_IMPORT) and (name == "torch" or name.startswith("torch.")):
                        problems.append(f"{where}: {own} imports torch at module level")
                    if name.split(".")[0] not in PACKAGES or name == "h2":
                        continue
                    target = layer_of(name)
                    if target is None or (target != own and target not in MAY_IMPORT[own]):
                        problems.append(f"{where}: {module} ({own}) imports {name} ({target})")
    return sorted(set(problems))


def _project_modules(root: str, packages=PACKAGES) -> dict[str, tuple[str, bool]]:
    """module name -> (path, is a package's __init__) for every module of the project."""
    modules = {}
    for package in packages:
        for folder, _, files in os.walk(os.path.join(root, package)):
            for file in files:
                if file.endswith(".py"):
                    path = os.path.join(folder, file)
                    modules[module_name(root, path)] = (path, file == "__init__.py")
    return modules


def import_graph(root: str, packages=PACKAGES) -> dict[str, set[str]]:
    """module -> the project's modules it imports (a name inside a module counts as that module),
    wherever the import stands: module level, inside functions, under `if TYPE_CHECKING`. A module's
    own enclosing packages are left out: Python runs them before the module in any case."""
    modules = _project_modules(root, packages)
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for module, (path, is_package) in modules.items():
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), path)
        for name, _, _ in imported_names(tree, module, is_package):
            parts = name.split(".")
            target = next((".".join(parts[:n])
                           for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in modules), None)
            if target is not None and target != module and not module.startswith(target + "."):
                graph[module].add(target)
    return graph


def import_cycles(root: str, packages=PACKAGES) -> list[list[str]]:
    """Every group of modules that import each other, directly or through others (strongly connected
    components of more than one module, Tarjan's algorithm), each sorted."""
    graph = import_graph(root, packages)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
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
                        cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(cycles)


def forbidden_reaches(root: str, packages=PACKAGES) -> list[str]:
    """'A reaches B (A -> ... -> B)' for every module B of a package that MUST_NOT_REACH bans from A."""
    graph = import_graph(root, packages)
    problems = []
    for start, banned in MUST_NOT_REACH.items():
        if start not in graph:
            continue
        came_from: dict[str, str | None] = {start: None}
        queue = [start]
        while queue:
            module = queue.pop(0)
            parts = module.split(".")
            packages_run = [".".join(parts[:n]) for n in range(1, len(parts))]
            for target in sorted(graph[module]) + [name for name in packages_run if name in graph]:
                if target not in came_from:
                    came_from[target] = module
                    queue.append(target)
        for module in sorted(came_from):
            if any(module == name or module.startswith(name + ".") for name in banned):
                chain = [module]
                while came_from[chain[-1]] is not None:
                    chain.append(came_from[chain[-1]])
                problems.append(f"{start} reaches {module} ({' -> '.join(reversed(chain))})")
    return problems


def test_every_import_in_the_project_points_down():
    assert violations(REPO_ROOT) == []


def test_no_modules_import_each_other_inside_a_layer():
    assert import_cycles(REPO_ROOT) == []


def test_a_rank_never_reaches_the_planner():
    assert forbidden_reaches(REPO_ROOT) == []


@pytest.mark.parametrize("files", [
    {
        "h2/cli/rank.py": "def main():\n    from heteroauto.jeeves_plan import with_schedule_orders\n",
        "heteroauto/jeeves_plan.py": ""
    },
    {
        "h2/cli/rank.py": "from h2.launch import job\n", "h2/launch/job.py": "import heteroauto\n",
        "heteroauto/__init__.py": ""
    },
    {
        "h2/cli/rank.py": "import h2.launch.job\n", "h2/launch/job.py": "",
        "h2/launch/__init__.py": "import heteroauto\n", "heteroauto/__init__.py": ""
    },
])
def test_a_rank_that_imports_the_planner_directly_or_through_others_is_found(tmp_path, files):
    problems = forbidden_reaches(_tree(tmp_path, files))
    assert len(problems) == 1 and problems[0].startswith("h2.cli.rank reaches heteroauto"), problems


def test_every_package_says_what_it_owns_and_must_not_import():
    for layer in MAY_IMPORT:
        path = os.path.join(REPO_ROOT, *layer.split("."))
        init = os.path.join(path, "__init__.py")
        if not os.path.isfile(init):
            continue
        with open(init, encoding="utf-8") as handle:
            docstring = ast.get_docstring(ast.parse(handle.read()))
        assert docstring, f"{init} has no docstring"


def _tree(tmp_path, files: dict[str, str]) -> str:
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    for package in PACKAGES:
        (tmp_path / package).mkdir(exist_ok=True)
    return str(tmp_path)


@pytest.mark.parametrize("relative, text, expected", [
    ("h2/core/bad.py", "import heteropp.engine\n", "h2.core.bad (h2.core) imports heteropp.engine (heteropp)"),
    ("h2/core/bad.py", "def f():\n    from h2.train import trainer\n",
     "h2.core.bad (h2.core) imports h2.train (h2.train)"),
    ("ditorch/bad.py", "import dicomm\n", "ditorch.bad (ditorch) imports dicomm (dicomm)"),
    ("dicomm/bad.py", "from ditorch import dipu\n", "dicomm.bad (dicomm) imports ditorch (ditorch)"),
    ("ditorch/bad.py", "import importlib\nimportlib.import_module('dicomm.torch_backend')\n",
     "imports dicomm.torch_backend (dicomm)"),
    ("ditorch/bad.py", "import sys\nsys.modules.get('dicomm.torch_backend')\n",
     "imports dicomm.torch_backend (dicomm)"),
    ("heteropp/bad.py", "from heteroauto import search\n", "heteropp.bad (heteropp) imports heteroauto"),
    ("heteroauto/bad.py", "from heteropp.engine import PipelineEngine\n",
     "heteroauto.bad (heteroauto) imports heteropp.engine (heteropp)"),
    ("h2/train/bad.py", "from h2.cli import main\n", "h2.train.bad (h2.train) imports h2.cli (h2.cli)"),
    ("h2/core/bad.py", "import torch\n", "h2.core imports torch at module level"),
    ("h2/core/sub/bad.py", "from .. import errors\nfrom ...train import trainer\n",
     "h2.core.sub.bad (h2.core) imports h2.train"),
])
def test_an_import_that_points_up_or_sideways_is_found(tmp_path, relative, text, expected):
    problems = violations(_tree(tmp_path, {relative: text}))
    assert any(expected in problem for problem in problems), problems


def test_imports_that_point_down_are_allowed(tmp_path):
    tree = _tree(
        tmp_path, {
            "h2/cli/ok.py": "import heteroauto.search\nimport h2.train.trainer\nimport ditorch\nimport dicomm\n",
            "heteropp/ok.py": "import dicomm\nimport ditorch.dipu\nfrom h2.model import Transformer\n",
            "h2/core/ok.py": "def f():\n    import torch\n",
            "ditorch/ok.py": "from h2.core.errors import UserError\n",
        })
    assert violations(tree) == []


@pytest.mark.parametrize("files, expected", [
    ({"h2/cli/a.py": "from h2.cli import b\n", "h2/cli/b.py": "def f():\n    import h2.cli.a\n"
      }, [["h2.cli.a", "h2.cli.b"]]),
    ({
        "h2/core/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from h2.core.c import C\n",
        "h2/core/b.py": "from h2.core.a import x\n", "h2/core/c.py": "from h2.core.b import y\n"
    }, [["h2.core.a", "h2.core.b", "h2.core.c"]]),
])
def test_modules_that_import_each_other_inside_a_layer_are_found(tmp_path, files, expected):
    assert import_cycles(_tree(tmp_path, files)) == expected


def test_a_chain_of_imports_without_a_cycle_is_allowed(tmp_path):
    tree = _tree(tmp_path, {
        "h2/core/a.py": "from h2.core import b\n", "h2/core/b.py": "import h2.core.c\n", "h2/core/c.py": "import os\n"
    })
    assert import_cycles(tree) == []
