"""The workflow console: web pages to see and operate the workflows of a system database.

``dbos-async console --url ...`` serves it; :func:`console_app` mounts it into a FastAPI
or Starlette service. Needs the ``console`` extra (Starlette and Jinja2).
"""

from dbos_async._extras import needs_extra

with needs_extra("console", __name__):
    from dbos_async.console.app import console_app
    from dbos_async.console.safety import ConsoleAuth

__all__ = ["ConsoleAuth", "console_app"]
