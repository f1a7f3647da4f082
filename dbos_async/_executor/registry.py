"""The workflows and steps registered with one DBOS instance."""

from __future__ import annotations

import contextlib
import hashlib
import inspect
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from dbos_async._database_url import parse_database_url
from dbos_async._executor.authentication import RequiredRoles
from dbos_async._executor.serialization import Signature, WorkflowSerializationFormat
from dbos_async._sysdb.statements.schedules import ScheduleRecord
from dbos_async._validation import check_identifier
from dbos_async.config import DBOSConfig
from dbos_async.errors import ConfigurationError, DBOSError

AsyncFunction = Callable[..., Coroutine[Any, Any, Any]]

PATCHING_VERSION = "PATCHING_ENABLED"
"""The application version of every deploy in patching mode (the ``dbos`` package's)."""


def is_method(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is defined in a class body and takes ``self``."""
    owner = fn.__qualname__.rsplit("<locals>.", 1)[-1]
    params = list(inspect.signature(fn).parameters)
    return "." in owner and bool(params) and params[0] == "self"


@dataclass(frozen=True)
class WorkflowInfo:
    name: str
    fn: AsyncFunction
    signature: Signature
    is_method: bool
    owner: object  # The DBOS instance that registered it.
    # Roles one of which its caller must hold (see RequiredRoles).
    roles: RequiredRoles = field(default_factory=RequiredRoles)
    # The format its inputs and result are written in (None: the configured one).
    serialization_type: WorkflowSerializationFormat | None = None
    # Recoveries it gets before it is dead-lettered (None: the max_recovery_attempts setting).
    max_recovery_attempts: int | None = None

    @property
    def required_roles(self) -> tuple[str, ...] | None:
        return self.roles.roles

    @property
    def class_name(self) -> str | None:
        return self.fn.__qualname__.rsplit(".", 1)[0] if self.is_method else None


INSTANCE_NAME_ATTRIBUTE = "__dbos_instance_name__"


def workflow_info_of(fn: Callable[..., Any], args: tuple[Any, ...],
                     owner: object) -> tuple[WorkflowInfo, tuple[Any, ...]]:
    """The registration of workflow ``fn`` (a decorated function or a bound workflow
    method, whose instance joins the arguments), which ``owner`` must have made."""
    if inspect.ismethod(fn):
        args = (fn.__self__, *args)
        fn = fn.__func__
    info = getattr(fn, "__dbos_workflow__", None)
    if not isinstance(info, WorkflowInfo):
        raise DBOSError(
            f"{getattr(fn, '__qualname__', fn)!r} is not a workflow: decorate it with "
            "@dbos.workflow()"
        )
    if info.owner is not owner:
        raise DBOSError(f"Workflow {info.name!r} is registered with another DBOS instance")
    return info, args


def instance_name(instance: object) -> str:
    """The name an object was registered under with ``dbos.register_instance``."""
    name = getattr(instance, INSTANCE_NAME_ATTRIBUTE, None)
    if not isinstance(name, str):
        raise DBOSError(
            f"Workflow methods of {type(instance).__qualname__} need a registered instance: "
            "call dbos.register_instance(obj, name) first"
        )
    return name


@dataclass(frozen=True)
class DataSource:
    """An application database registered with ``dbos.data_source()``: opened (and its
    schema migrated) at every entry, closed at the exit; or with a client's
    ``data_source()``: opened at its entry, never migrated."""

    name: str
    url: str
    schema: str = "dbos"
    pool_size: int = 10

    def __post_init__(self) -> None:
        check_identifier(self.name, "data source name")
        if not isinstance(self.url, str) or not self.url:
            raise DBOSError(f"Data source {self.name!r} needs a database URL")
        try:
            parse_database_url(self.url)
        except ValueError as error:
            raise ConfigurationError(f"Data source {self.name!r}: the URL {error}") from None
        if not isinstance(self.pool_size, int) or self.pool_size < 1:
            raise DBOSError(f"Data source {self.name!r}: pool_size must be >= 1")


def add_data_source(sources: dict[str, DataSource], source: DataSource) -> None:
    """Add ``source`` to an executor's or a client's data sources, by name."""
    if source.name in sources:
        raise DBOSError(f"A data source named {source.name!r} is already registered")
    sources[source.name] = source


class Registry:
    def __init__(self) -> None:
        self.workflows: dict[str, WorkflowInfo] = {}
        # Application databases, by name, and the data source each transaction names.
        self.data_sources: dict[str, DataSource] = {}
        self.transaction_sources: dict[str, str] = {}
        # The names of the transactions, shown as such where steps are listed.
        self.transactions: set[str] = set()
        # Schedules declared with @dbos.scheduled, stored at every entry.
        self.schedules: list[ScheduleRecord] = []
        self.instances: dict[tuple[str, str], object] = {}

    def add_workflow(self, info: WorkflowInfo) -> None:
        check_identifier(info.name, "workflow name")
        check_identifier(info.class_name, "workflow class name", optional=True)
        if info.name in self.workflows:
            raise DBOSError(
                f"A workflow named {info.name!r} is already registered; give one a distinct "
                "name with @dbos.workflow(name=...)"
            )
        self.workflows[info.name] = info

    def add_data_source(self, source: DataSource) -> None:
        add_data_source(self.data_sources, source)

    def check_data_sources(self) -> None:
        """Refuse to enter with a transaction naming a data source never registered."""
        for transaction, source in sorted(self.transaction_sources.items()):
            if source not in self.data_sources:
                known = ", ".join(sorted(self.data_sources)) or "none"
                raise ConfigurationError(
                    f"Transaction {transaction!r} names the data source {source!r}, which is "
                    f"not registered (registered: {known}); register it with "
                    "dbos.data_source()")

    def add_instance(self, instance: object, name: str) -> None:
        check_identifier(name, "instance name")
        key = (type(instance).__qualname__, name)
        if key in self.instances and self.instances[key] is not instance:
            raise DBOSError(f"An instance of {key[0]} named {name!r} is already registered")
        self.instances[key] = instance
        instance.__dict__[INSTANCE_NAME_ATTRIBUTE] = name

    def instance(self, class_name: str | None, config_name: str | None) -> object:
        if class_name is None or config_name is None:
            raise DBOSError("This workflow is a method but its row names no instance")
        try:
            return self.instances[(class_name, config_name)]
        except KeyError:
            raise DBOSError(
                f"No instance of {class_name} named {config_name!r} is registered; call "
                "dbos.register_instance() before entering DBOS"
            ) from None

    def version_hash(self) -> str:
        """A digest of every registered workflow's source, the default application version."""
        digest = hashlib.sha256()
        for name in sorted(self.workflows):
            digest.update(name.encode())
            with contextlib.suppress(OSError, TypeError):
                digest.update(inspect.getsource(self.workflows[name].fn).encode())
        return digest.hexdigest()[:32]


def application_version(config: DBOSConfig, registry: Registry) -> str:
    """The version an executor of this code runs as: the configured one, else in
    patching mode :data:`PATCHING_VERSION`, else a hash of its workflows' source."""
    if config.application_version:
        return config.application_version
    if config.enable_patching:
        return PATCHING_VERSION
    return registry.version_hash()
