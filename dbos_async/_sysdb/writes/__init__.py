"""The write path of workflows: group commit (``group_commit``: the writes of one kind from
many workflows as one statement), statement text built once per shape (``templates``), what
every fenced write shares (``fenced``: the fence's verdict, a batch's statements per shard
key), and, on Citus, a workflow's multi-table writes as single-table programs (``routed``,
whose statements are :mod:`dbos_async._sysdb.statements.routed`).

The entry points are :class:`~dbos_async._sysdb.writes.group_commit.GroupCommit` (a lane's
``submit``), :class:`~dbos_async._sysdb.writes.fenced.FencedWrites` and
:class:`~dbos_async._sysdb.writes.routed.RoutedWrites` (``_routed_many``), which
:class:`~dbos_async._sysdb.database.SystemDatabase` and
:class:`~dbos_async._sysdb.messaging.MessagingOperations` build on."""
