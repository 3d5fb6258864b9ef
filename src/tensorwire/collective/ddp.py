"""A DDP comm hook that averages each gradient bucket over a tensorwire group, optionally
cast to float16 or bfloat16 on the wire (as torch's ``fp16_compress_hook`` does)::

    model = DistributedDataParallel(net)  # in a process group of backend "tensorwire"
    model.register_comm_hook(CommHookState(wire_dtype=torch.bfloat16), allreduce_hook)
"""

# No "from __future__ import annotations": DDP checks the hook's annotations as objects.
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from tensorwire.collective.torch_backend import ProcessGroupTensorwire


@dataclass
class CommHookState:
    """What :func:`allreduce_hook` does with each bucket.

    - ``process_group``: the tensorwire process group to average over (default: the
      default group, which must be of backend "tensorwire").
    - ``wire_dtype``: ``torch.float16`` or ``torch.bfloat16`` to send the bucket in (half
      the bytes; each gradient is divided by the group's size first, so the sum does not
      overflow), or None to send it as it is.
    - ``compress``: given to ``Group.allreduce(compress=...)`` as it is (such as "int8"
      or "topk"), for the codecs inside the collective: every bucket then goes round the
      ring, however small, and top-k/random-k keep each bucket's error-feedback residual
      apart; None sends the bucket uncompressed.
    """

    process_group: Any = None
    wire_dtype: torch.dtype | None = None
    compress: str | None = None

    def group(self) -> ProcessGroupTensorwire:
        """The tensorwire process group the hook runs on."""
        pg = self.process_group or dist.distributed_c10d._get_default_group()
        if not isinstance(pg, ProcessGroupTensorwire):
            raise TypeError(
                f"the process group is {pg.name()!r}: allreduce_hook runs on one of backend "
                "'tensorwire' (init_process_group('tensorwire'), or pass process_group=)"
            )
        return pg


def allreduce_hook(state: CommHookState, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """Average ``bucket``'s gradients over the group, in ``state.wire_dtype`` on the wire;
    the future holds the averaged bucket, in the gradients' own dtype."""
    pg = state.group()
    buffer = bucket.buffer()
    keywords: dict[str, Any] = {}
    if state.compress is not None:  # asked for: compressed whatever the bucket's size
        keywords = {
            "compress": state.compress,
            "algorithm": "ring",
            "key": f"ddp-bucket-{bucket.index()}",
        }
    if state.wire_dtype is None:
        return pg.submit(lambda: pg.group.allreduce(buffer, "mean", **keywords))
    wire = buffer.div(pg.group.size).to(state.wire_dtype)

    def average() -> torch.Tensor:
        pg.group.allreduce(wire, "sum", **keywords)
        return buffer.copy_(wire)

    return pg.submit(average)
