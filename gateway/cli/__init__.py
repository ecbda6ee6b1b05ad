"""The ``polyport`` command line: its parser, the commands on the event store
and its schema, and the ones that ask a running gateway (``status``,
``connections``)."""
