"""A small program written against the stdlib socket module only (no pyrds): two AF_RDS sockets on
127.0.0.1. It prints one JSON object of what it observed; tests/unit/test_dropin.py runs it unmodified
under ``python -m pyrds.dropin`` and compares with what the kernel does."""

import errno
import json
import select
import socket
import sys

out = {}
a = socket.socket(socket.AF_RDS, socket.SOCK_SEQPACKET, 0)
b = socket.socket(socket.AF_RDS, socket.SOCK_SEQPACKET)
out["isinstance"] = isinstance(a, socket.socket)
a.bind(("127.0.0.1", 0))
b.bind(("127.0.0.1", 0))
out["ports_ok"] = a.getsockname()[1] >= 2 and b.getsockname()[1] >= 2

b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
out["rcvbuf"] = b.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)

try:
    a.bind(("127.0.0.1", 0))
except OSError as exc:
    out["rebind"] = errno.errorcode[exc.errno]

p = select.poll()
p.register(b, select.POLLIN)
out["poll_before"] = p.poll(0)
out["sent"] = a.sendto(b"hello rds", b.getsockname())
ready = p.poll(5000)
out["poll_after"] = [ev & (select.POLLIN | select.POLLRDNORM) for _fd, ev in ready]
data, addr = b.recvfrom(1024)
out["data"] = data.decode()
out["from_sender"] = addr == a.getsockname()

b.setblocking(False)
try:
    b.recvfrom(1024)
except BlockingIOError as exc:
    out["empty_recv"] = errno.errorcode[exc.errno]

a.sendto(b"0123456789", b.getsockname())
select.select([b], [], [], 5)
data, _flags = b.recvfrom(4)[0], None
out["truncated"] = data.decode()

try:
    a.send(b"no destination")
except OSError as exc:
    out["send_unconnected"] = errno.errorcode[exc.errno]

try:
    socket.socket(socket.AF_RDS, socket.SOCK_DGRAM)
except OSError as exc:
    out["dgram"] = errno.errorcode[exc.errno]

a.close()
b.close()
json.dump(out, sys.stdout)
