"""The no-database tier (``make test-fast``): which tests it takes, and that a test in it
which reaches for a server fails instead of waiting on PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parent / "conftest.py"


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A suite with this one's conftest, run as ``make test-fast`` runs it."""
    monkeypatch.setenv("DBOS_TEST_NO_DATABASE", "1")
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n"
                     "markers =\n    nodb: needs no database\n")
    return pytester


def test_the_tier_takes_the_tests_that_ask_for_no_server(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_mixed="""
        def test_pure():
            assert 1 + 1 == 2

        def test_with_a_database(database_url):
            pass
    """)
    result = suite.runpytest("-p", "no:randomly", "-p", "no:xdist", "-m", "nodb")
    result.assert_outcomes(passed=1, deselected=1)


def test_a_server_fixture_reached_in_the_tier_fails_the_test(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_sneaky="""
        def test_reaches_for_a_database(request):
            request.getfixturevalue("database_url")
    """)
    result = suite.runpytest("-p", "no:randomly", "-p", "no:xdist", "-m", "nodb")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*database fixture 'dbos_postgres' was requested*"])
