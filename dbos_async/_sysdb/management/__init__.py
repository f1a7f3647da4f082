"""Management in the system database: operations on workflows as a whole (``operations``)
and changes of a workflow or an application in place (``admin``). Their statements are
:mod:`dbos_async._sysdb.statements.management`."""
