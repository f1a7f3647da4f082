"""Testing workflows: a PostgreSQL server for a test suite, a throwaway database per test
(on plain PostgreSQL or on every node of a Citus cluster), a crash in the middle of a
workflow followed by its recovery, a clock the test moves instead of waiting out durable
time; the replay check of recorded workflows against new code.

The pytest plugin (:mod:`dbos_async.testing.plugin`, loaded by pytest once the ``testing``
extra is installed) offers these as fixtures; this module offers them to other runners.
"""

from dbos_async._database_url import with_database
from dbos_async.testing.citus import (
    CitusNode,
    citus_nodes,
    create_citus_database,
    drop_citus_database,
    node_url,
)
from dbos_async.testing.clock import TestClock
from dbos_async.testing.crash import CrashSimulator
from dbos_async.testing.databases import (
    create_database,
    drop_database,
    fresh_database,
    new_database_name,
)
from dbos_async.testing.replay import read_export, replay_check
from dbos_async.testing.servers import NoServerError, PgServer, find_server, plan, run_sync

__all__ = [
    "CitusNode",
    "CrashSimulator",
    "NoServerError",
    "PgServer",
    "TestClock",
    "citus_nodes",
    "create_citus_database",
    "create_database",
    "drop_citus_database",
    "drop_database",
    "find_server",
    "fresh_database",
    "new_database_name",
    "node_url",
    "plan",
    "read_export",
    "replay_check",
    "run_sync",
    "with_database",
]
