"""Idempotent requests: an ``Idempotency-Key`` header names the workflow a request starts.

The key becomes the ID of the first workflow the request starts (``SetWorkflowID``), so a
retry joins that workflow and answers with its outcome instead of running it again. The
workflow also records a digest of the request that started it (method, path, query and
body) in its attributes; a request carrying a key whose workflow was started by another
request is refused with :class:`~dbos_async.errors.IdempotencyKeyConflictError`. The check
runs before the endpoint (the common case: a key reused later) and again after it, before
the response is sent: of two concurrent requests with one key and different bodies, the
one whose start lost the race only joined the winner's workflow, and must not answer with
that workflow's result.

Safe methods (GET, HEAD, OPTIONS, TRACE) ignore the header. A request with a key that
starts no workflow is not deduplicated: a retry runs the endpoint again. A start that
``SetWorkflowID`` does not reach (``DBOSClient.enqueue``) takes the key and the digest from
:func:`current_idempotent_request`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass

from dbos_async._executor.context import SetShardKey, SetWorkflowID, added_attributes
from dbos_async._executor.operator import Operator
from dbos_async.errors import IdempotencyKeyConflictError, InvalidRequestError

DEFAULT_HEADER = "Idempotency-Key"

# The workflow attribute holding the digest of the request that started the workflow.
DIGEST_ATTRIBUTE = "dbos_async.request_digest"

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})

MAX_KEY_LENGTH = 255


@dataclass(frozen=True)
class IdempotentRequest:
    """A request carrying an idempotency key: the workflow ID it starts, and its digest."""

    key: str
    digest: str
    header: str = DEFAULT_HEADER
    # On a sharded system database: the key the request's workflows run under.
    shard_key: str | None = None

    @property
    def attributes(self) -> dict[str, str]:
        """The attributes the request's workflow records (the digest)."""
        return {DIGEST_ATTRIBUTE: self.digest}

    async def check(self, operator: Operator) -> None:
        """Raise :class:`IdempotencyKeyConflictError` if the key's workflow exists and was
        not started by a request with this digest."""
        status = await operator.get_workflow_status(self.key, shard_key=self.shard_key)
        if status is None:
            return
        if (status.attributes or {}).get(DIGEST_ATTRIBUTE) != self.digest:
            raise IdempotencyKeyConflictError(self.key, self.header)

    @contextmanager
    def starting(self) -> Iterator[None]:
        """The block the endpoint runs in: its first workflow start takes the key as ID,
        and every start records the digest (and runs under the request's shard key)."""
        token = _current.set(self)
        try:
            with SetWorkflowID(self.key), added_attributes(self.attributes), \
                    self._under_shard_key():
                yield
        finally:
            _current.reset(token)


    def _under_shard_key(self) -> AbstractContextManager[object]:
        return nullcontext() if self.shard_key is None else SetShardKey(self.shard_key)


_current: ContextVar[IdempotentRequest | None] = ContextVar(
    "dbos_async_idempotent_request", default=None)


def current_idempotent_request() -> IdempotentRequest | None:
    """In an endpoint serving a request with an idempotency key, that request (its ``key``
    and ``attributes``), else None: for starts ``SetWorkflowID`` does not reach, such as
    ``client.enqueue(..., workflow_id=r.key, attributes=r.attributes)``."""
    return _current.get()


def idempotent_request(header: str, value: str | None, method: str, path: str,
                       query: str, body: bytes, shard_key_header: str | None = None,
                       shard_key: str | None = None) -> IdempotentRequest | None:
    """The idempotent request this is, or None when it carries no key or its method is
    safe. A key is 1 to 255 visible ASCII characters, bare or as a quoted string (the
    structured-field form of the IETF draft); a malformed one raises
    :class:`InvalidRequestError`. With ``shard_key_header``, ``shard_key`` is that header's
    value, which the request must carry."""
    if value is None or method.upper() in SAFE_METHODS:
        return None
    if shard_key_header is not None and not (shard_key or "").strip():
        raise InvalidRequestError(
            f"A request with {header} must also carry {shard_key_header}, the shard key "
            "of the workflow it starts")
    return IdempotentRequest(parse_key(header, value), request_digest(method, path, query, body),
                             header, shard_key.strip() if shard_key_header and shard_key
                             else None)


def parse_key(header: str, value: str) -> str:
    key = value.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if not 0 < len(key) <= MAX_KEY_LENGTH or not all("!" <= c <= "~" for c in key):
        sent = as_sent(value)
        shown = sent if len(sent) <= 40 else sent[:40] + "..."
        raise InvalidRequestError(
            f"{header} must be 1 to {MAX_KEY_LENGTH} visible ASCII characters (a UUID, say), "
            f"got {shown!r}")
    return key


def as_sent(value: str) -> str:
    """A header value as its sender most likely wrote it: servers decode header bytes as
    Latin-1, so UTF-8 text (``é``) arrives garbled (``Ã©``) unless decoded again."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value


def request_digest(method: str, path: str, query: str, body: bytes) -> str:
    """SHA-256 of the method, path, query string and body: what a retry must repeat."""
    digest = hashlib.sha256()
    for part in (method.upper().encode(), path.encode(), query.encode()):
        digest.update(len(part).to_bytes(8, "big") + part)
    digest.update(body)
    return "sha256:" + digest.hexdigest()
