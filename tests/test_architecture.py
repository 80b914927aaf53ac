"""docs/architecture.md's module map is the code's: every module listed with its job, each row's
imports exactly what it imports, only rows above it (TYPE_CHECKING imports included), no circle
between any two modules, and DESIGN's boundaries held."""

from __future__ import annotations

import ast
import functools
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "installer"
MAP = ROOT / "docs" / "architecture.md"

# Standard-library modules that are boundaries of their own (DESIGN: only runner starts processes).
RESTRICTED_STDLIB = {"subprocess"}
# DESIGN's library boundaries: the one row allowed to import each.
ONLY_IN = {
    "subprocess": "runner.py",
    "requests": "delivery/",
    "tenacity": "delivery/",
    "cryptography": "delivery/",
    "pynvml": "verify/",
    "click": "cli/",
    "yaml": "cluster/",
    "prometheus_client": "metrics/",
}


@dataclass
class Row:
    name: str
    job: str
    imports: dict[str, bool]  # name -> only inside functions
    position: int


@dataclass
class Found:
    """What a row's files import: name -> True when only inside functions."""

    imports: dict[str, bool] = field(default_factory=dict)

    def add(self, name: str, lazy: bool) -> None:
        self.imports[name] = self.imports.get(name, True) and lazy


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _names(cell: str) -> dict[str, bool]:
    names = {}
    for item in cell.replace("\\", "").replace("`", "").split(","):
        item = item.strip()
        if item:
            names[item.rstrip("*")] = item.endswith("*")
    return names


@functools.lru_cache(maxsize=1)
def map_rows() -> list[Row]:
    text = MAP.read_text()
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")][2:]
    rows = []
    for position, line in enumerate(lines):
        name, job, imports, libraries = _cells(line)
        rows.append(Row(name.strip("`"), job, {**_names(imports), **_names(libraries)}, position))
    return rows


def unit_of_file(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return f"{rel.parts[0]}/" if len(rel.parts) > 1 else rel.name


def unit_of_module(dotted: str) -> str:
    parts = dotted.split(".")
    if len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
        return f"{parts[1]}/"
    if len(parts) > 1 and (PACKAGE / f"{parts[1]}.py").is_file():
        return f"{parts[1]}.py"
    return "__init__.py"  # `from installer import __version__`


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(tree: ast.AST) -> list[tuple[str, bool]]:
    """(dotted module, only inside a function) for every import that runs (not TYPE_CHECKING)."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child.test):
                for other in child.orelse:
                    visit_node(other, lazy)
            else:
                visit_node(child, lazy)

    def visit_node(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((alias.name, lazy) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module == "installer":
                found.extend((f"installer.{alias.name}", lazy) for alias in node.names)
            else:
                found.append((node.module, lazy))
        visit(node, lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    return found


def source_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


@functools.lru_cache(maxsize=1)
def found_imports() -> dict[str, Found]:
    units: dict[str, Found] = {}
    for path in source_files():
        unit = unit_of_file(path)
        found = units.setdefault(unit, Found())
        for dotted, lazy in imports_of(ast.parse(path.read_text())):
            top = dotted.split(".")[0]
            if top == "installer":
                target = unit_of_module(dotted)
                if target != unit:
                    found.add(target, lazy)
            elif top == "__future__" or (top in sys.stdlib_module_names
                                         and top not in RESTRICTED_STDLIB):
                continue
            else:
                found.add(top, lazy)
    return units


def test_every_module_is_listed_once_and_nothing_else() -> None:
    listed = [row.name for row in map_rows()]
    assert len(listed) == len(set(listed)), "a module is listed twice"
    expected = set()
    for path in source_files():
        rel = path.relative_to(PACKAGE).as_posix()
        expected.add(rel.replace("__init__.py", "") if "/" in rel else rel)
    assert sorted(set(listed) - expected) == [], "listed but not in installer/"
    assert sorted(expected - set(listed)) == [], "in installer/ but not in docs/architecture.md"


def test_every_row_says_its_job() -> None:
    for row in map_rows():
        assert len(row.job) > 10, row.name


def test_each_row_imports_exactly_what_it_lists() -> None:
    rows = {row.name: row for row in map_rows()}
    found = found_imports()
    problems = []
    for unit, imports in sorted(found.items()):
        listed = rows[unit].imports
        if imports.imports != listed:
            problems.append(f"{unit}: lists {_show(listed)} but imports {_show(imports.imports)}")
    assert problems == []


def test_a_packages_files_leave_the_import_columns_to_the_package_row() -> None:
    for row in map_rows():
        if "/" in row.name and not row.name.endswith("/"):
            assert row.imports == {}, row.name


@functools.lru_cache(maxsize=1)
def arrows() -> dict[str, set[str]]:
    """Module (dotted) -> the installer modules it imports anywhere: at the top, inside
    functions and under TYPE_CHECKING. `from installer.x import y` names y when y is a module,
    else x (a door's name is the door)."""
    modules = {_dotted(path): path for path in source_files()}

    def module_of(dotted: str) -> str:
        while dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                raise AssertionError(f"{path}: a relative import")
            if isinstance(node, ast.Import):
                targets.update(module_of(a.name) for a in node.names
                               if a.name.split(".")[0] == "installer")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == (
                    "installer"):
                assert node.module is not None
                targets.update(module_of(f"{node.module}.{a.name}") for a in node.names)
        graph[name] = targets - {name}
    return graph


def _dotted(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit_of_dotted(dotted: str) -> str:
    path = ROOT.joinpath(*dotted.split("."))
    return unit_of_file(path / "__init__.py" if path.is_dir() else path.with_suffix(".py"))


def test_no_row_imports_a_row_below_it() -> None:
    """TYPE_CHECKING imports included: an annotation that names a room below is an arrow up."""
    rows = {row.name: row for row in map_rows()}
    upward = set()
    for module, targets in arrows().items():
        unit = _unit_of_dotted(module)
        for target in targets:
            name = _unit_of_dotted(target)
            if name != unit and rows[name].position > rows[unit].position:
                upward.add(f"{module} imports {target}, which is below it")
    assert sorted(upward) == []


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_no_circle_between_modules() -> None:
    """Module by module, inside rooms as well as between them, every kind of import counted."""
    assert circles(arrows()) == []


def _folder_of(dotted: str) -> str:
    """Inside a room, the folder a module lives in (`installer.sources.runfile.steps` ->
    `installer.sources.runfile`; a folder's door stands apart as `<folder>:door`, since a door
    importing its own folders is what a door is for); a loose top-level module stands alone."""
    parts = dotted.split(".")
    if len(parts) <= 2 and not ROOT.joinpath(*parts).is_dir():
        return dotted
    if ROOT.joinpath(*parts).is_dir():
        return f"{dotted}:door"
    return ".".join(parts[:-1])


def test_no_circle_between_folders() -> None:
    """Folder by folder inside the rooms (sources/runfile/ and sources/prebuilt/, say): a circle
    between two folders is a contract in the wrong one, even when no two modules form one."""
    graph: dict[str, set[str]] = {}
    for module, targets in arrows().items():
        folder = _folder_of(module)
        graph.setdefault(folder, set()).update(
            _folder_of(t) for t in targets if _folder_of(t) != folder)
    assert circles(graph) == []


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_no_module_imports_the_door_of_its_own_room() -> None:
    """A room's door (its `__init__`) stands above the modules behind it: they import each
    other, never the door (the contract a module needs lives in the module that defines it)."""
    offenders = []
    for module, targets in arrows().items():
        is_door = (ROOT.joinpath(*module.split(".")) / "__init__.py").is_file()
        for target in targets:
            inside = module.startswith(target + ".")
            if inside and target != "installer" and not (is_door and module == target):
                offenders.append(f"{module} imports {target}")
    assert offenders == []


@functools.lru_cache(maxsize=1)
def doors() -> dict[str, frozenset[str] | None]:
    """Package (dotted) -> the names its door's `__all__` lists (None: it has no `__all__`)."""
    found: dict[str, frozenset[str] | None] = {}
    for path in source_files():
        if path.name == "__init__.py":
            listed = None
            for node in ast.parse(path.read_text()).body:
                targets = node.targets if isinstance(node, ast.Assign) else (
                    [node.target] if isinstance(node, ast.AnnAssign) else [])
                if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                    assert isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value
                    listed = frozenset(ast.literal_eval(node.value))
            found[_dotted(path)] = listed
    return found


def _imported(node: ast.AST) -> list[str]:
    """The dotted installer names an import statement reaches (`from installer.release import
    versions` -> installer.release.versions)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "installer"]
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "installer":
        return [f"{node.module}.{a.name}" for a in node.names]
    return []


def past_doors(importer: str, is_door: bool, reached: str) -> list[str]:
    """Why `importer` reaching `reached` goes past a door, if it does: from outside a package,
    each package on the way must list the next name in its `__all__`, and nothing may be
    reached inside a plain module behind it. A module inside the package, and the door of a
    package around it (a door gathers what it exports), are not outside."""
    parts = reached.split(".")
    listed = doors()
    passed = ""  # the last door passed from outside its package
    for depth in range(2, len(parts)):
        package = ".".join(parts[:depth])
        if package not in listed:  # a plain module: a name inside it
            return [f"{importer} reaches {reached} behind {passed}'s door"] if passed else []
        inside = importer == package or importer.startswith(package + ".")
        if inside or (is_door and package.startswith(importer + ".")):
            passed = ""
            continue
        if parts[depth] not in (listed[package] or ()):
            return [f"{importer} reaches {reached}: {package}'s door does not list "
                    f"{parts[depth]!r}"]
        passed = package
    return []


def test_every_package_has_a_door() -> None:
    """Every package's `__init__` says, in `__all__`, what other rooms may import from it."""
    assert sorted(p for p, names in doors().items() if names is None and p != "installer") == []


def test_other_rooms_come_in_through_the_door() -> None:
    """docs/architecture.md's door rule: from outside a package, only the names its door lists,
    imported from the package (`from installer.release import versions`), never a name from a
    module behind the door (`from installer.release.versions import ...`)."""
    offenders = []
    for path in source_files():
        importer = _dotted(path)
        for node in ast.walk(ast.parse(path.read_text())):
            for reached in _imported(node):
                offenders += past_doors(importer, path.name == "__init__.py", reached)
    assert offenders == []


def test_the_door_check_finds_a_way_past_a_door() -> None:
    assert past_doors("installer.app", False, "installer.release.versions") == []
    assert past_doors("installer.app", False, "installer.release.versions.parse_request")
    assert past_doors("installer.app", False, "installer.delivery.part")
    assert past_doors("installer.delivery.fetch", False, "installer.delivery.part.PartFile") == []


def _aliases(source: str) -> list[str]:
    """Installer modules imported under a name that does not hold the module's own."""
    found = []
    for node in ast.walk(ast.parse(source)):
        for alias in getattr(node, "names", ()):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or not alias.asname:
                continue
            reached = f"{node.module}.{alias.name}" if isinstance(node, ast.ImportFrom) else (
                alias.name)
            if reached.split(".")[0] != "installer":
                continue
            name = reached.rsplit(".", 1)[-1]
            module = PACKAGE.parent.joinpath(*reached.split("."))
            is_module = module.with_suffix(".py").is_file() or module.is_dir()
            if alias.asname and is_module and name not in alias.asname:
                found.append(f"{node.lineno}: {reached} as {alias.asname}")
    return found


def test_a_module_imported_under_another_name_keeps_its_own_in_it() -> None:
    """`from installer.sources.dnf import repos as dnf_repos`, never `... as cmd` or a name
    the module had before a move: grep for the module finds every user."""
    paths = [*source_files(), *sorted((ROOT / "tests").rglob("*.py"))]
    assert [f"{path.relative_to(ROOT)}:{found}" for path in paths
            for found in _aliases(path.read_text())] == []


def test_the_alias_check_finds_a_module_under_an_old_name() -> None:
    assert _aliases("from installer.headers import trees as kernel\n"
                    "from installer.release import download as prefetch\n"
                    "import installer.sources.dnf.commands as cmd\n") == [
        "1: installer.headers.trees as kernel", "2: installer.release.download as prefetch",
        "3: installer.sources.dnf.commands as cmd"]
    assert _aliases("from installer.sources.dnf import repos as dnf_repos\n"
                    "from installer.steps.coherent import decide as coherent_memory\n") == []


@pytest.mark.parametrize(("library", "owner"), sorted(ONLY_IN.items()))
def test_each_boundary_library_has_one_importer(library: str, owner: str) -> None:
    importers = sorted(unit for unit, found in found_imports().items()
                       if library in found.imports)
    assert importers == [owner], f"{library} is imported by {importers}, only {owner} may"


def test_only_hostroot_joins_root_prefixes() -> None:
    """Outside hostroot.py the root directory (`<HostRoot>.root`) may appear in messages only."""
    offenders = []
    for path in source_files():
        if path.name == "hostroot.py":
            continue
        tree = ast.parse(path.read_text())
        in_messages = {id(n) for f in ast.walk(tree) if isinstance(f, ast.JoinedStr)
                       for n in ast.walk(f)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr == "root"
                    and _names_a_root(node.value) and id(node) not in in_messages):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def _names_a_root(node: ast.expr) -> bool:
    """`root.root`, `ctx.root.root`, `self.root.root`: the HostRoot's directory."""
    return (isinstance(node, ast.Name) and node.id == "root") or (
        isinstance(node, ast.Attribute) and node.attr == "root")


def _comparisons_with(names: set[str], room: str) -> list[str]:
    """Where code outside installer/<room>/ compares a value with one of `names`."""
    offenders = []
    for path in source_files():
        if path.is_relative_to(PACKAGE / room):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                values = [node.left, *node.comparators]
                if any(isinstance(v, ast.Constant) and v.value in names for v in values):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return offenders


def test_no_code_outside_distros_compares_with_a_family_name() -> None:
    from installer import distros

    assert _comparisons_with({family.name for family in distros.FAMILIES}, "distros") == []


def test_no_code_outside_sources_compares_with_a_source_name() -> None:
    from installer import sources

    assert _comparisons_with(set(sources.names()), "sources") == []


def _show(names: dict[str, bool]) -> str:
    return ", ".join(f"{n}{'*' if lazy else ''}" for n, lazy in sorted(names.items())) or "nothing"


def test_the_map_is_linked_from_the_readme() -> None:
    assert re.search(r"\(docs/architecture\.md\)", (ROOT / "README.md").read_text())
