"""Faults of a Citus cluster's nodes under a sharded system database: a shard moved to
another worker, or split in two across the workers, while its keys' workflows run, and a
worker node stopped (or killed) and started again while workflows run over keys on both
workers.

Each test has a private cluster (:class:`tests.helpers.citus_cluster.CitusCluster`: a
coordinator and two workers), since it stops and moves what other tests would use. The
executor and the clients are given the coordinator's URL; nothing here depends on which node
runs a statement, so the checks hold as well for an executor that sends each key's
statements to the worker holding it. Every step body counts its runs, so a step that ran
again after its checkpoint is seen; the tests wait on recorded state (checkpoints, step
bodies reached), never on time.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from helpers import fetch, new_dbos, wait_until

from dbos_async import (
    DBOS,
    DatabaseUnavailableError,
    DBOSClient,
    SetShardKey,
    SetWorkflowID,
    migrate,
)
from dbos_async._sysdb.citus_shards import hash_text
from dbos_async._sysdb.writes import routed as routed_writes
from tests.helpers.citus_cluster import CitusCluster

pytestmark = [pytest.mark.chaos, pytest.mark.citus]

RETRY_TIMEOUT = 1.0
TICK_SECONDS = 0.05
TICKS_AFTER = 3

CHECKPOINTS = ("SELECT workflow_uuid, count(*) AS steps FROM dbos.operation_outputs "
               "GROUP BY workflow_uuid")
CHECKPOINTS_UNDER_KEY = ("SELECT workflow_uuid, count(*) AS steps FROM dbos.operation_outputs "
                         "WHERE shard_key = $1 GROUP BY workflow_uuid")
STATUSES = ("SELECT ws.shard_key, ws.workflow_uuid, ws.status, wo.output "
            "FROM dbos.workflow_status ws "
            "LEFT JOIN dbos.workflow_output wo USING (shard_key, workflow_uuid)")
MOVE_SHARD = ("SELECT citus_move_shard_placement($1, '127.0.0.1', $2, '127.0.0.1', $3, "
              "shard_transfer_mode => $4::citus.shard_transfer_mode)")
SHARD_INTERVAL = ("SELECT shardminvalue::integer AS min_hash, shardmaxvalue::integer AS max_hash "
                  "FROM pg_dist_shard WHERE shardid = $1")
NODE_IDS = ("SELECT array_agg(nodeid ORDER BY array_position($1::integer[], nodeport)) "
            "FROM pg_dist_node WHERE nodeport = ANY($1::integer[])")
SPLIT_SHARD = ("SELECT citus_split_shard_by_split_points($1, ARRAY[$2::text], $3::integer[], "
               "shard_transfer_mode => $4::citus.shard_transfer_mode)")


async def checkpoints(url: str) -> Counter[str]:
    """How many steps each workflow has checkpointed, by workflow ID."""
    return Counter({r["workflow_uuid"]: r["steps"] for r in await fetch(url, CHECKPOINTS)})


async def checkpoints_under(url: str, keys: list[str]) -> Counter[str]:
    """:func:`checkpoints` of the workflows under ``keys``, a statement per key: each reads
    only its key's shard, so it answers while other nodes are down."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        found: Counter[str] = Counter()
        for key in keys:
            found.update({r["workflow_uuid"]: r["steps"]
                          for r in await conn.fetch(CHECKPOINTS_UNDER_KEY, key)})
        return found
    finally:
        await conn.close()


async def final_states(url: str) -> dict[str, tuple[str, Any]]:
    """Each workflow's status and stored output, by workflow ID."""
    return {r["workflow_uuid"]: (r["status"], r["output"]) for r in await fetch(url, STATUSES)}


async def keys_by_worker(cluster: CitusCluster, per_worker: int) -> dict[int, list[str]]:
    """``per_worker`` keys held by each worker node."""
    found: dict[int, list[str]] = {number: [] for number in cluster.workers}
    candidate = 0
    while any(len(keys) < per_worker for keys in found.values()):
        key = f"tenant-{candidate}"
        node = found[await cluster.node_of(key)]
        if len(node) < per_worker:
            node.append(key)
        candidate += 1
    return found


class Tickers:
    """Workflows that take steps (ticks) until told that the fault is over, then
    :data:`TICKS_AFTER` more: their steps are checkpointed before, during and after it.
    Whether it is over is each tick's recorded output, so a replay would take the same ticks;
    a tick's body counts its runs."""

    def __init__(self, dbos: DBOS) -> None:
        self.over = asyncio.Event()
        self.runs: Counter[tuple[str, int]] = Counter()

        @dbos.step(name="tick")
        async def tick(workflow_id: str, n: int) -> bool:
            self.runs[workflow_id, n] += 1
            await asyncio.sleep(TICK_SECONDS)  # a step's work: keeps the load moderate
            return self.over.is_set()

        @dbos.workflow(name="ticker")
        async def ticker(workflow_id: str) -> int:
            ticks = after = 0
            while after < TICKS_AFTER:
                if await tick(workflow_id, ticks):
                    after += 1
                ticks += 1
            return ticks

        self.ticker = ticker

    async def start(self, dbos: DBOS, keys: list[str]) -> dict[str, Any]:
        """A ticker under each key, ``ticker-<key>``: their handles by workflow ID."""
        handles = {}
        for key in keys:
            with SetShardKey(key), SetWorkflowID(f"ticker-{key}"):
                handles[f"ticker-{key}"] = await dbos.start_workflow(self.ticker,
                                                                     f"ticker-{key}")
        return handles

    def check(self, results: dict[str, int], recorded: Counter[str]) -> None:
        """Each ticker's result counts its ticks, every one checkpointed once and run
        once: no step ran again after its checkpoint, none was lost."""
        assert results == {workflow_id: recorded[workflow_id] for workflow_id in results}
        assert {run: count for run, count in self.runs.items() if count != 1} == {}
        assert sorted(self.runs) == sorted((workflow_id, n) for workflow_id in results
                                           for n in range(results[workflow_id]))


# ---- A shard moved while its keys' workflows run ----


@pytest.mark.parametrize("mode", ["force_logical", "block_writes"])
async def test_a_shard_moved_under_load_loses_and_repeats_nothing(
        citus_cluster: CitusCluster, mode: str, chaos_figures: Counter[str]) -> None:
    """A ticker under each of 16 keys; once every one has checkpointed steps, the shard
    holding the most keys moves to the other worker (Citus moves its co-located shards of
    every per-workflow table with it), by logical replication or blocking writes. Every
    workflow ends SUCCESS with its result equal to the steps it checkpointed, each step body
    ran once, the moved keys took steps before and after the move, and the other keys
    went on during it."""
    cluster = citus_cluster
    url = cluster.url()
    await migrate(url, sharding=True)  # the tables distributed: the keys' shards known
    keys = [f"tenant-{i}" for i in range(16)]
    shard_of = {key: await cluster.shard_of(key) for key in keys}
    node_of = {key: await cluster.node_of(key) for key in keys}
    # The shard holding the most keys moves to the other worker.
    shard, _ = Counter(shard_of.values()).most_common(1)[0]
    moving = [key for key in keys if shard_of[key] == shard]
    staying = [key for key in keys if shard_of[key] != shard]
    source = node_of[moving[0]]
    [target] = [number for number in cluster.workers if number != source]
    assert len(moving) >= 2 and staying

    dbos = new_dbos(url, sharding=True)
    app = Tickers(dbos)
    async with dbos:
        handles = await app.start(dbos, keys)

        async def every_key_ticking() -> bool:
            done = await checkpoints(url)
            return all(done[f"ticker-{key}"] >= 2 for key in keys)

        await wait_until(every_key_ticking, patience=60, what="every key's ticker to tick")
        before = await checkpoints(url)
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(MOVE_SHARD, shard, cluster.nodes[source].port,
                               cluster.nodes[target].port, mode)
        finally:
            await conn.close()
        after = await checkpoints(url)
        app.over.set()
        results = {wf: await asyncio.wait_for(handle.get_result(), 60)
                   for wf, handle in handles.items()}
        statuses = {wf: (await handle.get_status()).status for wf, handle in handles.items()}

    # The moved keys are placed on the other worker now; the others stayed where they were.
    assert {key: await cluster.node_of(key) for key in keys} == {
        key: target if key in moving else node_of[key] for key in keys}
    final = await checkpoints(url)
    states = await final_states(url)
    assert statuses == dict.fromkeys(handles, "SUCCESS")
    assert {wf: status for wf, (status, _) in states.items()} == dict.fromkeys(handles,
                                                                               "SUCCESS")
    app.check(results, final)  # on the moved keys as on the others
    # The move happened mid-workflow: the moved keys had checkpointed steps before it and
    # took more after it. Under logical replication their writes also went on during the copy;
    # the other shards' keys were never held up (they went on during the move either way).
    moved = [f"ticker-{key}" for key in moving]
    others = [f"ticker-{key}" for key in staying]
    assert all(before[wf] >= 2 and final[wf] > after[wf] for wf in moved)
    if mode == "force_logical":
        assert sum(after[wf] - before[wf] for wf in moved) > 0
    assert sum(after[wf] - before[wf] for wf in others) > 0
    chaos_figures["workflows_checked"] += len(keys)
    chaos_figures["steps_rerun_after_checkpoint"] += sum(c - 1 for c in app.runs.values())


# ---- A shard split in two while its keys' workflows run ----


async def test_a_shard_split_under_load_loses_and_repeats_nothing(
        citus_cluster: CitusCluster, chaos_figures: Counter[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A ticker under each of 16 keys, and of more keys of the shard holding the most of
    them until each half of its hash interval has two; once every one has checkpointed
    steps, that shard is split in two at its interval's midpoint (Citus splits its
    co-located shards of every per-workflow table with it, under new shard IDs), the lower
    half staying on its worker and the upper half going to the other one, blocking writes
    to it during the copy (``block_writes``). The executor's map names the old shard until
    a write is refused for it. A second executor, idle during the split, has a gated chain
    under a key of each half waiting at its gate: its next checkpoints go by its map of
    before the split, naming the old shard. Every workflow ends SUCCESS with its result
    equal to the steps it checkpointed, each step body ran once, the split keys took steps
    before and after the split, and the other shards' keys went on during it, where they
    were."""
    # The maps are read again only when a write is refused, not for their age.
    monkeypatch.setattr(routed_writes, "SHARD_MAP_MAX_AGE", 3600.0)
    cluster = citus_cluster
    url = cluster.url()
    await migrate(url, sharding=True)  # the tables distributed: the keys' shards known
    keys = [f"tenant-{i}" for i in range(16)]
    shard_of = {key: await cluster.shard_of(key) for key in keys}
    shard, _ = Counter(shard_of.values()).most_common(1)[0]
    conn = await asyncpg.connect(url)
    try:
        interval = await conn.fetchrow(SHARD_INTERVAL, shard)
    finally:
        await conn.close()
    split = (interval["min_hash"] + interval["max_hash"]) // 2
    low = [key for key in keys if shard_of[key] == shard and hash_text(key) <= split]
    high = [key for key in keys if shard_of[key] == shard and hash_text(key) > split]
    candidate = len(keys)
    while len(low) < 2 or len(high) < 2:  # two keys in each half at least
        key = f"tenant-{candidate}"
        candidate += 1
        if interval["min_hash"] <= hash_text(key) <= interval["max_hash"]:
            half = low if hash_text(key) <= split else high
            if len(half) < 2:
                half.append(key)
                keys.append(key)
    assert {key for key in keys if await cluster.shard_of(key) == shard} == {*low, *high}
    staying = [key for key in keys if key not in (*low, *high)]
    node_of = {key: await cluster.node_of(key) for key in keys}
    source = node_of[low[0]]
    [target] = [number for number in cluster.workers if number != source]
    assert staying

    dbos = new_dbos(url, sharding=True)
    app = Tickers(dbos)
    idle = new_dbos(url, sharding=True, executor_id="idle")
    gated = Gated(idle)
    async with dbos, idle:
        handles = await app.start(dbos, keys)
        chains = {}
        for key in (low[0], high[0]):
            with SetShardKey(key), SetWorkflowID(f"chain-{key}"):
                chains[f"chain-{key}"] = await idle.start_workflow(gated.chain, f"chain-{key}")

        async def every_key_busy() -> bool:
            done = await checkpoints(url)
            return (all(done[f"ticker-{key}"] >= 2 for key in keys)
                    and len(gated.at_gate) == len(chains))

        await wait_until(every_key_busy, patience=60,
                         what="every key's ticker to tick and the chains at their gate")
        before = await checkpoints(url)
        conn = await asyncpg.connect(url)
        try:
            node_ids = await conn.fetchval(NODE_IDS, [cluster.nodes[source].port,
                                                      cluster.nodes[target].port])
            await conn.execute(SPLIT_SHARD, shard, str(split), node_ids, "block_writes")
        finally:
            await conn.close()
        after = await checkpoints(url)
        gated.gate.set()
        app.over.set()
        results = {wf: await asyncio.wait_for(handle.get_result(), 60)
                   for wf, handle in handles.items()}
        statuses = {wf: (await handle.get_status()).status for wf, handle in handles.items()}
        chained = {wf: await asyncio.wait_for(handle.get_result(), 60)
                   for wf, handle in chains.items()}

    # The lower half's keys stayed on the worker, the upper half's went to the other one,
    # each under a new shard; the other keys stayed in their shards, where they were.
    new_shards = {key: await cluster.shard_of(key) for key in keys}
    assert {new_shards[key] for key in low} & {new_shards[key] for key in high} == set()
    assert shard not in {new_shards[key] for key in (*low, *high)}
    assert {key: new_shards[key] for key in staying} == {key: shard_of[key] for key in staying}
    assert {key: await cluster.node_of(key) for key in keys} == {
        key: target if key in high else node_of[key] for key in keys}
    final = await checkpoints(url)
    states = await final_states(url)
    assert statuses == dict.fromkeys(handles, "SUCCESS")
    assert {wf: status for wf, (status, _) in states.items()} == dict.fromkeys(
        [*handles, *chains], "SUCCESS")
    app.check(results, final)  # on the split keys as on the others
    assert chained == dict.fromkeys(chains, RESULT)
    assert dict(gated.runs) == {(wf, step): 1 for wf in chains
                                for step in ("first", "gated", "last")}
    # The split happened mid-workflow: the split keys had checkpointed steps before it and
    # took more after it; the other shards' keys went on during it.
    split_workflows = [f"ticker-{key}" for key in (*low, *high)]
    others = [f"ticker-{key}" for key in staying]
    assert all(before[wf] >= 2 and final[wf] > after[wf] for wf in split_workflows)
    assert sum(after[wf] - before[wf] for wf in others) > 0
    chaos_figures["workflows_checked"] += len(keys) + len(chains)
    chaos_figures["steps_rerun_after_checkpoint"] += sum(
        c - 1 for c in (*app.runs.values(), *gated.runs.values()))


# ---- A worker node stopped, or killed, and started again ----

class Gated:
    """Workflows of three steps whose middle one waits at a gate, opened once the worker
    node is down: the middle step's checkpoint is written during the outage. Every step
    body counts its runs."""

    def __init__(self, dbos: DBOS) -> None:
        self.gate = asyncio.Event()
        self.runs: Counter[tuple[str, str]] = Counter()
        self.at_gate: set[str] = set()

        @dbos.step(name="first")
        async def first(workflow_id: str) -> int:
            self.runs[workflow_id, "first"] += 1
            return 1

        @dbos.step(name="gated")
        async def gated(workflow_id: str) -> int:
            self.runs[workflow_id, "gated"] += 1
            self.at_gate.add(workflow_id)
            await self.gate.wait()
            return 2

        @dbos.step(name="last")
        async def last(workflow_id: str) -> int:
            self.runs[workflow_id, "last"] += 1
            return 3

        @dbos.workflow(name="gated_chain")
        async def chain(workflow_id: str) -> list[int]:
            return [await first(workflow_id), await gated(workflow_id), await last(workflow_id)]

        self.chain = chain


RESULT = [1, 2, 3]


@pytest.mark.parametrize("fault", ["stop", "kill"])
async def test_a_worker_node_down_pauses_its_keys_only(
        citus_cluster: CitusCluster, fault: str, chaos_figures: Counter[str]) -> None:
    """Three keys on each worker, each with a gated chain and a ticker; once every chain
    waits at its gate and every ticker ticks, one worker is stopped (``pg_ctl stop -m
    fast``) or killed (SIGKILL of its postmaster) and the gates open. While it is down the
    other worker's keys go on (tickers tick, chains finish, new workflows run through), the
    down worker's workflows wait at their next write (an in-process handle waits with them),
    and callers outside workflows touching its keys get ``DatabaseUnavailableError`` naming
    it. Once it is back everything finishes SUCCESS, no step body ran twice, and every
    ticker's result equals the steps it checkpointed."""
    cluster = citus_cluster
    url = cluster.url()
    await migrate(url, sharding=True)  # the tables distributed: the keys' nodes known
    keys = await keys_by_worker(cluster, per_worker=3)
    down, up = cluster.workers
    down_port = cluster.nodes[down].port

    dbos = new_dbos(url, sharding=True, db_retry_timeout=RETRY_TIMEOUT, connect_timeout=2.0)
    app = Gated(dbos)
    tickers = Tickers(dbos)  # busy on every key when the node goes down
    client = DBOSClient(system_database_url=url, sharding=True,
                        db_retry_timeout=RETRY_TIMEOUT, connect_timeout=2.0)
    async with dbos, client:
        handles = {}
        for key in (*keys[down], *keys[up]):
            with SetShardKey(key), SetWorkflowID(f"chain-{key}"):
                handles[key] = await dbos.start_workflow(app.chain, f"chain-{key}")
        ticking = await tickers.start(dbos, [*keys[down], *keys[up]])
        watched = await client.retrieve_workflow(f"chain-{keys[down][0]}",
                                                 shard_key=keys[down][0])

        async def all_busy() -> bool:
            ticked = await checkpoints(url)
            return len(app.at_gate) == len(handles) and all(ticked[wf] >= 2 for wf in ticking)

        await wait_until(all_busy, patience=60,
                         what="every workflow at its gate and every ticker ticking")
        if fault == "stop":
            cluster.stop_worker(down)
        else:
            cluster.kill_worker(down)
        chaos_figures["restarts"] += 1
        app.gate.set()  # the gated steps return: their checkpoints meet the outage
        waiting = {key: asyncio.ensure_future(handles[key].get_result()) for key in keys[down]}

        # The other worker's keys go on: their tickers tick, the started workflows finish,
        # new ones run through.
        at_fault = await checkpoints_under(url, keys[up])

        async def up_keys_ticking() -> bool:
            ticked = await checkpoints_under(url, keys[up])
            return all(ticked[f"ticker-{key}"] >= at_fault[f"ticker-{key}"] + 2
                       for key in keys[up])

        await wait_until(up_keys_ticking, patience=60,
                         what="the tickers of the other worker's keys to go on")
        for key in keys[up]:
            assert await asyncio.wait_for(handles[key].get_result(), 60) == RESULT
            with SetShardKey(key), SetWorkflowID(f"during-{key}"):
                assert await asyncio.wait_for(app.chain(f"during-{key}"), 60) == RESULT
            status = await client.get_workflow_status(f"during-{key}", shard_key=key)
            assert status is not None and status.status == "SUCCESS"

        # Callers outside workflows touching the stopped worker's keys get a
        # DatabaseUnavailableError naming the node that does not answer (never a raw driver
        # error), after db_retry_timeout; so does a listing over every key.
        key = keys[down][0]
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: client.get_workflow_status(f"chain-{key}", shard_key=key),
            lambda: client.send(f"chain-{key}", "hello", "topic", shard_key=key),
            watched.get_result,
            client.list_workflows,
        ]
        for call in calls:
            with pytest.raises(DatabaseUnavailableError, match=f"127.0.0.1:{down_port}"):
                await call()
            chaos_figures["documented_errors"] += 1
        with pytest.raises(DatabaseUnavailableError, match=f"127.0.0.1:{down_port}"), \
                SetShardKey(key), SetWorkflowID(f"refused-{key}"):
            await dbos.start_workflow(app.chain, f"refused-{key}")
        # Another executor cannot enter meanwhile: entering writes the application version
        # to a reference table, which every node holds a copy of.
        late = new_dbos(url, sharding=True, executor_id="late", db_retry_timeout=RETRY_TIMEOUT,
                        connect_timeout=2.0)
        with pytest.raises(DatabaseUnavailableError, match=f"127.0.0.1:{down_port}"):
            async with late:
                pass
        chaos_figures["calls_under_faults"] += len(calls) + 2
        chaos_figures["documented_errors"] += 2

        # The stopped worker's workflows wait at their gated checkpoint; an in-process
        # handle waits with them.
        assert not any(task.done() for task in waiting.values())
        assert not any(app.runs[f"chain-{key}", "last"] for key in keys[down])

        cluster.start_worker(down)
        for task in waiting.values():
            assert await asyncio.wait_for(task, 60) == RESULT
        assert await watched.get_result() == RESULT  # the client's handle, once it answers
        with SetShardKey(key), SetWorkflowID(f"refused-{key}"):
            assert await app.chain(f"refused-{key}") == RESULT
        tickers.over.set()
        ticked = {wf: await asyncio.wait_for(handle.get_result(), 60)
                  for wf, handle in ticking.items()}

    # Every workflow finished, and no step body ran twice.
    states = await final_states(url)
    chains = {f"chain-{key}" for key in (*keys[down], *keys[up])}
    chains |= {f"during-{key}" for key in keys[up]} | {f"refused-{keys[down][0]}"}
    expected = chains | set(ticking)
    assert {wf: status for wf, (status, _) in states.items()} == dict.fromkeys(expected,
                                                                               "SUCCESS")
    assert {run: count for run, count in app.runs.items() if count != 1} == {}
    assert len(app.runs) == 3 * len(chains)
    tickers.check(ticked, await checkpoints(url))
    chaos_figures["workflows_checked"] += len(expected)
    chaos_figures["steps_rerun_after_checkpoint"] += sum(
        c - 1 for c in (*app.runs.values(), *tickers.runs.values()))


async def test_queued_workflows_of_a_live_workers_keys_run_while_another_is_down(
        citus_cluster: CitusCluster) -> None:
    """Queued workflows under the keys of a worker that is up are claimed and run while
    the other worker is down, as directly started ones are."""
    cluster = citus_cluster
    url = cluster.url()
    await migrate(url, sharding=True)
    keys = await keys_by_worker(cluster, per_worker=2)
    down, up = cluster.workers
    dbos = new_dbos(url, sharding=True, db_retry_timeout=RETRY_TIMEOUT, connect_timeout=2.0,
                    shutdown_grace_period=0.5)
    queue = dbos.queue("citus_outage_queue", worker_concurrency=4, polling_interval=0.2)
    app = Gated(dbos)
    app.gate.set()
    async with dbos:
        # The queue has worked under every key before the outage.
        before = []
        for key in (*keys[down], *keys[up]):
            with SetShardKey(key), SetWorkflowID(f"before-{key}"):
                before.append(await queue.enqueue(app.chain, f"before-{key}"))
        assert [await handle.get_result() for handle in before] == [RESULT] * len(before)
        cluster.stop_worker(down)
        try:
            during = []
            for key in keys[up]:
                with SetShardKey(key), SetWorkflowID(f"during-{key}"):
                    during.append(await queue.enqueue(app.chain, f"during-{key}"))
            # Claimed within a polling interval when every node answers: the bound only
            # stops the wait.
            for handle in during:
                assert await asyncio.wait_for(handle.get_result(), 10) == RESULT
        finally:
            cluster.start_worker(down)


# ---- Failover while a worker node is down ----


async def test_a_dead_executors_workflows_are_taken_over_while_a_worker_is_down(
        citus_cluster: CitusCluster) -> None:
    """An executor exits while its workflows wait at their gates under keys of both
    workers, one of which is down. A live executor's failover scan and claim read each
    node's own shards and claim key by key, so it takes over the workflows under the up
    worker's keys while the other is down, and the rest once it is back (the dead
    executor still has PENDING workflows there, which the next scan finds). Each resumes
    from its checkpoint: the first step, recorded before the exit, never runs again."""
    cluster = citus_cluster
    url = cluster.url()
    await migrate(url, sharding=True)
    keys = await keys_by_worker(cluster, per_worker=2)
    down, up = cluster.workers
    options: dict[str, Any] = {"sharding": True, "db_retry_timeout": RETRY_TIMEOUT,
                               "connect_timeout": 2.0}
    gone = new_dbos(url, executor_id="gone", shutdown_grace_period=0, **options)
    gone_app = Gated(gone)
    taker = new_dbos(url, executor_id="taker", failover_after=0.2, **options)
    taker_app = Gated(taker)
    taker_app.gate.set()
    workflow_ids = {key: f"chain-{key}" for key in (*keys[down], *keys[up])}
    async with taker:
        async with gone:
            for key, workflow_id in workflow_ids.items():
                with SetShardKey(key), SetWorkflowID(workflow_id):
                    await gone.start_workflow(gone_app.chain, workflow_id)
            await wait_until(lambda: _true(len(gone_app.at_gate) == len(workflow_ids)),
                             what="every workflow of the executor at its gate")
            cluster.stop_worker(down)
        # It exited: its workflows are PENDING under its ID, its lock free.
        try:
            for key in keys[up]:
                handle = await taker.retrieve_workflow(workflow_ids[key], shard_key=key)
                assert await asyncio.wait_for(handle.get_result(), 60) == RESULT
            assert not {taker_app.runs[workflow_ids[key], "last"] for key in keys[down]} - {0}
        finally:
            cluster.start_worker(down)
        for key in keys[down]:
            handle = await taker.retrieve_workflow(workflow_ids[key], shard_key=key)
            assert await asyncio.wait_for(handle.get_result(), 60) == RESULT
    rows = await fetch(url, "SELECT workflow_uuid, executor_id, status FROM dbos.workflow_status")
    assert {r["workflow_uuid"]: (r["executor_id"], r["status"]) for r in rows} == {
        workflow_id: ("taker", "SUCCESS") for workflow_id in workflow_ids.values()}
    assert {(w, step) for (w, step), n in gone_app.runs.items() if n} == {
        (w, step) for w in workflow_ids.values() for step in ("first", "gated")}
    assert dict(taker_app.runs) == {(w, step): 1 for w in workflow_ids.values()
                                    for step in ("gated", "last")}


async def _true(value: bool) -> bool:
    return value
