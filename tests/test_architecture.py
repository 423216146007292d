"""The architecture, as rules that fail when code breaks them (read from the source with `ast`).

- The store is a seam: SQL is written, and `.execute` called, only in `store/` and in
  its two extensions, which keep their own tables (the proxy's call index and the
  accounting).
- The store imports nothing above it: only its own modules and the leaf helpers it
  shares with everything (`canonical`, `errors`, `sanitize`, which import only each other).
- `mcp` knows nothing of the gate: no module of it imports `gate`, even through another.
- Nothing above the store catches a database driver's error (`sqlite3`, `psycopg`): it
  catches the store's own (`StoreError`, or `store.DATABASE_ERRORS`).

Each check is a function of a module's source, so `test_each_check_finds_what_it_forbids`
proves it against a small violation; the rules then run over every module of the package.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "agentrt"
# The store's extensions: modules of their own that write only their own tables.
EXTENSIONS = frozenset({"agentrt.proxy._index", "agentrt.accounting", "agentrt.proxy._flows"})
# What the store may import from the rest of agentrt: helpers that import nothing above them.
LEAVES = frozenset({"agentrt._lazy", "agentrt.canonical", "agentrt.errors", "agentrt.sanitize"})
DRIVERS = frozenset({"sqlite3", "psycopg"})

# A string that is a statement (it begins with a keyword) or holds one (a clause only SQL has).
_STATEMENT = re.compile(
    r"^\s*(?:(?:SELECT|INSERT|UPDATE|DELETE|REPLACE|CREATE|DROP|ALTER|PRAGMA|SAVEPOINT|"
    r"RELEASE|WITH)\s+\S|(?:BEGIN|COMMIT|ROLLBACK|VACUUM|ANALYZE)(?:\s|$))"
)
_CLAUSE = re.compile(
    r"\b(?:SELECT\b.*\bFROM\s+\w|INSERT\s+(?:OR\s+\w+\s+)?INTO\s+\w|UPDATE\s+\w+\s+SET\b|"
    r"DELETE\s+FROM\s+\w|(?:CREATE|DROP)\s+(?:UNIQUE\s+)?(?:TABLE|INDEX|TRIGGER|VIEW)\b|"
    r"ALTER\s+TABLE\s+\w)",
    re.DOTALL,
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, tuple[Path, ast.Module]]:
    return {
        _module_name(path): (path, ast.parse(path.read_text(), str(path)))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def _in_store(name: str) -> bool:
    return name == "agentrt.store" or name.startswith("agentrt.store.")


def _docstrings(tree: ast.Module) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def sql_in(tree: ast.Module) -> list[str]:
    """Each SQL string literal (docstrings aside) and each `.execute` call, with its line."""
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and (_STATEMENT.search(node.value) or _CLAUSE.search(node.value))
        ):
            found.append(f"line {node.lineno}: SQL {node.value[:60]!r}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("execute", "executemany", "executescript")
        ):
            found.append(f"line {node.lineno}: .{node.func.attr}(")
    return found


def imports_of(name: str, tree: ast.Module, is_package: bool) -> set[str]:
    """The agentrt modules `name` imports (relative imports resolved, `from . import x`
    counted as module `x` when it is one), under `TYPE_CHECKING` too."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            known = _modules()
            found.update(
                f"{target}.{alias.name}"
                for alias in node.names
                if f"{target}.{alias.name}" in known
            )
    return {module for module in found if module == "agentrt" or module.startswith("agentrt.")}


def _imports(name: str) -> set[str]:
    path, tree = _modules()[name]
    return imports_of(name, tree, path.name == "__init__.py")


def _reached(start: set[str]) -> dict[str, str]:
    """Every agentrt module reached by importing `start`, each with the module that imported it."""
    via: dict[str, str] = {}
    todo = sorted(start)
    while todo:
        name = todo.pop()
        for imported in _imports(name):
            if imported not in via and imported not in start and imported in _modules():
                via[imported] = name
                todo.append(imported)
    return via


def driver_errors_caught(tree: ast.Module) -> list[str]:
    """Each `except` naming an error of a database driver (through any alias of it)."""
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update(
                alias.asname or alias.name.partition(".")[0]
                for alias in node.names
                if alias.name.partition(".")[0] in DRIVERS
            )
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and (node.module or "").partition(".")[0] in DRIVERS
        ):
            aliases.update(alias.asname or alias.name for alias in node.names)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            names = {part.id for part in ast.walk(node.type) if isinstance(part, ast.Name)}
            if names & aliases:
                found.append(f"line {node.lineno}: except {ast.unparse(node.type)}")
    return found


def test_the_package_is_read_whole() -> None:
    # A wrong path would make every rule below pass on nothing.
    names = set(_modules())
    assert {"agentrt.gate", "agentrt.store", "agentrt.store._store", "agentrt.mcp._load"} <= names
    assert len(names) > 80


def test_no_sql_outside_the_store_and_its_extensions() -> None:
    found = [
        f"{name} {finding}"
        for name, (_, tree) in _modules().items()
        if not _in_store(name) and name not in EXTENSIONS
        for finding in sql_in(tree)
    ]
    assert found == []


def test_the_store_imports_nothing_above_it() -> None:
    store = {name for name in _modules() if _in_store(name)}
    reached = _reached(store)
    above = {
        f"{name} (imported by {importer})"
        for name, importer in reached.items()
        if not _in_store(name) and name not in LEAVES
    }
    assert above == set()
    assert set(reached) - store <= LEAVES


def test_mcp_does_not_import_the_gate() -> None:
    mcp = {name for name in _modules() if name.startswith("agentrt.mcp")}
    reached = _reached(mcp)
    gate = {
        f"{name} (imported by {importer})"
        for name, importer in reached.items()
        if name == "agentrt.gate" or name.startswith("agentrt.gate.")
    }
    assert gate == set()


def test_nothing_above_the_store_catches_a_driver_error() -> None:
    found = [
        f"{name} {finding}"
        for name, (_, tree) in _modules().items()
        if not _in_store(name)
        for finding in driver_errors_caught(tree)
    ]
    assert found == []


_SQL_VIOLATIONS = [
    'connection.execute("SELECT 1")',
    'QUERY = "SELECT * FROM runs WHERE run_id = ?"',
    'sql = "UPDATE runs SET status = ?" + where',
    'sql = f"DELETE FROM {table} WHERE run_id = ?"',
    "cursor.executemany(statement, rows)",
    'PLAN = "BEGIN IMMEDIATE"',
]
_NOT_SQL = [
    '"""The run is recorded; see BEGIN IMMEDIATE in the store."""',
    'message = "select the run to update, then delete it from the list"',
    'label = "Select from these:"',
    'METHODS = ("GET", "POST", "DELETE")',
]
_CATCHES = [
    "import sqlite3\ntry:\n    pass\nexcept sqlite3.Error:\n    pass",
    "import sqlite3 as db\ntry:\n    pass\nexcept (ValueError, db.OperationalError):\n    pass",
    "from psycopg.errors import UniqueViolation\ntry:\n    pass\nexcept UniqueViolation:\n    pass",
    "import psycopg.errors\ntry:\n    pass\nexcept psycopg.errors.LockNotAvailable:\n    pass",
]


@pytest.mark.parametrize("source", _SQL_VIOLATIONS)
def test_the_sql_check_finds_sql(source: str) -> None:
    assert sql_in(ast.parse(source)) != []


@pytest.mark.parametrize("source", _NOT_SQL)
def test_the_sql_check_passes_prose(source: str) -> None:
    assert sql_in(ast.parse(source)) == []


@pytest.mark.parametrize("source", _CATCHES)
def test_the_catch_check_finds_a_driver_error(source: str) -> None:
    assert driver_errors_caught(ast.parse(source)) != []


def test_the_catch_check_passes_the_stores_errors() -> None:
    source = "from .store import DATABASE_ERRORS\ntry:\n    pass\nexcept DATABASE_ERRORS:\n    pass"
    assert driver_errors_caught(ast.parse(source)) == []


def test_the_import_check_resolves_relative_imports() -> None:
    source = "from .. import gate\nfrom ..canonical import sha256_hex\nfrom ._records import Event"
    imported = imports_of("agentrt.store._chain", ast.parse(source), is_package=False)
    assert imported == {
        "agentrt", "agentrt.gate", "agentrt.canonical", "agentrt.store._records",
    }  # fmt: skip
