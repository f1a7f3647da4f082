"""The public surface is recorded in ``tests/public_api.txt``, so changing it is a decision.

The surface is the ``__all__`` of each public module and the public attributes (no leading
underscore) of the main public classes. A change shows as a diff of the recorded list; when it
is deliberate, rewrite the list with ``.venv/bin/python tests/test_public_api.py`` and name
the change in the release notes.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
from pathlib import Path

RECORD = Path(__file__).resolve().parent / "public_api.txt"

PUBLIC_MODULES = (
    "dbos_async",
    "dbos_async.fastapi",
    "dbos_async.aiohttp",
    "dbos_async.testing",
    "dbos_async.console",
    "dbos_async.cli",
    "dbos_async.prometheus",
)

# The classes whose attributes a user reaches most: a new public method or attribute on one
# of them is as much a change of the surface as a new name in ``__all__``.
PUBLIC_CLASSES = (
    "DBOS",
    "DBOSClient",
    "DBOSConfig",
    "Debouncer",
    "DebouncerClient",
    "Queue",
    "WorkflowHandle",
    "WorkflowStatus",
)


def _attributes(cls: type) -> set[str]:
    """The public names of a class: its members and the attributes its classes annotate."""
    names = {name for name, _ in inspect.getmembers(cls)}
    for klass in cls.__mro__:
        if klass is not object:
            names.update(inspect.get_annotations(klass))
    return {name for name in names if not name.startswith("_")}


def surface() -> list[str]:
    """One line per public name: ``module:name``, and ``module:Class.attribute``."""
    lines: list[str] = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        lines += [f"{module_name}:{name}" for name in module.__all__]
    package = importlib.import_module("dbos_async")
    for class_name in PUBLIC_CLASSES:
        cls = getattr(package, class_name)
        lines += [f"dbos_async:{class_name}.{name}" for name in _attributes(cls)]
    return sorted(lines)


def test_the_public_surface_is_the_recorded_one() -> None:
    recorded = RECORD.read_text().splitlines()
    current = surface()
    diff = "\n".join(difflib.unified_diff(recorded, current, "recorded", "current",
                                          lineterm=""))
    assert current == recorded, (
        "The public surface differs from tests/public_api.txt. If the change is deliberate, "
        "record it with `.venv/bin/python tests/test_public_api.py` and list it in the "
        f"release notes; otherwise make the new name private.\n{diff}")


def test_every_name_of_all_is_importable() -> None:
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        missing = [name for name in module.__all__ if not hasattr(module, name)]
        assert not missing, f"{module_name}.__all__ names what it lacks: {missing}"


def test_the_status_strings_are_the_dbos_packages() -> None:
    import dbos

    from dbos_async import WorkflowStatusString

    ours = {status.name: status.value for status in WorkflowStatusString}
    theirs = {status.name: status.value for status in dbos.WorkflowStatusString}
    assert ours == theirs
    assert WorkflowStatusString.SUCCESS == "SUCCESS"  # a str, comparable with stored text


if __name__ == "__main__":
    RECORD.write_text("".join(f"{line}\n" for line in surface()))
    sys.stdout.write(f"recorded {RECORD}\n")
