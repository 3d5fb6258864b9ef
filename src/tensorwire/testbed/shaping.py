"""How a :class:`LinkProfile` becomes queueing disciplines and nftables rules on one link end.

Each direction of a device's link is shaped where its packets leave (egress) and lose packets
where they arrive (ingress), so a sender sees a loss as a real one and retransmits:

- rate: ``tbf`` as the root qdisc of the sending veth end (``netem`` root + ``tbf`` child when
  the kernel has netem and the profile has delay, jitter or loss);
- delay, jitter: ``netem`` only; without it they are not applied and a note says so;
- loss: ``netem loss`` where available, else an nftables rule on the receiving veth end's
  ingress hook, ``meta protocol { ip, ip6 } numgen random mod 1000000 < k drop``.

A drop in the sender's own output hook would not do: the kernel reports it to the sending
socket as an error (EPERM), which TCP handles as a local failure, not as a loss.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from tensorwire.testbed.errors import ShapingUnavailable
from tensorwire.testbed.profile import LinkProfile

TBF_BURST_SECONDS = 0.004  # a burst of 4 ms at the link rate (rate / HZ at HZ=250)
TBF_MIN_BURST = 8192  # bytes; above one full frame, small enough not to distort a transfer
TBF_QUEUE_SECONDS = 0.1  # the queue holds 100 ms at the link rate, a mobile link's buffer
NETEM_MIN_LIMIT = 1000  # packets, netem's default
LOSS_SCALE = 1_000_000  # nftables numgen modulus: loss resolution of 1e-6
DIRECTIONS = ("both", "up", "down")
TOPOLOGIES = ("star", "shared", "shared-broker-near")


@dataclasses.dataclass(frozen=True)
class TbfParameters:
    """A token bucket: ``rate`` in bytes/s, ``burst`` and ``limit`` (queue) in bytes."""

    rate: int
    burst: int
    limit: int


def tbf_parameters(rate_bits: float) -> TbfParameters:
    """Token-bucket parameters for a link of ``rate_bits`` bits/s (see the constants above)."""
    rate = int(rate_bits / 8)
    burst = max(int(rate * TBF_BURST_SECONDS), TBF_MIN_BURST)
    return TbfParameters(rate=rate, burst=burst, limit=burst + int(rate * TBF_QUEUE_SECONDS))


def netem_parameters(profile: LinkProfile, loss: bool) -> dict[str, Any]:
    """pyroute2 ``tc("add", "netem", ...)`` keywords: delay and jitter in microseconds, loss in
    percent (only if ``loss``), and a queue long enough for the link's bandwidth-delay product."""
    line_rate = profile.rate if profile.rate is not None else 10e9  # bits/s, a fast veth
    in_flight = line_rate / 8 * (profile.delay + profile.jitter + 0.05) / 1000  # ~1 kB packets
    params: dict[str, Any] = {
        "delay": int(profile.delay * 1e6),
        "jitter": int(profile.jitter * 1e6),
        "limit": max(NETEM_MIN_LIMIT, math.ceil(in_flight)),
    }
    if loss and profile.loss:
        params["loss"] = profile.loss * 100
    return params


def nft_loss_threshold(loss: float) -> int:
    """``k`` in ``numgen random mod 1000000 < k``: the rule drops this many in a million."""
    return round(loss * LOSS_SCALE)


def nft_loss_script(
    table: str, ifnames: Sequence[str] | Mapping[str, float], loss: float = 0.0
) -> str:
    """An ``nft -f`` script that replaces netdev table ``table`` with one ingress chain per
    interface dropping the fraction ``loss`` of IP packets (none if ``loss`` is 0 or no names).
    ``ifnames`` may map each interface to its own loss instead (devices on mixed links).

    Only IP packets: a lost ARP request stalls a flow for a second, which a radio link's
    loss would not."""
    lines = [f"table netdev {table}", f"delete table netdev {table}"]
    losses = dict(ifnames) if isinstance(ifnames, Mapping) else dict.fromkeys(ifnames, loss)
    losses = {ifname: fraction for ifname, fraction in losses.items() if fraction}
    if losses:
        lines.append(f"table netdev {table} {{")
        for ifname, fraction in losses.items():
            k = nft_loss_threshold(fraction)
            lines += [
                f"  chain {ifname} {{",
                f'    type filter hook ingress device "{ifname}" priority 0; policy accept;',
                f"    meta protocol {{ ip, ip6 }} numgen random mod {LOSS_SCALE} < {k}"
                " counter drop",
                "  }",
            ]
        lines.append("}")
    return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class AppliedShaping:
    """What a testbed's links really do: the ``profile`` asked for, the ``direction`` shaped
    (both, up = device to server, down), how rate and loss are made (``rate_by``: "tbf" or
    None; ``loss_by``: "netem", "nftables" or None), whether delay/jitter apply, and notes on
    what could not be applied."""

    profile: LinkProfile
    direction: str
    rate_by: str | None
    loss_by: str | None
    delay_applied: bool
    notes: tuple[str, ...] = ()
    topology: str = "star"
    """``star`` (a link per device), ``shared`` (one access link in front of the server, the
    devices' links behind it) or ``shared-broker-near`` (the same, a broker beside the
    switch): see :data:`TOPOLOGIES`."""
    devices: tuple[LinkProfile, ...] = ()
    """Each device's own link, in device order: ``profile`` on a star unless the devices have
    profiles of their own; on a shared topology the links behind the shared one (``none``:
    unshaped)."""

    @property
    def shared(self) -> LinkProfile | None:
        """The access link every device shares (``profile``), or None on a star."""
        return None if self.topology == "star" else self.profile

    def to_config(self) -> dict[str, Any]:
        """A JSON-serialisable dict; :meth:`from_config` restores it."""
        config = dataclasses.asdict(self)
        config["profile"] = self.profile.to_config()
        config["notes"] = list(self.notes)
        config["devices"] = [p.to_config() for p in self.devices]
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AppliedShaping:
        """The object a :meth:`to_config` dict describes (older ones without topology and
        devices too)."""
        return cls(
            **{
                **config,
                "profile": LinkProfile.from_config(config["profile"]),
                "notes": tuple(config["notes"]),
                "devices": tuple(LinkProfile.from_config(p) for p in config.get("devices", ())),
            }
        )

    def combined(
        self, others: Sequence[AppliedShaping], devices: Sequence[LinkProfile], topology: str
    ) -> AppliedShaping:
        """This plan (of the main profile) with the notes and mechanisms of ``others`` (the
        devices' own profiles' plans), for ``topology`` and per-device ``devices``."""
        plans = [self, *others]
        notes = tuple(dict.fromkeys(n for plan in plans for n in plan.notes))
        return dataclasses.replace(
            self,
            rate_by=next((p.rate_by for p in plans if p.rate_by), None),
            loss_by=next((p.loss_by for p in plans if p.loss_by), None),
            delay_applied=any(p.delay_applied for p in plans),
            notes=notes,
            topology=topology,
            devices=tuple(devices),
        )


def plan_shaping(profile: LinkProfile, direction: str, netem: bool, nft: bool) -> AppliedShaping:
    """How ``profile`` will be applied given whether the kernel has ``netem`` and nftables'
    netdev ingress hook (``nft``); loss with neither raises :class:`ShapingUnavailable`."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, not {direction!r}")
    notes: list[str] = []
    loss_by = None
    if profile.loss:
        if netem:
            loss_by = "netem"
        elif nft:
            loss_by = "nftables"
        else:
            raise ShapingUnavailable(
                f"profile {profile.describe()!r} asks for loss, but this kernel has neither the "
                "netem qdisc nor nftables' netdev ingress hook (nf_tables with netdev family)"
            )
    delay_applied = bool(profile.delay or profile.jitter) and netem
    if (profile.delay or profile.jitter) and not netem:
        notes.append(
            f"delay {profile.delay * 1e3:g} ms / jitter {profile.jitter * 1e3:g} ms NOT applied: "
            "this kernel has no netem qdisc (sch_netem)"
        )
    if direction != "both":
        notes.append(
            f"only the {'device-to-server' if direction == 'up' else 'server-to-device'}"
            " direction is shaped"
        )
    return AppliedShaping(
        profile=profile,
        direction=direction,
        rate_by="tbf" if profile.rate is not None else None,
        loss_by=loss_by,
        delay_applied=delay_applied,
        notes=tuple(notes),
    )
