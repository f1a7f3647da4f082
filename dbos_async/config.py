"""Configuration, validated at the edge.

Values come from, in increasing precedence: defaults, a TOML configuration file (see
:func:`file_settings`), environment variables (``DBOS_`` and the field name in capitals, e.g.
``DBOS_SYSTEM_DATABASE_URL``; also the ``dbos`` package's ``DBOS__VMID`` and
``DBOS__APPVERSION``), and arguments given in code (or on the command line).
"""

from __future__ import annotations

import inspect
import json
import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import ErrorDetails

from dbos_async._database_url import parse_database_url
from dbos_async._validation import check_identifier
from dbos_async.errors import ConfigurationError

# The formats DBOS names itself; a user's serializer takes another name.
RESERVED_FORMATS = ("portable_json", "py_pickle")

OWN_CONNECT_OPTIONS = frozenset({
    "dsn", "host", "port", "user", "password", "passfile", "database", "timeout",
    "server_settings", "target_session_attrs", "connection_class", "record_class", "loop"})
"""The asyncpg.connect arguments the system database URL and the settings give, which
``connect_options`` may not override."""

_ENV_ALIASES = {"executor_id": "DBOS__VMID", "application_version": "DBOS__APPVERSION"}

CONFIG_FILE_ENV = "DBOS_CONFIG_FILE"
"""The environment variable naming the configuration file (when none is given in code)."""

_PYPROJECT = "pyproject.toml"
_TOOL_TABLE = "dbos_async"  # [tool.dbos_async] in a pyproject.toml

_MAX_TIMEOUT_SECONDS = 2_147_483.0
"""The largest PostgreSQL timeout setting, in seconds (INT_MAX milliseconds)."""

DEFAULT_EXECUTOR_ID = "local"
"""The executor ID of a process that was given none, or the first of its numbered
variants that is free (``local-2``, ...); also what a client writes into what it enqueues."""


class DBOSConfig(BaseModel):
    """Settings of one DBOS executor."""

    # No setting is infinite or NaN: each becomes a timeout or an interval.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field("dbos_async", min_length=1, description="The application's name.")
    system_database_url: str | None = Field(
        None,
        description="PostgreSQL URL of the system database; none starts an embedded server.",
    )
    schema_name: str = Field("dbos", min_length=1, max_length=63)
    pool_size: int = Field(10, ge=2, le=1000)
    executor_id: str | None = Field(
        None, min_length=1,
        description="Whose PENDING workflows this executor recovers: the first of this ID, "
        "'<id>-2', ... that no live process holds, claimed at entry; None (the default) "
        "claims 'local', 'local-2', ... (see dbos_async/_sysdb/executor_ids.py).",
    )
    application_version: str | None = Field(
        None, description="Defaults to a hash of the registered workflows' source code "
        "(with enable_patching: PATCHING_ENABLED)."
    )
    enable_patching: bool = Field(
        False,
        description="Patching mode, as the dbos package's: every deploy runs as the one "
        "application version PATCHING_ENABLED (unless application_version is set), so a "
        "new deploy recovers the last one's PENDING and ENQUEUED workflows; code changes "
        "that would change their calls go behind dbos.patch().",
    )
    version_report_interval: float = Field(
        300.0, gt=0,
        description="Seconds between the log lines counting PENDING and ENQUEUED workflows "
        "of other application versions (also logged at start when there are any).",
    )
    application_name: str | None = Field(
        None, min_length=1,
        description="Owner of this executor's workflows, steps, queues and versions when "
        "several applications share a system database; None leaves everything unscoped.",
    )
    run_migrations: bool = Field(True, description="Migrate on start; False only verifies.")
    sharding: bool = Field(
        False, description="Use the sharded system schema: every workflow lives under a "
        "shard key (see SetShardKey); on Citus its tables are distributed by that key.",
    )
    shutdown_grace_period: float = Field(
        10.0, ge=0, description="Seconds running workflows get to finish when DBOS exits."
    )
    data_dir: Path = Field(Path(".dbos"), description="Where the embedded server keeps its data.")
    connect_timeout: float = Field(10.0, gt=0)
    db_retry_timeout: float = Field(
        60.0, ge=0, description="How long transient database errors are retried."
    )
    startup_wait: float = Field(
        3.0, ge=0,
        description="Seconds a system database that refuses connections and has never "
        "answered this process is retried before entering fails: a wrong host or port "
        "fails fast. Raise it where the database starts alongside the application; once "
        "it has answered, an outage is retried for db_retry_timeout.",
    )
    result_poll_interval: float = Field(
        1.0, gt=0, description="Longest wait between polls for a remote workflow's result."
    )
    connection_name: str = Field(
        "dbos_async", description="application_name of this executor's connections."
    )
    connect_options: dict[str, Any] | None = Field(
        None,
        description="Keyword arguments of asyncpg.connect for every connection to the "
        "system database, e.g. {\"statement_cache_size\": 0} behind a transaction-mode "
        "pooler (PgBouncer); from the environment, a JSON object.",
    )
    use_listen_notify: bool = Field(
        True, description="Wake waiters with LISTEN/NOTIFY; False polls instead."
    )
    notification_coalesce_ms: float = Field(
        10.0, ge=0, description="How long outgoing notifications are batched, in milliseconds."
    )
    notification_poll_interval: float = Field(
        1.0, gt=0,
        description="Longest wait between reads for recv/get_event/read_stream when "
        "LISTEN/NOTIFY is off or its connection (on Citus, to any node) is down.",
    )
    listening_poll_interval: float = Field(
        10.0, gt=0,
        description="Longest wait between reads while LISTEN/NOTIFY is live: a safety net for "
        "writers that send no notification (raw SQL, other SDKs). recv needs none: the "
        "trigger on notifications notifies every insert.",
    )
    max_polling_queries: int | None = Field(
        None, ge=1, description="Concurrent polling reads of waiters; default pool_size // 2."
    )
    # Operating workflows (see dbos_async/_executor/cancellation.py and management/maintenance.py).
    cancellation_poll_interval: float = Field(
        1.0, gt=0,
        description="Longest wait between the cancellation watcher's status reads while "
        "steps or waits run (notifications wake it sooner).",
    )
    idle_poll_max_interval: float = Field(
        30.0, gt=0,
        description="Longest wait of the background polls that find nothing (idle queues "
        "and delayed workflows, failover scans, the cancellation watcher's reads): each "
        "empty poll doubles its wait up to this, work or a notification snaps it back. "
        "Bounds how late work from writers that send no notification is picked up.",
    )
    schedule_reread_interval: float = Field(
        30.0, gt=0,
        description="Longest wait between the scheduler's reads of the stored schedules "
        "(this executor's own changes wake it at once).",
    )
    retention_hours: float | None = Field(
        None, gt=0,
        description="Delete terminal workflows that finished this many hours ago (and the "
        "queue depth samples of those hours); None: off.",
    )
    retention_rows_threshold: int | None = Field(
        None, ge=1,
        description="Also delete terminal workflows older than this many newest workflows "
        "of the application; None: off.",
    )
    retention_batch_size: int = Field(
        1000, ge=1, description="Workflows the retention job deletes per statement."
    )
    global_timeout_hours: float | None = Field(
        None, gt=0,
        description="Cancel in-flight workflows created this many hours ago; None: off.",
    )
    maintenance_interval: float = Field(
        300.0, gt=0, description="Seconds between runs of the retention and timeout jobs."
    )

    # Safety limits on the system database (0: none; the sessions' own are off, see
    # dbos_async/_sysdb/connection.py).
    idle_transaction_timeout: float = Field(
        60.0, ge=0, le=_MAX_TIMEOUT_SECONDS,
        description="Seconds a transaction holding row locks (cancel, resume, fork, rewind, "
        "delete, queue claims) may sit idle before PostgreSQL ends its session and frees "
        "the locks (idle_in_transaction_session_timeout).",
    )
    observability_query_timeout: float = Field(
        30.0, ge=0, le=_MAX_TIMEOUT_SECONDS,
        description="Seconds an observability read (list_workflows, list_queued_workflows, "
        "list_workflow_steps, queue_depths, exports) may run (statement_timeout); over it "
        "raises QueryTimeoutError.",
    )

    max_recovery_attempts: int = Field(
        100, ge=0,
        description="Recoveries a workflow gets before it is dead-lettered "
        "(MAX_RECOVERY_ATTEMPTS_EXCEEDED).",
    )
    serializer: Any = Field(
        None,
        description="The serializer every value this process stores is written with (an "
        "object with name(), serialize(data) -> str and deserialize(text)); None: DBOS "
        "portable JSON.",
    )
    allow_pickle: bool = Field(
        False,
        description="Read values the dbos package stored as Python pickle (py_pickle). "
        "Unpickling runs code chosen by whoever can write the system database: this trusts "
        "everyone who can.",
    )
    clock: Any = Field(
        None,
        description="The clock durable time is read from (timestamps, sleeps, timeouts, "
        "delays, schedules; an object with now_ms(), wait_until(), deadline() and "
        "sleep_until(), see dbos_async/_sysdb/clock.py); None: the wall clock. Tests pass "
        "a dbos_async.testing.TestClock.",
    )
    failover_after: float | None = Field(
        5.0, gt=0, le=_MAX_TIMEOUT_SECONDS,
        description="Seconds after an executor's process is gone (its executor-ID lock "
        "freed) within which a live executor of the same application version takes over "
        "its PENDING workflows; None: off, they wait for a process with that ID.",
    )
    listen_queues: list[str] | None = Field(
        None,
        description="Queues this executor dequeues from (declared here or stored in the "
        "queues table); default: every queue declared with it.",
    )

    @field_validator("listen_queues", mode="before")
    @classmethod
    def _split_queues(cls, value: Any) -> Any:
        # From the environment: DBOS_LISTEN_QUEUES=a,b
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()]
        return value

    @field_validator("connect_options", mode="before")
    @classmethod
    def _check_connect_options(cls, value: Any) -> Any:
        if isinstance(value, str):  # DBOS_CONNECT_OPTIONS='{"statement_cache_size": 0}'
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError("connect_options must be a JSON object") from None
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ValueError(f"connect_options must be a dict of asyncpg.connect keyword "
                             f"arguments, got {type(value).__name__}")
        import asyncpg  # here: reading a configuration needs no driver otherwise

        known = set(inspect.signature(asyncpg.connect).parameters) - OWN_CONNECT_OPTIONS
        wrong = sorted(str(k) for k in value if k not in known)
        if wrong:
            raise ValueError(f"connect_options may not set {', '.join(wrong)} (the URL and "
                             f"the settings give {', '.join(sorted(OWN_CONNECT_OPTIONS))}; "
                             f"asyncpg.connect takes no other)")
        return value

    @field_validator("serializer")
    @classmethod
    def _check_serializer(cls, serializer: Any) -> Any:
        if serializer is None:
            return None
        missing = [m for m in ("name", "serialize", "deserialize")
                   if not callable(getattr(serializer, m, None))]
        if missing:
            raise ValueError(f"a serializer needs the methods name(), serialize(data) and "
                             f"deserialize(text); {type(serializer).__name__} lacks "
                             f"{', '.join(missing)}")
        name = serializer.name()
        if not isinstance(name, str) or not name:
            raise ValueError(f"a serializer's name() must be a non-empty string, got {name!r}")
        if name in RESERVED_FORMATS:
            raise ValueError(f"a serializer may not be named {name!r}: that name is DBOS's "
                             f"own format (use allow_pickle=True to read py_pickle)")
        return serializer

    @field_validator("clock")
    @classmethod
    def _check_clock(cls, clock: Any) -> Any:
        missing = [m for m in ("now_ms", "wait_until", "deadline", "sleep_until")
                   if clock is not None and not callable(getattr(clock, m, None))]
        if missing:
            raise ValueError(f"a clock needs the methods now_ms(), wait_until(), deadline() "
                             f"and sleep_until(); {type(clock).__name__} lacks "
                             f"{', '.join(missing)}")
        return clock

    # Before pydantic's own parsing, which refuses a lone surrogate without saying so.
    @field_validator("name", "executor_id", "application_version", "application_name",
                     "connection_name", mode="before")
    @classmethod
    def _check_identifier(cls, value: Any, info: ValidationInfo) -> Any:
        # Stored in indexed columns (or sent as a connection's application_name).
        check_identifier(value, info.field_name or "setting", optional=True, empty_ok=True)
        return value

    @field_validator("listen_queues")
    @classmethod
    def _check_queue_names(cls, names: list[str] | None) -> list[str] | None:
        for name in names or ():
            check_identifier(name, "queue name")
        return names

    @field_validator("system_database_url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        return normalize_database_url(url)

    @classmethod
    def load(cls, config_file: str | Path | None = None, **overrides: Any) -> DBOSConfig:
        """Defaults, then the configuration file (``config_file``, see
        :func:`file_settings`), then environment variables, then ``overrides``; bad values
        raise clearly."""
        values: dict[str, Any] = file_settings(config_file)
        for field_name in cls.model_fields:
            env = os.environ.get(f"DBOS_{field_name.upper()}")
            alias = _ENV_ALIASES.get(field_name)
            if env is None and alias is not None:
                env = os.environ.get(alias)
            if env is not None:
                values[field_name] = env
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls._validated(values)

    def updated(self, **settings: Any) -> DBOSConfig:
        """A copy with ``settings`` changed, validated like the original."""
        return self._validated({**self.model_dump(), **settings})

    @classmethod
    def _validated(cls, values: dict[str, Any]) -> DBOSConfig:
        try:
            return cls(**values)
        except ValidationError as error:
            problems = "; ".join(_problem(e) for e in error.errors())
            raise ConfigurationError(f"Invalid DBOS configuration: {problems}") from None


def _problem(error: ErrorDetails) -> str:
    """One problem of a configuration, for a message: the setting and what is wrong, in
    the words of our own check where one raised (without pydantic's "Value error, ")."""
    where = ".".join(str(part) for part in error["loc"]) or "config"
    raised = error.get("ctx", {}).get("error")
    if error["type"] != "value_error" or raised is None:
        return f"{where}: {error['msg']}"
    text = str(raised)
    return text if text.startswith(where) else f"{where}: {text}"


def file_settings(path: str | Path | None = None) -> dict[str, Any]:
    """The settings of a TOML configuration file, by :class:`DBOSConfig` field name.

    The file is ``path``, else the one ``DBOS_CONFIG_FILE`` names (either must exist), else
    ``pyproject.toml`` in the current directory when it has a ``[tool.dbos_async]`` table. A
    file with a ``[tool.dbos_async]`` table is read from that table (a ``pyproject.toml``),
    any other from its top level (a file of its own, e.g. ``dbos_async.toml``). Unknown
    names are refused with the file's name, so a misspelt setting is not silently ignored.
    """
    explicit = path if path is not None else os.environ.get(CONFIG_FILE_ENV) or None
    file = Path(explicit) if explicit is not None else Path(_PYPROJECT)
    if explicit is None and not file.is_file():
        return {}
    try:
        with file.open("rb") as stream:
            document = tomllib.load(stream)
    except OSError as error:
        raise ConfigurationError(
            f"Cannot read the configuration file {file}: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigurationError(f"The configuration file {file} is not valid TOML: "
                                 f"{error}") from None
    tool = document.get("tool")
    table = tool.get(_TOOL_TABLE) if isinstance(tool, dict) else None
    if table is None:
        if explicit is None:
            return {}  # a pyproject.toml without settings of ours
        table = document
    if not isinstance(table, dict):
        raise ConfigurationError(f"{file}: [tool.{_TOOL_TABLE}] must be a table")
    unknown = sorted(set(table) - set(DBOSConfig.model_fields))
    if unknown:
        raise ConfigurationError(f"{file}: unknown setting(s) {', '.join(unknown)} (known: "
                                 "the fields of DBOSConfig, e.g. system_database_url)")
    return dict(table)


def normalize_database_url(url: str) -> str:
    """Check a PostgreSQL URL (see :mod:`dbos_async._database_url`) and drop a SQLAlchemy
    driver suffix (``postgresql+psycopg``)."""
    try:
        return parse_database_url(url).text
    except ValueError as error:
        raise ValueError(f"system_database_url {error}") from None
