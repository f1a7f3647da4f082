"""CONTRIBUTING.md's layout names every module of the package, each in its own directory's
part of the tree, so the map of the code a newcomer reads is the code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENTRY = re.compile(r"^( *)(\S+/)(\s|$)")


def tree() -> list[str]:
    """The lines of the layout's tree (the code block that begins with ``dbos_async/``)."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    return text.split("```\ndbos_async/\n", 1)[1].split("```", 1)[0].splitlines()


def directories(lines: list[str]) -> dict[str, str]:
    """Each directory of the tree (``dbos_async/_sysdb/statements``) and the text of its
    own lines: those deeper than its entry, less its subdirectories' lines."""
    own: dict[str, list[str]] = {"dbos_async": []}
    stack: list[tuple[int, str]] = [(-1, "dbos_async")]
    for line in lines:
        indent = len(line) - len(line.lstrip())
        entry = ENTRY.match(line)
        while entry and stack[-1][0] >= indent:
            stack.pop()
        if entry and not line.lstrip().startswith(("templates/", "static/")):
            path = f"{stack[-1][1]}/{entry[2].rstrip('/')}"
            stack.append((indent, path))
            own[path] = [line[indent + len(entry[2]):]]
            continue
        while len(stack) > 1 and indent <= stack[-1][0]:
            stack.pop()
        own[stack[-1][1]].append(line)
    return {path: "\n".join(text) for path, text in own.items()}


def test_every_module_is_named_in_its_directory_of_the_layout() -> None:
    named = directories(tree())
    missing = []
    for module in sorted((ROOT / "dbos_async").rglob("*.py")):
        relative = module.relative_to(ROOT)
        if module.name == "__init__.py" and module.parent != ROOT / "dbos_async":
            continue  # a package's own entry stands for it
        directory = str(relative.parent)
        if not re.search(rf"(^|[\s,;]){re.escape(module.name)}([\s,;]|$)",
                         named.get(directory, ""), re.M):
            missing.append(str(relative))
    assert not missing, f"CONTRIBUTING.md's layout does not name: {', '.join(missing)}"


def test_the_layout_parser_sees_the_directories() -> None:
    """The check above would pass vacuously on a tree it cannot read."""
    named = directories(tree())
    for directory in ["dbos_async/_executor/queues", "dbos_async/_sysdb/statements",
                      "dbos_async/_sysdb/statements/management", "dbos_async/cli",
                      "dbos_async/testing", "dbos_async/console"]:
        assert directory in named, directory
    assert "group_commit.py" in named["dbos_async/_sysdb/writes"]
    assert "group_commit.py" not in named["dbos_async/_sysdb"]
