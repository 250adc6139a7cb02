"""The RDS/TCP transport: RDS messages over TCP connections to peers (the kernel's rds_tcp), port 16385."""
