"""Cron schedules: their public shape, fired times and firing one (``definition``), the
operations an executor and a client share (``operator``), and the scheduler task of each
executor (``scheduler``). The rows are :mod:`dbos_async._sysdb.schedules`."""
