"""The RDS/IB transport (the kernel's rds_rdma), work in progress: the sans-IO protocol core and its verbs
driver (not yet attached to the stack/service).

- :mod:`.wire`: the fixed numbers of the wire (ports, fragment size, versions, work-request flags).
- :mod:`.privdata`: the rdma_cm connect private data (``rds_ib_connect_private``, IPv4 and IPv6) and the
  passive side's version decision.
- :mod:`.frag`: a message as send work requests (4 KiB fragments, each with the header), ACK-only frames.
- :mod:`.reasm`: receive-side reassembly of one message at a time, with the kernel's fragment checks.
- :mod:`.engine`: one connection (``IbEngine``): the above around the shared sequence/retransmit engine
  :class:`pyrds.userspace.proto.PathEngine`, plus the IB ack policy.

Nothing above touches verbs, sockets, threads or clocks. The driver around it:

- :mod:`.verbs`: the narrow verbs interface (rdma_cm channel and id, one RC queue pair with its rings).
- :mod:`.driver`: one connection (``IbConnection``: rdma_cm active/passive setup, completions in, work
  requests out, around an ``IbEngine``) and the listener (``IbListener``), on any fd-readiness loop
  (``FdLoop``).
- :mod:`.node`: one local IPv4 address as an endpoint: an engine per peer, dial on send, redial, requests.
- :mod:`.pyverbs_backend`: :mod:`.verbs` over rdma-core's pyverbs -- the only module that imports pyverbs,
  and nothing imports it unless IB is used.
"""
