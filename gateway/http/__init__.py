"""The HTTP port: health and readiness, ``/status`` and its page, ``/metrics``
and the telemetry behind both, and the admin API."""
