"""LinkProfile: named profiles, parsing, validation, description and config round trip."""

from __future__ import annotations

import pytest

from tensorwire.testbed import PROFILES, LinkProfile, ProfileError, as_profile


def test_named_profiles_have_fedcomm_rates() -> None:
    assert LinkProfile.named("3g").rate == 5e6
    assert LinkProfile.named("4g").rate == 20e6
    assert LinkProfile.named("WiFi").rate == 60e6
    assert LinkProfile.named("lan").rate == 1e9
    none = LinkProfile.named("none")
    assert none.rate is None and not none.shaped
    assert all(p.delay == 0 and p.loss == 0 for p in PROFILES.values())


def test_parse_custom() -> None:
    p = LinkProfile.parse("20mbit,loss=0.05,delay=30ms")
    assert (p.rate, p.loss, p.delay, p.jitter) == (20e6, 0.05, 0.03, 0.0)
    assert p.name == "20mbit,loss=0.05,delay=30ms"
    assert LinkProfile.parse("4g, loss=5%, jitter=800us") == LinkProfile(
        "4g, loss=5%, jitter=800us", rate=20e6, loss=0.05, jitter=0.0008
    )
    assert LinkProfile.parse("rate=512kbit").rate == 512e3
    assert LinkProfile.parse("1.5gbit").rate == 1.5e9
    assert LinkProfile.parse("1000000").rate == 1e6
    assert LinkProfile.parse("none,loss=0.1").rate is None
    assert LinkProfile.parse("3g,delay=0.1").delay == 0.1
    assert LinkProfile.parse("4g") == PROFILES["4g"]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "fast",
        "20mbit,loss",
        "20mbit,loss=2",
        "20mbit,loss=-1%",
        "4g,color=red",
        "20 furlongs",
        "4g,delay=soon",
        "0mbit",
    ],
)
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ProfileError):
        LinkProfile.parse(text)


def test_describe_and_config() -> None:
    p = LinkProfile.parse("wifi,loss=2%,delay=10ms")
    assert p.describe() == "wifi,loss=2%,delay=10ms: 60 Mbit/s, delay 10 ms, loss 2 %"
    assert LinkProfile.from_config(p.to_config()) == p
    assert PROFILES["none"].describe() == "none: unshaped"
    assert as_profile(None) == PROFILES["none"]
    assert as_profile(p) is p
    assert as_profile("lan").rate == 1e9
