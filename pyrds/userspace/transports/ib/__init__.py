"""The RDS/IB transport (the kernel's rds_rdma), work in progress: so far only its sans-IO protocol core.

- :mod:`.wire`: the fixed numbers of the wire (ports, fragment size, versions, work-request flags).
- :mod:`.privdata`: the rdma_cm connect private data (``rds_ib_connect_private``, IPv4 and IPv6) and the
  passive side's version decision.
- :mod:`.frag`: a message as send work requests (4 KiB fragments, each with the header), ACK-only frames.
- :mod:`.reasm`: receive-side reassembly of one message at a time, with the kernel's fragment checks.
- :mod:`.engine`: one connection (``IbEngine``): the above around the shared sequence/retransmit engine
  :class:`pyrds.userspace.proto.PathEngine`, plus the IB ack policy.

Nothing here touches verbs, sockets, threads or clocks; the verbs driver (pyverbs + rdma_cm) is a later step.
"""
