"""The ``dbos-async`` command line tool (see ``dbos-async --help``), built on
:class:`~dbos_async.DBOSClient`."""

from dbos_async.cli.main import cli, main

__all__ = ["cli", "main"]
