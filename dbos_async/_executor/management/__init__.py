"""Management: operating workflows from outside them (cancel, delete, resume, fork, rewind,
listings, steps, application versions) and the maintenance jobs (retention, the global
timeout). The SQL is :mod:`dbos_async._sysdb.management`; the public methods are defined
once, on :class:`~dbos_async._executor.operator.Operator`."""
