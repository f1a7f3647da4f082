"""The pytest plugin, used as a user's test suite would use it: a small project (an
application module, its pytest configuration and its tests) run by pytester in a subprocess,
where the plugin is loaded through its ``pytest11`` entry point. The inner runs use this
session's server (``DBOS_TEST_DATABASE_URL``), so they start none of their own."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

TESTING_PAGE = Path(__file__).resolve().parents[2] / "docs/guides/testing.md"

SERVICES = '''
async def charge(order_id: str, cents: int) -> str:
    raise RuntimeError("the payment API is not reachable from tests")


async def ship(order_id: str) -> str:
    raise RuntimeError("the shipping API is not reachable from tests")
'''

SHOP = '''
import services
from dbos_async import DBOS

dbos = DBOS(name="shop")
orders = dbos.queue("orders")


@dbos.step()
async def charge(order_id: str, cents: int) -> str:
    return await services.charge(order_id, cents)


@dbos.step()
async def ship(order_id: str) -> str:
    return await services.ship(order_id)


@dbos.workflow()
async def checkout(order_id: str, cents: int) -> str:
    receipt = await charge(order_id, cents)
    return f"{receipt}/{await ship(order_id)}"
'''

USER_TESTS = '''
import pytest

import services
from shop import checkout


@pytest.fixture
def fakes(monkeypatch):
    """Fake payment and shipping services that record their calls."""
    calls = []

    async def charge(order_id, cents):
        calls.append(("charge", order_id))
        return f"receipt-{order_id}"

    async def ship(order_id):
        calls.append(("ship", order_id))
        return f"parcel-{order_id}"

    monkeypatch.setattr(services, "charge", charge)
    monkeypatch.setattr(services, "ship", ship)
    return calls


async def test_checkout(dbos_executor, fakes):
    assert await checkout("o-1", 4200) == "receipt-o-1/parcel-o-1"
    [status] = await dbos_executor.list_workflows()
    assert status.status == "SUCCESS"


async def test_each_test_has_a_fresh_database(dbos_executor, dbos_database_url):
    assert await dbos_executor.list_workflows() == []
    assert dbos_executor.config.system_database_url == dbos_database_url


async def test_checkout_survives_a_crash_while_shipping(dbos_crash, fakes, monkeypatch):
    async def ship_then_crash(order_id):
        fakes.append(("ship", order_id))
        await dbos_crash.point()  # the process dies here, in the middle of shipping
        return f"parcel-{order_id}"

    monkeypatch.setattr(services, "ship", ship_then_crash)
    assert await dbos_crash.run(checkout, "o-2", 10) == "receipt-o-2/parcel-o-2"
    assert dbos_crash.crashed
    # The recorded charge did not run again; the interrupted shipping did.
    assert fakes == [("charge", "o-2"), ("ship", "o-2"), ("ship", "o-2")]


async def test_a_crash_that_never_happens_fails(dbos_crash, fakes):
    with pytest.raises(AssertionError, match="without reaching the crash point"):
        await dbos_crash.run(checkout, "o-3", 10)


async def test_enqueue_from_a_client(dbos_executor, dbos_client, fakes):
    handle = await dbos_client.enqueue("orders", "checkout", "o-4", 99)
    assert await handle.get_result() == "receipt-o-4/parcel-o-4"
'''

FACTORY_CONFTEST = '''
import pytest
from dbos_async import DBOS


@pytest.fixture
def dbos_app():
    """An application factory: a fresh DBOS for every test."""
    app = DBOS(name="factory-app")

    @app.workflow()
    async def double(x: int) -> int:
        return 2 * x

    app.double = double
    return app
'''

FACTORY_TESTS = '''
async def test_the_suites_own_app(dbos_executor):
    assert dbos_executor.config.name == "factory-app"
    assert await dbos_executor.double(21) == 42
'''

UNCONFIGURED_TESTS = '''
async def test_needs_an_app(dbos_executor):
    pass
'''


LATER = '''
from dbos_async import DBOS

dbos = DBOS(name="later")
jobs = dbos.queue("jobs")


@dbos.workflow()
async def remind(order_id: str) -> str:
    await dbos.sleep(86400)
    return f"{order_id}: reminded"
'''

CLOCK_TESTS = '''
from datetime import timedelta

from later import remind


def epoch_ms(moment):
    return int(moment.timestamp() * 1000)


async def test_a_clients_delayed_enqueue_runs_on_the_clock(dbos_executor, dbos_client,
                                                           dbos_clock):
    await dbos_clock.advance(days=10)  # ahead of the wall clock: only the test clock says now
    start = dbos_clock.now()
    handle = await dbos_client.enqueue("jobs", "remind", "o-1", delay=3600)
    await dbos_clock.wait_for_timers()
    assert dbos_clock.next_due == start + timedelta(hours=1)  # the delay, on the clock
    assert (await handle.get_status()).status == "DELAYED"
    await dbos_clock.advance(hours=1)  # it starts, and sleeps for a day
    await dbos_clock.wait_for_timers()
    assert dbos_clock.next_due == start + timedelta(days=1, hours=1)
    await dbos_clock.advance(days=1)
    assert await handle.get_result() == "o-1: reminded"
    status = await handle.get_status()
    assert status.created_at == epoch_ms(start)
    assert status.updated_at == epoch_ms(start + timedelta(days=1, hours=1))


async def test_a_sleep_cut_by_a_crash_ends_at_its_recorded_time(dbos_executor, dbos_crash,
                                                               dbos_clock):
    start = dbos_clock.now()
    handle = await dbos_executor.start_workflow(remind, "o-2")
    await dbos_clock.wait_for_timers()
    await dbos_clock.advance(hours=20)
    await dbos_crash.crash_and_recover()  # killed in its sleep, then entered again
    recovered = await dbos_executor.retrieve_workflow(handle.workflow_id)
    await dbos_clock.wait_for_timers()  # recovered, asleep on the clock again
    assert dbos_clock.next_due == start + timedelta(days=1)
    assert (await recovered.get_status()).status == "PENDING"
    await dbos_clock.advance(hours=4)
    assert await recovered.get_result() == "o-2: reminded"
    assert (await recovered.get_status()).updated_at == epoch_ms(start + timedelta(days=1))
'''


@pytest.fixture
def user_project(pytester: pytest.Pytester, admin_url: str,
                 monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A user's project on this session's test server."""
    monkeypatch.setenv("DBOS_TEST_DATABASE_URL", admin_url)
    for name in ("DBOS_SYSTEM_DATABASE_URL", "DBOS_CONFIG_FILE", "CI"):
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(services=SERVICES, shop=SHOP)
    return pytester


def test_a_users_suite_with_the_app_named_in_its_configuration(
    user_project: pytest.Pytester,
) -> None:
    user_project.makeini(textwrap.dedent("""
        [pytest]
        asyncio_mode = auto
        dbos_app = shop:dbos
    """))
    user_project.makepyfile(test_shop=USER_TESTS)
    result = user_project.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5)


def test_an_app_from_a_fixture_and_a_suite_that_names_none(
    user_project: pytest.Pytester,
) -> None:
    user_project.makeini("[pytest]\nasyncio_mode = auto\n")
    factory = user_project.mkpydir("factory")
    (factory / "conftest.py").write_text(FACTORY_CONFTEST)
    (factory / "test_factory.py").write_text(FACTORY_TESTS)
    unconfigured = user_project.mkpydir("unconfigured")
    (unconfigured / "test_unconfigured.py").write_text(UNCONFIGURED_TESTS)
    result = user_project.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*dbos_executor needs the application's DBOS: set `dbos_app"
                                 " = \"package.module:attribute\"`*"])


def readme_block(first_line: str) -> str:
    """The Python block of the testing guide that begins with ``first_line``."""
    [block] = [b for b in re.findall(r"```python[^\n]*\n(.*?)```", TESTING_PAGE.read_text(), re.S)
               if b.startswith(first_line + "\n")]
    return block


def test_the_readmes_clock_example(user_project: pytest.Pytester) -> None:
    """The testing guide's "Durable time without waiting" example, run as written there."""
    user_project.makeini(textwrap.dedent("""
        [pytest]
        asyncio_mode = auto
        dbos_app = reminders:dbos
    """))
    user_project.makepyfile(reminders=readme_block("# reminders.py"),
                            test_reminders=readme_block("# test_reminders.py"))
    result = user_project.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_the_clock_with_a_client_and_across_a_crash(user_project: pytest.Pytester) -> None:
    """``dbos_clock`` puts ``dbos_client`` on the clock too (a delayed enqueue falls due in
    the clock's terms), and ``dbos_crash``'s executor, entered again, resumes on it."""
    user_project.makeini(textwrap.dedent("""
        [pytest]
        asyncio_mode = auto
        dbos_app = later:dbos
    """))
    user_project.makepyfile(later=LATER, test_later=CLOCK_TESTS)
    result = user_project.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_the_readme_example_runs_as_written_without_warnings(
    user_project: pytest.Pytester,
) -> None:
    """The files of the testing guide's example, as they are there: the suite passes, and
    pytest (pytest-asyncio among its plugins) warns of nothing."""
    files = {}
    for block in re.findall(r"```(?:toml|python)[^\n]*\n(.*?)```", TESTING_PAGE.read_text(),
                            re.DOTALL):
        first, _, body = block.partition("\n")
        if re.fullmatch(r"# (pyproject\.toml|shop\.py|test_shop\.py)", first):
            files[first[2:]] = body
    assert sorted(files) == ["pyproject.toml", "shop.py", "test_shop.py"]
    for name, body in files.items():
        (user_project.path / name).write_text(body)
    result = user_project.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    output = result.stdout.str() + result.stderr.str()
    assert "Warning" not in output and "warnings summary" not in output, output
