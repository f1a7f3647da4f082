"""How commands print: aligned tables for people, JSON for programs (``--json``)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import textwrap
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click

from dbos_async._executor.handles import WorkflowStatus
from dbos_async._executor.management.control import ApplicationVersion, WorkflowStepInfo

_CELL_WIDTH = 60  # longer values are cut in tables (never in JSON)


def timestamp(epoch_ms: int | None) -> str:
    """Epoch milliseconds as UTC time, to the second."""
    if epoch_ms is None:
        return ""
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def cell(value: Any) -> str:
    """A value in a table: text as is, anything else as compact JSON, cut to fit."""
    text = value if isinstance(value, str) else compact_json(value)
    text = " ".join(text.split())
    return text if len(text) <= _CELL_WIDTH else text[: _CELL_WIDTH - 3] + "..."


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print rows under their headers, each column as wide as its widest cell."""
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]
    for row in [headers, *rows]:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def fields(pairs: Sequence[tuple[str, Any]]) -> None:
    """Print ``name: value`` lines, values aligned (empty ones left out) and shown whole:
    a long one wraps to the terminal's width, continued under its first line."""
    shown = [(name, value if isinstance(value, str) else compact_json(value))
             for name, value in pairs if value is not None and value != ""]
    width = max(len(name) for name, _ in shown) + 1
    for name, value in shown:
        click.echo(f"{name + ':':<{width}} {wrapped(value, width + 1)}")


def wrapped(text: str, indent: int) -> str:
    """``text`` whole, each of its lines wrapped to the terminal's width less ``indent``,
    every line after the first indented by ``indent``."""
    width = max(shutil.get_terminal_size().columns - indent, 40)
    lines = [part for line in text.splitlines() or [""]
             for part in textwrap.wrap(line, width, break_on_hyphens=False) or [""]]
    return ("\n" + " " * indent).join(lines)


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


def error_json(error: BaseException | None) -> dict[str, Any] | None:
    """A recorded error as ``{"name", "message"}``: the original type's name and message."""
    if error is None:
        return None
    return {"name": getattr(error, "name", type(error).__name__),
            "message": getattr(error, "message", str(error))}


def status_json(status: WorkflowStatus) -> dict[str, Any]:
    """Every field of a workflow's status; input as ``{"args", "kwargs"}``, error as
    :func:`error_json`."""
    data = {f.name: getattr(status, f.name) for f in dataclasses.fields(status)}
    data["input"] = (None if status.input is None
                     else {"args": list(status.input.args), "kwargs": status.input.kwargs})
    data["error"] = error_json(status.error)
    return data


def step_json(step: WorkflowStepInfo) -> dict[str, Any]:
    data = {f.name: getattr(step, f.name) for f in dataclasses.fields(step)}
    data["error"] = error_json(step.error)
    return data


def version_json(version: ApplicationVersion) -> dict[str, Any]:
    return dataclasses.asdict(version)
