"""kill -9 of workers running transactions, at random points, many times over (the normal
suite runs a short version: ``tests/transactions/test_transactions_processes.py``): on the system
database and on an application database, each transaction's effect is there exactly once
and every workflow finishes with every checkpoint."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.transactions.test_transactions_processes import CYCLES, kill_cycles

pytestmark = pytest.mark.chaos


@pytest.mark.parametrize("on", ["system", "application"])
async def test_kill_nine_cycles_leave_each_transaction_once(
    database_url: str, create_database: Callable[[], Awaitable[str]], on: str, scale: int,
    chaos_figures: Counter[str], tmp_path: Path,
) -> None:
    app_url = await create_database()
    cycles = CYCLES * scale
    landed = await kill_cycles(database_url, app_url, on, tmp_path, cycles)
    chaos_figures["cycles"] += cycles
    chaos_figures["kills_mid_workflow"] += landed
