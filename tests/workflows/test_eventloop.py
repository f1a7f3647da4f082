"""dbos_async.run: the event loop a program (and the command line, the console, the examples)
runs on: uvloop when installed unless DBOS_UVLOOP turns it off."""

from __future__ import annotations

import asyncio
import gc
import sys

import pytest
import uvloop
from helpers import new_dbos

import dbos_async
from dbos_async import ConfigurationError
from dbos_async._eventloop import DEFAULT_GC_THRESHOLD, GC_THRESHOLD_ENV, UVLOOP_ENV


def run_one_workflow(database_url: str, **options: bool) -> type:
    """Run a one-step workflow under dbos_async.run; return the type of the loop that ran
    its step."""

    async def main() -> type:
        dbos = new_dbos(database_url)

        @dbos.step()
        async def loop_type() -> str:
            return type(asyncio.get_running_loop()).__module__

        @dbos.workflow()
        async def which_loop() -> str:
            return await loop_type()

        async with dbos:
            module = await which_loop()
            assert module == type(asyncio.get_running_loop()).__module__
            return type(asyncio.get_running_loop())

    return dbos_async.run(main(), **options)


def test_uses_uvloop_when_installed(database_url: str,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(UVLOOP_ENV, raising=False)
    assert issubclass(run_one_workflow(database_url), uvloop.Loop)


@pytest.mark.parametrize("setting", ["false", "0", "off"])
def test_the_environment_opts_out(database_url: str, monkeypatch: pytest.MonkeyPatch,
                                  setting: str) -> None:
    monkeypatch.setenv(UVLOOP_ENV, setting)
    loop_type = run_one_workflow(database_url)
    assert not issubclass(loop_type, uvloop.Loop)
    assert issubclass(loop_type, asyncio.BaseEventLoop)


def test_the_argument_decides_over_the_environment(database_url: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UVLOOP_ENV, "true")
    assert not issubclass(run_one_workflow(database_url, uvloop=False), uvloop.Loop)
    monkeypatch.setenv(UVLOOP_ENV, "false")
    assert issubclass(run_one_workflow(database_url, uvloop=True), uvloop.Loop)


def test_a_setting_that_is_not_a_boolean_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UVLOOP_ENV, "sometimes")

    async def main() -> None:
        raise AssertionError("must not run")

    coroutine = main()
    with pytest.raises(ConfigurationError, match=f"{UVLOOP_ENV}.*'sometimes'"):
        dbos_async.run(coroutine)
    coroutine.close()


def test_uvloop_required_but_missing_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without uvloop importable, the default falls back to asyncio's loop, and a request
    for uvloop names the extra that brings it."""
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` now fails
    monkeypatch.delenv(UVLOOP_ENV, raising=False)

    async def loop_type() -> type:
        return type(asyncio.get_running_loop())

    assert not issubclass(dbos_async.run(loop_type()), uvloop.Loop)
    for required in ({"uvloop": True}, {}):
        if not required:
            monkeypatch.setenv(UVLOOP_ENV, "1")
        coroutine = loop_type()
        with pytest.raises(ConfigurationError, match=r"dbos_async\[speed\]"):
            dbos_async.run(coroutine, **required)
        coroutine.close()


async def _threshold() -> int:
    return gc.get_threshold()[0]


def test_run_raises_the_gc_threshold_for_the_run_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GC_THRESHOLD_ENV, raising=False)
    before = gc.get_threshold()
    assert dbos_async.run(_threshold()) == DEFAULT_GC_THRESHOLD
    assert gc.get_threshold() == before
    assert dbos_async.run(_threshold(), gc_threshold=5000) == 5000
    assert dbos_async.run(_threshold(), gc_threshold=0) == before[0]  # left alone
    monkeypatch.setenv(GC_THRESHOLD_ENV, "12345")
    assert dbos_async.run(_threshold()) == 12345
    assert dbos_async.run(_threshold(), gc_threshold=0) == before[0]  # the call decides
    assert gc.get_threshold() == before


@pytest.mark.parametrize("bad", ["lots", "1.5", "-3"])
def test_a_bad_gc_threshold_is_refused_before_anything_runs(
        monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv(GC_THRESHOLD_ENV, bad)
    before = gc.get_threshold()
    coroutine = _threshold()
    with pytest.raises(ConfigurationError, match=GC_THRESHOLD_ENV if bad != "-3" else ">= 0"):
        dbos_async.run(coroutine)
    coroutine.close()
    assert gc.get_threshold() == before
    for value in (-1, True):
        coroutine = _threshold()
        with pytest.raises(ConfigurationError, match="gc_threshold"):
            dbos_async.run(coroutine, gc_threshold=value)
        coroutine.close()
