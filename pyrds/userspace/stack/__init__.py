"""The stack core (daemon side, no I/O toward peers): sockets, ports, queues, congestion, options, info
tables, and the interface transports implement (:mod:`.transport`). See docs/design.md for the rooms."""
