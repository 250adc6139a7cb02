"""Userspace RDS/TCP stack: the sans-IO protocol core (``proto``), the stack service and its transports."""
