"""The WebRTC data channel baseline of ``bench transfer`` (aiortc), as the GSoC Duet work used it.

Two aiortc peers, each a process in a node of the testbed (the offering one in ``srv``, the
answering one in ``dev1``), so that ICE finds only their veth addresses; the benchmark relays
their offer and answer over its pipes to them (:mod:`.pipe`) and drives the offering peer
through its pipe; :mod:`.peer` is what runs in the two processes.
"""
