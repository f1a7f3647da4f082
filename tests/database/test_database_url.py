"""Reading PostgreSQL URLs (dbos_async/_database_url.py), with no database: both forms of a
list of hosts, IPv6 and socket hosts, what messages show, the rewrite to another database,
the session settings a URL may choose, and the errors for what asyncpg could not use."""

from __future__ import annotations

import pytest

from dbos_async import DBOS, ConfigurationError, DBOSClient
from dbos_async._database_url import DatabaseUrl, Host, parse_database_url, redact, with_database
from dbos_async._sysdb.connection import SESSION_SETTINGS, session_settings


def test_a_single_host_url() -> None:
    url = parse_database_url("postgresql://app:secret@db.internal:5433/shop?sslmode=require")
    assert url == DatabaseUrl(
        text="postgresql://app:secret@db.internal:5433/shop?sslmode=require",
        user="app", password="secret", hosts=(Host("db.internal", 5433),), database="shop",
        options={"sslmode": "require"})
    assert url.describe() == "'shop' at db.internal:5433 as user 'app'"


def test_hosts_listed_before_the_path_each_with_its_port_or_the_default() -> None:
    url = parse_database_url("postgresql://u@h1:5432,h2:5433,h3/db?target_session_attrs=read-write")
    assert url.hosts == (Host("h1", 5432), Host("h2", 5433), Host("h3", 5432))
    assert url.options == {"target_session_attrs": "read-write"}
    assert url.describe() == "'db' at h1:5432, h2:5433, h3:5432 as user 'u'"


def test_hosts_listed_in_the_query() -> None:
    url = parse_database_url("postgresql://u@/db?host=h1,h2&port=5432,5433")
    assert url.hosts == (Host("h1", 5432), Host("h2", 5433))
    assert url.describe() == "'db' at h1:5432, h2:5433 as user 'u'"
    # One port applies to every host; a host may carry its own when port= is absent.
    assert parse_database_url("postgresql://u@/db?host=h1,h2&port=6000").hosts == (
        Host("h1", 6000), Host("h2", 6000))
    assert parse_database_url("postgresql://u@/db?host=h1:6001,h2").hosts == (
        Host("h1", 6001), Host("h2", 5432))
    # User, password and database may be query options too.
    url = parse_database_url("postgresql://?host=h&user=app&password=pw&dbname=shop")
    assert (url.user, url.password, url.database) == ("app", "pw", "shop")
    assert url.options == {}


def test_ipv6_hosts_in_brackets() -> None:
    url = parse_database_url("postgresql://u@[::1]:5433,[fe80::2]/db")
    assert url.hosts == (Host("::1", 5433), Host("fe80::2", 5432))
    assert url.describe() == "'db' at [::1]:5433, [fe80::2]:5432 as user 'u'"
    assert parse_database_url("postgresql://u@/db?host=h1,[::1]&port=1,2").hosts == (
        Host("h1", 1), Host("::1", 2))


def test_unix_socket_directories() -> None:
    in_query = parse_database_url("postgresql://u@/db?host=/var/run/postgresql&port=5433")
    assert in_query.hosts == (Host("/var/run/postgresql", 5433),)
    assert in_query.hosts[0].is_socket
    assert in_query.describe() == "'db' at /var/run/postgresql/.s.PGSQL.5433 as user 'u'"
    encoded = parse_database_url("postgresql://u@%2Fvar%2Frun%2Fpostgresql/db")
    assert encoded.hosts == (Host("/var/run/postgresql", 5432),)
    # A socket and a TCP host in one list.
    mixed = parse_database_url("postgresql://u@/db?host=/tmp,127.0.0.1&port=5432,5433")
    assert mixed.describe() == "'db' at /tmp/.s.PGSQL.5432, 127.0.0.1:5433 as user 'u'"


def test_the_database_defaults_as_the_server_chooses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGDATABASE", raising=False)
    assert parse_database_url("postgresql://app@h").database_name == "app"
    assert parse_database_url("postgresql://app@h/").database_name == "app"
    assert parse_database_url("postgresql://app@h/%22odd%20name%22").database_name == (
        '"odd name"')
    monkeypatch.setenv("PGDATABASE", "from_env")
    assert parse_database_url("postgresql://app@h").database_name == "from_env"


def test_a_sqlalchemy_driver_suffix_is_dropped() -> None:
    assert parse_database_url("postgresql+asyncpg://u@h1,h2/db").text == (
        "postgresql://u@h1,h2/db")
    assert parse_database_url("  postgres://u@h/db ").text == "postgres://u@h/db"


def test_the_password_is_masked_wherever_it_is_given() -> None:
    assert redact("postgresql://app:s3cret@h1:5432,h2:5433/db?target_session_attrs=read-write") \
        == "postgresql://app:***@h1:5432,h2:5433/db?target_session_attrs=read-write"
    assert redact("postgresql://app@/db?host=h1,h2&password=s3cret&port=1,2") == (
        "postgresql://app@/db?host=h1,h2&password=***&port=1,2")
    assert redact("postgresql://app@h/db") == "postgresql://app@h/db"
    assert "s3cret" not in redact("mysql://app:s3cret@h/db")


def test_another_database_on_the_same_servers() -> None:
    assert with_database("postgresql://u:p@h1:1,h2:2/app?target_session_attrs=read-write",
                         "postgres") == (
        "postgresql://u:p@h1:1,h2:2/postgres?target_session_attrs=read-write")
    rewritten = with_database("postgresql://u@/app?host=h1,h2&port=1,2&dbname=app", "postgres")
    assert rewritten == "postgresql://u@/postgres?host=h1,h2&port=1,2"
    assert parse_database_url(rewritten).hosts == (Host("h1", 1), Host("h2", 2))
    assert parse_database_url(with_database("postgresql://u@h/app", "a b/c")).database == (
        "a b/c")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("mysql://u@h/db", "scheme 'mysql'"),
        ("localhost:5432/db", "must be a postgresql:// URL"),
        ("postgresql://u@h1:5432,h2:port/db", "invalid port 'port'"),
        ("postgresql://u@h:70000/db", "invalid port '70000'"),
        ("postgresql://u@h:0/db", "port 0"),
        ("postgresql://u@/db", "names no host"),
        ("postgresql://u@/db?port=5432", "names no host"),
        ("postgresql://u@h1,,h2/db", "empty host"),
        ("postgresql://u@h/db?host=other", "both before the path and in the query"),
        ("postgresql://u@/db?host=h1,h2,h3&port=1,2", "2 ports for 3 hosts"),
        ("postgresql://u@/db?host=h1:1&port=2", "ports both in host= and in port="),
        ("postgresql://u@/db?host=::1", "without brackets: write [::1]"),
        ("postgresql://u@[::1/db", "not a valid URL"),
        ("postgresql://u@/db?host=[::1&port=1", "malformed IPv6 host"),
        ("postgresql://a:b@c@h/db", "percent-encode it as %40"),
        ("postgresql://u@h/db?sslmode", "malformed query"),
        ("postgresql://u@h/db?target_session_attrs=primary-only", "target_session_attrs"),
    ],
)
def test_what_asyncpg_could_not_use_is_refused_with_the_problem(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match=None) as caught:
        parse_database_url(url)
    assert problem in str(caught.value)
    # Through the configuration, as a ConfigurationError naming the setting.
    with pytest.raises(ConfigurationError) as configured:
        DBOS(system_database_url=url)
    assert "system_database_url" in str(configured.value)
    assert problem in str(configured.value)


def test_executors_and_clients_accept_both_forms() -> None:
    comma = "postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write"
    query = "postgresql://u@/db?host=h1,h2&port=5432,5433&target_session_attrs=read-write"
    for url in (comma, query):
        assert DBOS(system_database_url=url).config.system_database_url == url
        assert DBOSClient(system_database_url=url).config.system_database_url == url


def test_a_url_choosing_a_session_setting_keeps_it() -> None:
    ours = session_settings(parse_database_url("postgresql://u@h/db"), "app")
    assert ours == {**SESSION_SETTINGS, "application_name": "app"}
    assert ours["statement_timeout"] == "0"
    chosen = session_settings(
        parse_database_url("postgresql://u@h/db?statement_timeout=30s&application_name=x"),
        "app")
    assert "statement_timeout" not in chosen  # asyncpg sends the URL's own
    assert chosen["lock_timeout"] == "0"
    assert chosen["application_name"] == "app"  # connection_name names our sessions
