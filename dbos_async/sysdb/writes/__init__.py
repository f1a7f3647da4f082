"""The write path of workflows: group commit (``group_commit``: the writes of one kind from
many workflows as one statement), statement text built once per shape (``templates``), and,
on Citus, a workflow's multi-table writes as single-table programs (``routed``, whose
statements are :mod:`dbos_async.sysdb.statements.routed`)."""
