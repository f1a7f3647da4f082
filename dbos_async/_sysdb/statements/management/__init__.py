"""Statements of management: operating workflows and the maintenance jobs (``control``),
and changes of a workflow or an application in place (``admin``)."""
