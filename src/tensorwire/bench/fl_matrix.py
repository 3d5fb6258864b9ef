"""The FedComm experiment matrix: protocols x models x profiles x loss x stress x codecs x reps.

Codecs are the uplink compressor and the downlink mode (none, fp16, or a lossless delta).

An :class:`Experiment` is one FedAvg run on the testbed; its :attr:`~Experiment.key` names its
results directory and stays the same for the same settings, so a rerun finds what is done.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Any

from tensorwire.testbed.profile import LinkProfile, as_profile
from tensorwire.transports.registry import bench_protocols, find_transport, listed_transports

STRESSES = ("none", "cpu", "network")
SECURITIES = ("none", "tls")  # tls: enrolled devices, encrypted traffic
RATIO_CODECS = ("topk", "randomk", "dgc")  # the uplink codecs that keep a fraction


def codec_label(uplink: str, ratio: float, downlink: str = "none") -> str:
    """An uplink codec with the fraction it keeps where it has one, e.g. ``topk 1%``, and
    the downlink mode where it is not none: ``topk 1% / down delta``."""
    label = f"{uplink} {ratio * 100:g}%" if uplink in RATIO_CODECS else uplink
    return label if downlink == "none" else f"{label} / down {downlink}"


def registered_protocols() -> list[str]:
    """Every registered transport, by the name ``--protocols`` takes (``zmq`` for zmq+tcp)."""
    return [entry.name for entry in listed_transports()]


def protocol_schemes() -> dict[str, str]:
    """Every name a protocol can have here -> its URL scheme: each transport's name and its
    variants (udp also runs in best-effort mode, as ``udp-best-effort``)."""
    return {protocol: entry.scheme for protocol, entry in bench_protocols().items()}


def protocol_name(text: str) -> str:
    """The protocol name for a transport's name or URL scheme (``zmq+tcp`` -> ``zmq``); other
    text as it is."""
    entry = find_transport(text)
    return entry.name if entry is not None and text == entry.scheme else text


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One FedAvg run: ``protocol`` (a name of :func:`protocol_schemes`), ``model``, link
    ``profile`` (a name or profile string) with packet ``loss`` (a fraction), ``stress``
    (none, cpu, network), ``uplink`` compressor keeping ``ratio``, ``downlink`` mode, and
    the run's size (``epochs`` local epochs per round)."""

    protocol: str
    model: str = "vgg5"
    profile: str = "4g"
    loss: float = 0.0
    stress: str = "none"
    uplink: str = "none"
    ratio: float = 0.01
    rounds: int = 3
    clients: int = 4
    dataset: str = "digits"
    rep: int = 0
    downlink: str = "none"
    epochs: int = 1
    security: str = "none"  # "tls": enrolled devices, encrypted (tensorwire certs per run)

    def __post_init__(self) -> None:
        from tensorwire.fl.config import FLConfig  # tensorwire.fl imports torch

        if self.protocol not in (schemes := protocol_schemes()):
            raise ValueError(f"protocol {self.protocol!r}: choose among {', '.join(schemes)}")
        if self.stress not in STRESSES:
            raise ValueError(f"stress {self.stress!r}: choose among {', '.join(STRESSES)}")
        if self.security not in SECURITIES:
            raise ValueError(f"security {self.security!r}: choose among {', '.join(SECURITIES)}")
        # the run's own settings are checked where the run checks them
        FLConfig(
            dataset=self.dataset,
            model=self.model,
            clients=self.clients,
            rounds=self.rounds,
            epochs=self.epochs,
            uplink=self.uplink,
            ratio=self.ratio,
            downlink=self.downlink,
        )
        self.link_profile()  # a profile that does not parse fails here, not mid-run

    @property
    def codec_label(self) -> str:
        """The uplink codec with its ratio where it has one, e.g. ``topk 1%``, and the
        downlink mode where it is not none."""
        return codec_label(self.uplink, self.ratio, self.downlink)

    @property
    def key(self) -> str:
        """A directory name that is the same for the same settings, e.g.
        ``tcp_vgg5_4g_loss0_stress-none_up-none_digits_4dev_3rounds_rep0`` (``down-delta``
        and ``5ep`` follow ``up-...`` where they are not the defaults)."""
        uplink = self.uplink + (f"{self.ratio:g}" if self.uplink in RATIO_CODECS else "")
        parts = [
            self.protocol,
            self.model,
            _slug(self.profile),
            f"loss{self.loss:g}",
            f"stress-{self.stress}",
            f"up-{uplink}",
            *([f"down-{self.downlink}"] if self.downlink != "none" else []),
            *([f"{self.epochs}ep"] if self.epochs != 1 else []),
            *([f"sec-{self.security}"] if self.security != "none" else []),
            self.dataset,
            f"{self.clients}dev",
            f"{self.rounds}rounds",
            f"rep{self.rep}",
        ]
        return "_".join(parts)

    def link_profile(self) -> LinkProfile:
        """The profile the links get: :attr:`profile` with :attr:`loss` applied."""
        base = as_profile(self.profile)
        loss = dataclasses.replace(base, loss=self.loss) if self.loss else base
        name = self.profile if not self.loss else f"{self.profile}, loss {self.loss * 100:g}%"
        return dataclasses.replace(loss, name=name)

    def to_config(self) -> dict[str, Any]:
        """A JSON-serialisable dict; :meth:`from_config` restores the experiment."""
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Experiment:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in config.items() if k in names})


@dataclasses.dataclass(frozen=True)
class Matrix:
    """The experiments of a run: every combination of the tuples, ``reps`` times each."""

    protocols: tuple[str, ...]
    models: tuple[str, ...] = ("vgg5",)
    profiles: tuple[str, ...] = ("4g",)
    losses: tuple[float, ...] = (0.0,)
    stresses: tuple[str, ...] = ("none",)
    uplinks: tuple[str, ...] = ("none",)
    downlinks: tuple[str, ...] = ("none",)
    securities: tuple[str, ...] = ("none",)
    ratio: float = 0.01
    rounds: int = 3
    clients: int = 4
    dataset: str = "digits"
    reps: int = 1
    epochs: int = 1
    network_mbit: float = 250.0  # load the network stressor offers per device, Mbit/s

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.clients < 1 or self.reps < 1 or self.epochs < 1:
            raise ValueError("rounds, clients, reps and epochs must be positive")
        for name in (
            "protocols",
            "models",
            "profiles",
            "losses",
            "stresses",
            "uplinks",
            "downlinks",
            "securities",
        ):
            if not getattr(self, name):
                raise ValueError(f"the matrix needs at least one of {name}")
        self.experiments()  # every combination must be valid

    @classmethod
    def quick(cls) -> Matrix:
        """``--quick``: digits, VGG-5, 4 devices, 3 rounds, every registered protocol, 4g."""
        return cls(protocols=tuple(registered_protocols()))

    def experiments(self) -> list[Experiment]:
        """Every experiment, repetition outermost and protocol innermost, so that an
        interrupted run has whole protocol comparisons."""
        combos = itertools.product(
            range(self.reps),
            self.profiles,
            self.losses,
            self.stresses,
            self.uplinks,
            self.downlinks,
            self.securities,
            self.models,
            self.protocols,
        )
        return [
            Experiment(
                protocol=protocol,
                model=model,
                profile=profile,
                loss=loss,
                stress=stress,
                uplink=uplink,
                downlink=downlink,
                ratio=self.ratio,
                rounds=self.rounds,
                epochs=self.epochs,
                clients=self.clients,
                dataset=self.dataset,
                rep=rep,
                security=security,
            )
            for rep, profile, loss, stress, uplink, downlink, security, model, protocol in combos
        ]

    def to_config(self) -> dict[str, Any]:
        """A JSON-serialisable dict; :meth:`from_config` restores the matrix."""
        return {
            f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
            for f in dataclasses.fields(self)
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Matrix:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if k in names}
        )


def _slug(text: str) -> str:
    """``text`` made safe for a directory name: a-z 0-9 . - only, the rest as ``-``."""
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "none"
