"""What runs inside every rank of a watched job: the start-up hook (``startup/``), the tracer's
installation and the rank's files (``inject``), the agent that answers the watch (``agent``). It
imports nothing of the controller side (``engine``, ``frontends``)."""
