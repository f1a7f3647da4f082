"""The optional parts of the package and what each needs: an integration imported without
its extra fails with :class:`~dbos_async.errors.MissingExtraError` naming the extra to
install, not with the bare ``ModuleNotFoundError`` of a library the user never asked for."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from dbos_async.errors import MissingExtraError

# The top-level modules each extra of pyproject.toml brings.
EXTRA_MODULES: dict[str, frozenset[str]] = {
    "fastapi": frozenset({"fastapi", "starlette"}),
    "aiohttp": frozenset({"aiohttp"}),
    "console": frozenset({"starlette", "jinja2", "uvicorn", "h11", "prometheus_client"}),
    "prometheus": frozenset({"prometheus_client"}),
}


@contextmanager
def needs_extra(extra: str, module: str) -> Iterator[None]:
    """Around the imports of ``module`` (``"dbos_async.fastapi"``): a missing library of
    ``extra`` is a MissingExtraError naming the extra; any other import error passes."""
    try:
        yield
    except ModuleNotFoundError as error:
        missing = (error.name or "").partition(".")[0]
        if missing not in EXTRA_MODULES[extra]:
            raise
        raise MissingExtraError(module, extra, missing) from error
