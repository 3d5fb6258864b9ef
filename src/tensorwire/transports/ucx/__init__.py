"""``ucx://host:port``: one UCX endpoint per client (ucxx), messages back to back on its stream.

UCX picks the fastest way between two processes that the URL allows: TCP, and shared memory
between processes of one host (``?ucx_tls=`` and ``?ucx_net_devices=``, default
``tcp,sm,self`` on ``lo``: see :mod:`.settings`). The session (``docs/session.md``) maps onto
the endpoint's byte stream as on ``tcp://``: the client's first message is its hello, the hub
answers welcome (or refuse and closes), then both send data, and bye before closing. A
tensor is received in place (:mod:`.pipe`). UCX encrypts nothing: with ``auth=`` keys the
session key seals every byte after the welcome in the tcp transport's AEAD records
(:mod:`.records`). Needs ``pip install 'tensorwire[ucx]'`` (``docs/transports/ucx.md``).
"""
