"""Collectives: a group of ranks that exchange directly, and allreduce and friends on it.

What exists now:

- :class:`Group`, formed by a rendezvous at a tensorwire hub URL on any transport
  (:meth:`Group.join`; rank 0 or a :class:`Rendezvous` of its own serves the hub), from
  torchrun's variables (:meth:`Group.from_env`) or under ``mpirun``
  (:meth:`Group.from_mpi`: MPI's allgather and broadcast in place of a hub), with a direct
  TCP link between every two ranks (the transports' socket kit; wire-format messages, no
  pickle).
- ``allreduce`` (sum, mean, min, max), ``reduce_scatter``, ``allgather``, ``broadcast`` and
  ``barrier`` on numpy arrays and torch CPU tensors, in place or into ``out=``: ring
  (pipelined) for large tensors, recursive doubling or a binomial tree for small ones.
- Faults: every operation has a deadline; a rank that dies, hangs, or calls a different
  operation or shape makes every rank raise a typed error naming it
  (:class:`~tensorwire.errors.RankFailed`, :class:`~tensorwire.errors.CollectiveMismatch`).
  A connection without the group's token (given out at the rendezvous) is refused.
- Compression inside the allreduce (``compress=``, :class:`Compression`): fp16/bf16 and
  blockwise int8 along the ring with float32 partial sums at every hop, top-k / random-k
  with error feedback (every rank's part, summed on every rank).
- Elastic mode (``elastic=True``, :mod:`.elastic`): a rank that dies or hangs is dropped and
  the operation is done again over the ranks left; a restarted rank rejoins.

- Security (``credentials=``, :class:`GroupCredentials`): ranks enrolled like devices
  (``rank-N``: a certificate and/or a secret from ``tensorwire certs``); the rendezvous
  admits enrolled ranks only, and every link is TLS 1.3 with sealed records on which each
  rank proves which rank it is. Without credentials a connection without the group's token
  is refused, and the traffic is in the clear. Elastic groups take them too: the
  coordinator admits enrolled ranks only, and gives out link keys (fresh ones for a rank
  that rejoins) sealed under each rank's secret.

Still to come (issue #26): links over quic and ucx.

torch.distributed's backend ``"tensorwire"`` registers when
``tensorwire.collective.torch_backend`` is imported (not from here: it imports torch); its
DDP comm hook is ``tensorwire.collective.ddp.allreduce_hook``.
"""

from tensorwire.collective.compression import COMPRESSION_METHODS, Compression
from tensorwire.collective.credentials import GroupCredentials
from tensorwire.collective.group import Group
from tensorwire.collective.options import GroupOptions
from tensorwire.collective.reduce import REDUCE_OPS
from tensorwire.collective.rendezvous import Rendezvous
from tensorwire.errors import CollectiveError, CollectiveMismatch, RankFailed

__all__ = [
    "COMPRESSION_METHODS",
    "REDUCE_OPS",
    "CollectiveError",
    "CollectiveMismatch",
    "Compression",
    "Group",
    "GroupCredentials",
    "GroupOptions",
    "RankFailed",
    "Rendezvous",
]
