"""The FedComm experiment matrix: protocols x models x profiles x loss x stress x codecs x reps,
and beyond FedComm the topology (star, shared, shared-broker-near) and per-device links.

Codecs are the uplink compressor, the downlink mode (none, fp16, or a lossless delta) and the
lossless codec of both (auto, the FL runtime's default, none, or a codec id such as lz4).
``tcp-sequential`` is tcp whose server reaches its devices one after another (FedComm's TCP
server did), beside tcp's concurrent broadcast.

An :class:`Experiment` is one FedAvg run on the testbed; its :attr:`~Experiment.key` names its
results directory and stays the same for the same settings, so a rerun finds what is done.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Any

from tensorwire.fl.config import LOSSLESS_DEFAULT
from tensorwire.testbed.profile import LinkProfile, as_profile
from tensorwire.testbed.shaping import TOPOLOGIES
from tensorwire.transports.registry import (
    TransportEntry,
    bench_protocols,
    find_transport,
    listed_transports,
)

STRESSES = ("none", "cpu", "network")
SECURITIES = ("none", "tls")  # tls: enrolled devices, encrypted traffic
RATIO_CODECS = ("topk", "randomk", "dgc")  # the uplink codecs that keep a fraction
# Protocols that are another protocol with a sequential fan-out: one unicast after another.
SEQUENTIAL = {"tcp-sequential": "tcp"}
MIXED = "mixed"  # the profile of a star whose devices each have their own link


def codec_label(uplink: str, ratio: float, downlink: str = "none", lossless: str = "none") -> str:
    """An uplink codec with the fraction it keeps where it has one, e.g. ``topk 1%``, the
    downlink mode where it is not none (``topk 1% / down delta``), and the lossless codec
    where one is used: ``auto`` alone, ``topk 1% + auto`` beside a lossy one."""
    label = f"{uplink} {ratio * 100:g}%" if uplink in RATIO_CODECS else uplink
    label = label if downlink == "none" else f"{label} / down {downlink}"
    if lossless == "none":
        return label
    return lossless if label == "none" else f"{label} + {lossless}"


def registered_protocols() -> list[str]:
    """Every registered transport, by the name ``--protocols`` takes (``zmq`` for zmq+tcp)."""
    return [entry.name for entry in listed_transports()]


def protocol_schemes() -> dict[str, str]:
    """Every name a protocol can have here -> its URL scheme: each transport's name and its
    variants (udp also runs in best-effort mode, as ``udp-best-effort``)."""
    schemes = {protocol: entry.scheme for protocol, entry in bench_protocols().items()}
    schemes.update({v: schemes[base] for v, base in SEQUENTIAL.items() if base in schemes})
    return schemes


def transport_of(protocol: str) -> TransportEntry:
    """The registered transport a ``--protocols`` name runs (tcp for ``tcp-sequential``);
    KeyError if there is none."""
    return bench_protocols()[SEQUENTIAL.get(protocol, protocol)]


def fanout_of(protocol: str) -> str:
    """How the server of ``protocol`` broadcasts: ``sequential`` or ``concurrent``."""
    return "sequential" if protocol in SEQUENTIAL else "concurrent"


def parse_links(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Per-device link profiles from ``"3g,4g,4g,wifi"`` (or ``;`` between custom profiles
    that have commas of their own: ``"3g;20mbit,loss=1%"``), or a list of them; ``()`` for
    empty text or ``uniform``. Each must parse (:class:`~tensorwire.testbed.ProfileError`)."""
    if isinstance(text, str):
        text = text.strip()
        if text.lower() in ("", "uniform"):
            return ()
        items = [t.strip() for t in text.split(";" if ";" in text else ",")]
    else:
        items = [t.strip() for t in text]
    for item in items:
        as_profile(item)
    return tuple(items)


def protocol_name(text: str) -> str:
    """The protocol name for a transport's name or URL scheme (``zmq+tcp`` -> ``zmq``); other
    text as it is."""
    entry = find_transport(text)
    return entry.name if entry is not None and text == entry.scheme else text


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One FedAvg run: ``protocol`` (a name of :func:`protocol_schemes`), ``model``, link
    ``profile`` (a name or profile string) with packet ``loss`` (a fraction), ``stress``
    (none, cpu, network), ``uplink`` compressor keeping ``ratio``, ``downlink`` mode, the
    lossless ``codec`` of both (where they are not lossy), and the run's size (``epochs``
    local epochs per round).

    ``topology``: ``star`` (a link per device, shaped with ``profile``), ``shared`` (one access
    link shaped with ``profile`` in front of the server, every device behind it) or
    ``shared-broker-near`` (the same, the broker on the devices' side of it). ``links``: one
    profile per device, each device's own link; on a star they replace ``profile``, which
    becomes ``mixed``, and packet ``loss`` applies to each of them; on a shared topology they
    sit behind the shared link (loss on the shared link only)."""

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
    topology: str = "star"
    links: tuple[str, ...] = ()
    faults: str = "none"  # a scenario of tensorwire.bench.fl_faults, e.g. kill@2-4+hang@3
    deadline: float | None = None  # a round's deadline, s (None: fault_deadline with faults)
    quorum: int | None = None  # updates a round needs (None: all with no faults, else half)
    codec: str = LOSSLESS_DEFAULT  # lossless codec of model and updates: auto, none, lz4 ...

    def __post_init__(self) -> None:
        from tensorwire.bench.fl_faults import parse_scenario
        from tensorwire.fl.config import FLConfig  # tensorwire.fl imports torch

        if self.protocol not in (schemes := protocol_schemes()):
            raise ValueError(f"protocol {self.protocol!r}: choose among {', '.join(schemes)}")
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"topology {self.topology!r}: choose among {', '.join(TOPOLOGIES)}")
        object.__setattr__(self, "links", parse_links(self.links))
        if self.links and len(self.links) != self.clients:
            raise ValueError(
                f"links {','.join(self.links)!r}: one profile per device, {self.clients} devices"
            )
        if self.topology == "star" and self.links:
            object.__setattr__(self, "profile", MIXED)
        elif self.profile == MIXED:
            raise ValueError("profile 'mixed' is a star whose devices have links of their own")
        if self.stress not in STRESSES:
            raise ValueError(f"stress {self.stress!r}: choose among {', '.join(STRESSES)}")
        if self.uplink != "none" and self.downlink != "none":  # both lossy: no lossless use
            object.__setattr__(self, "codec", "none")
        if self.security not in SECURITIES:
            raise ValueError(f"security {self.security!r}: choose among {', '.join(SECURITIES)}")
        object.__setattr__(self, "faults", self.faults.strip().lower() or "none")
        parse_scenario(self.faults, self.clients, self.rounds)  # FaultSpecError: a ValueError
        if self.quorum is not None and not 1 <= self.quorum <= self.clients:
            raise ValueError(f"quorum {self.quorum}: between 1 and the {self.clients} devices")
        if self.deadline is not None and not self.deadline > 0:
            raise ValueError(f"deadline {self.deadline}: a positive number of seconds")
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
            codec=self.codec,
        )
        self.link_profile()  # a profile that does not parse fails here, not mid-run

    @property
    def codec_label(self) -> str:
        """The uplink codec with its ratio where it has one, e.g. ``topk 1%``, the
        downlink mode where it is not none, and the lossless codec where one is used."""
        return codec_label(self.uplink, self.ratio, self.downlink, self.codec)

    @property
    def key(self) -> str:
        """A directory name that is the same for the same settings, e.g.
        ``tcp_vgg5_4g_loss0_stress-none_up-none_codec-auto_digits_4dev_3rounds_rep0``
        (``down-delta`` and ``5ep`` follow ``up-...`` where they are not the defaults; no
        ``codec-`` part for raw, as before codecs were an axis)."""
        uplink = self.uplink + (f"{self.ratio:g}" if self.uplink in RATIO_CODECS else "")
        parts = [
            self.protocol,
            _slug(self.model),  # payload:10MB -> payload-10mb
            _slug(self.profile),
            f"loss{self.loss:g}",
            f"stress-{self.stress}",
            f"up-{uplink}",
            *([f"down-{self.downlink}"] if self.downlink != "none" else []),
            *([f"codec-{_slug(self.codec)}"] if self.codec != "none" else []),
            *([f"{self.epochs}ep"] if self.epochs != 1 else []),
            *([f"sec-{self.security}"] if self.security != "none" else []),
            *([f"topo-{self.topology}"] if self.topology != "star" else []),
            *([f"links-{_slug('-'.join(self.links))}"] if self.links else []),
            *([f"faults-{_slug(self.faults)}"] if self.faults != "none" else []),
            *([f"q{self.quorum}"] if self.quorum is not None else []),
            *([f"deadline{self.deadline:g}"] if self.deadline is not None else []),
            self.dataset,
            f"{self.clients}dev",
            f"{self.rounds}rounds",
            f"rep{self.rep}",
        ]
        return "_".join(parts)

    def link_profile(self) -> LinkProfile:
        """The profile the links get: :attr:`profile` with :attr:`loss` applied (the shared
        link's on a shared topology; on a ``mixed`` star the slowest device link's)."""
        if self.profile == MIXED:
            devices = self.device_profiles() or []
            slowest = min(devices, key=lambda p: p.rate if p.rate is not None else float("inf"))
            return dataclasses.replace(slowest, name=f"{MIXED} ({','.join(self.links)})")
        return _with_loss(as_profile(self.profile), self.profile, self.loss)

    def device_profiles(self) -> list[LinkProfile] | None:
        """Each device's own link, in device order, or None when :attr:`links` are not set
        (then the testbed's default: :meth:`link_profile` on a star, unshaped behind a shared
        link). :attr:`loss` applies to them on a star."""
        if not self.links:
            return None
        loss = self.loss if self.topology == "star" else 0.0
        return [_with_loss(as_profile(text), text, loss) for text in self.links]

    def to_config(self) -> dict[str, Any]:
        """A JSON-serialisable dict; :meth:`from_config` restores the experiment."""
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Experiment:
        """The experiment ``config`` describes (one recorded before codecs were an axis
        ran raw: ``codec`` none)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{"codec": "none", **{k: v for k, v in config.items() if k in names}})


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
    topologies: tuple[str, ...] = ("star",)
    links: tuple[tuple[str, ...], ...] = ((),)  # per-device link sets; () is uniform
    faults: tuple[str, ...] = ("none",)  # fault scenarios (tensorwire.bench.fl_faults)
    deadline: float | None = None  # every round's deadline, s (None: see Experiment)
    quorum: int | None = None  # updates a round needs (None: see Experiment)
    codecs: tuple[str, ...] = (LOSSLESS_DEFAULT,)  # lossless codecs of model and updates

    def __post_init__(self) -> None:
        object.__setattr__(self, "links", tuple(parse_links(each) for each in self.links))
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
            "topologies",
            "links",
            "faults",
            "codecs",
        ):
            if not getattr(self, name):
                raise ValueError(f"the matrix needs at least one of {name}")
        self.experiments()  # every combination must be valid

    @classmethod
    def quick(cls) -> Matrix:
        """``--quick``: digits, VGG-5, 4 devices, 3 rounds, every registered protocol, 4g."""
        return cls(protocols=tuple(registered_protocols()))

    def experiments(self) -> list[Experiment]:
        """Every experiment, repetition outermost, then topology (a testbed per topology),
        protocol innermost, so that an interrupted run has whole protocol comparisons. A star
        with per-device links has no profile of its own: it runs once, not once per profile."""
        outer = itertools.product(
            range(self.reps), self.topologies, self.links, self.profiles, self.losses
        )
        inner = itertools.product(
            self.stresses,
            self.uplinks,
            self.downlinks,
            self.codecs,
            self.securities,
            self.models,
            self.faults,
        )
        experiments = [
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
                topology=topology,
                links=links,
                faults=faults,
                deadline=self.deadline,
                quorum=self.quorum,
                codec=codec,
            )
            for (rep, topology, links, profile, loss), (
                stress,
                uplink,
                downlink,
                codec,
                security,
                model,
                faults,
            ) in itertools.product(outer, list(inner))
            for protocol in self.protocols
        ]
        return list({exp.key: exp for exp in experiments}.values())

    def to_config(self) -> dict[str, Any]:
        """A JSON-serialisable dict; :meth:`from_config` restores the matrix."""
        config = {
            f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
            for f in dataclasses.fields(self)
        }
        config["links"] = [list(each) for each in self.links]
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Matrix:
        """The matrix ``config`` describes (one recorded before codecs were an axis ran
        raw: ``codecs`` none)."""
        names = {f.name for f in dataclasses.fields(cls)}
        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if k in names
        }
        return cls(**{"codecs": ("none",), **fields})


def _with_loss(profile: LinkProfile, text: str, loss: float) -> LinkProfile:
    """``profile`` (given as ``text``) with packet ``loss`` applied and named for both."""
    lossy = dataclasses.replace(profile, loss=loss) if loss else profile
    return dataclasses.replace(lossy, name=text if not loss else f"{text}, loss {loss * 100:g}%")


def _slug(text: str) -> str:
    """``text`` made safe for a directory name: a-z 0-9 . - only, the rest as ``-``."""
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "none"
