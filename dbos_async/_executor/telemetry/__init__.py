"""Telemetry: what workflow runs and step attempts report, as log records (``logs``) and
OpenTelemetry spans (``tracing``), through the hooks around each (``observe``). The metrics
they record are :mod:`dbos_async._metrics`, below the system database that records into it
too."""
