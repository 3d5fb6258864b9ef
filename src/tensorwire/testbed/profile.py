"""Link profiles: the rate, delay, jitter and loss a testbed link emulates, per direction.

Named profiles are FedComm's rates: ``3g`` 5 Mbit/s, ``4g`` 20 Mbit/s, ``wifi`` 60 Mbit/s, plus
``lan`` 1 Gbit/s and ``none`` (unshaped). They carry no delay, so a named profile behaves the
same on kernels with and without netem; add delay in a custom profile, e.g.
``LinkProfile.parse("4g,delay=30ms,loss=1%")``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from tensorwire.testbed.errors import ProfileError

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_TIME_DIVISORS = {"s": 1, "ms": 1e3, "us": 1e6}  # divide: 800/1e6 is 0.0008, 800*1e-6 is not
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"


@dataclasses.dataclass(frozen=True)
class LinkProfile:
    """One direction of a link: ``rate`` in bits/s (None: unshaped), one-way ``delay`` and
    ``jitter`` in seconds, ``loss`` as the fraction of packets dropped (0 <= loss < 1)."""

    name: str = "custom"
    rate: float | None = None
    delay: float = 0.0
    jitter: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        if self.rate is not None and not self.rate > 0:
            raise ProfileError(f"rate must be > 0 bits/s or None (unshaped), not {self.rate!r}")
        if self.delay < 0 or self.jitter < 0:
            raise ProfileError(f"delay and jitter must be >= 0 s, not {self.delay}, {self.jitter}")
        if not 0 <= self.loss < 1:
            raise ProfileError(f"loss is a fraction in [0, 1), not {self.loss!r}")

    @property
    def shaped(self) -> bool:
        """Whether this profile changes the link at all."""
        return self.rate is not None or bool(self.delay or self.jitter or self.loss)

    @classmethod
    def named(cls, name: str) -> LinkProfile:
        """The named profile ``name`` (3g, 4g, wifi, lan, none)."""
        try:
            return PROFILES[name.strip().lower()]
        except KeyError:
            known = ", ".join(PROFILES)
            raise ProfileError(f"no profile named {name!r}; known: {known}") from None

    @classmethod
    def parse(cls, text: str) -> LinkProfile:
        """A profile from text: a name or a rate, then ``key=value`` overrides, comma-separated.

        ``"4g"``, ``"20mbit,loss=0.05,delay=30ms"``, ``"wifi,loss=2%,jitter=5ms"``,
        ``"rate=5mbit"``. Rates take bit, kbit, mbit, gbit (powers of 1000; a bare number is
        bits/s; ``none`` is unshaped); times s, ms, us (bare: seconds); loss a fraction or ``%``.
        """
        tokens = [t.strip() for t in text.split(",") if t.strip()]
        if not tokens:
            raise ProfileError("an empty profile; give a name (4g, ...) or a rate (20mbit)")
        base = LinkProfile(name=text.strip())
        if "=" not in tokens[0]:
            first = tokens.pop(0)
            if first.lower() in PROFILES:
                base = dataclasses.replace(PROFILES[first.lower()], name=text.strip())
            else:
                try:
                    rate = _parse_rate(first)
                except ProfileError:
                    named = ", ".join(PROFILES)
                    raise ProfileError(
                        f"no profile {first!r}: name one of {named}, or give a rate "
                        "such as 20mbit, 500kbit or 1gbit (then key=value settings)"
                    ) from None
                base = dataclasses.replace(base, rate=rate)
        fields: dict[str, Any] = {}
        for token in tokens:
            key, sep, value = token.partition("=")
            key = key.strip().lower()
            if not sep:
                raise ProfileError(
                    f"{token!r} in {text!r}: expected key=value after the first item"
                )
            if key == "rate":
                fields["rate"] = _parse_rate(value)
            elif key in ("delay", "jitter"):
                fields[key] = _parse_time(value)
            elif key == "loss":
                fields["loss"] = _parse_loss(value)
            else:
                raise ProfileError(
                    f"unknown key {key!r} in {text!r}; use rate, delay, jitter, loss"
                )
        return dataclasses.replace(base, **fields)

    def describe(self) -> str:
        """A short human-readable summary, e.g. ``4g: 20 Mbit/s, loss 5 %``."""
        if not self.shaped:
            return f"{self.name}: unshaped"
        parts = [f"{_format_rate(self.rate)}" if self.rate is not None else "unlimited rate"]
        if self.delay:
            parts.append(f"delay {self.delay * 1e3:g} ms")
        if self.jitter:
            parts.append(f"jitter {self.jitter * 1e3:g} ms")
        if self.loss:
            parts.append(f"loss {self.loss * 100:g} %")
        return f"{self.name}: {', '.join(parts)}"

    def to_config(self) -> dict[str, Any]:
        """A JSON-serialisable dict; :meth:`from_config` restores the profile."""
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LinkProfile:
        """The profile a :meth:`to_config` dict describes."""
        return cls(**config)


PROFILES: dict[str, LinkProfile] = {
    "3g": LinkProfile("3g", rate=5e6),
    "4g": LinkProfile("4g", rate=20e6),
    "wifi": LinkProfile("wifi", rate=60e6),
    "lan": LinkProfile("lan", rate=1e9),
    "none": LinkProfile("none"),
}


def as_profile(value: LinkProfile | str | None) -> LinkProfile:
    """A :class:`LinkProfile` from a profile, a profile string, or None (unshaped)."""
    if value is None:
        return PROFILES["none"]
    if isinstance(value, LinkProfile):
        return value
    if isinstance(value, str):
        return LinkProfile.parse(value)
    raise ProfileError(f"a profile is a LinkProfile or a string, not {type(value).__name__}")


def _parse_rate(text: str) -> float | None:
    text = text.strip().lower()
    if text in ("none", "unlimited"):
        return None
    match = re.fullmatch(_NUMBER + r"\s*(bit|kbit|mbit|gbit)?(?:/s)?", text)
    if match is None:
        raise ProfileError(f"cannot read rate {text!r}; e.g. 20mbit, 500kbit, 1gbit")
    return float(match[1]) * _RATE_UNITS[match[2] or "bit"]


def _parse_time(text: str) -> float:
    match = re.fullmatch(_NUMBER + r"\s*(s|ms|us)?", text.strip().lower())
    if match is None:
        raise ProfileError(f"cannot read time {text!r}; e.g. 30ms, 0.5s, 800us")
    return float(match[1]) / _TIME_DIVISORS[match[2] or "s"]


def _parse_loss(text: str) -> float:
    match = re.fullmatch(_NUMBER + r"\s*(%)?", text.strip())
    if match is None:
        raise ProfileError(f"cannot read loss {text!r}; e.g. 0.05 or 5%")
    return float(match[1]) / (100 if match[2] else 1)


def _format_rate(bits_per_second: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits_per_second >= scale:
            return f"{bits_per_second / scale:g} {unit}"
    return f"{bits_per_second:g} bit/s"
