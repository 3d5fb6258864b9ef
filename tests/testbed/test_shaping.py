"""How a profile becomes tbf / netem parameters and nftables rules (no namespaces needed)."""

from __future__ import annotations

import pytest

from tensorwire.testbed import LinkProfile, ShapingUnavailable
from tensorwire.testbed.shaping import (
    netem_parameters,
    nft_loss_script,
    nft_loss_threshold,
    plan_shaping,
    tbf_parameters,
)


def test_tbf_parameters_scale_with_rate() -> None:
    slow, fast = tbf_parameters(5e6), tbf_parameters(1e9)
    assert slow.rate == 625_000 and fast.rate == 125_000_000
    assert slow.burst == 8192  # the floor: at least a few full frames
    assert fast.burst == 500_000  # 4 ms at 1 Gbit/s
    assert slow.limit == slow.burst + 62_500  # 100 ms of queue


def test_netem_parameters() -> None:
    p = LinkProfile.parse("4g,delay=30ms,jitter=5ms,loss=2%")
    params = netem_parameters(p, loss=True)
    assert (params["delay"], params["jitter"], params["loss"]) == (30_000, 5_000, 2.0)
    assert params["limit"] >= 1000
    assert "loss" not in netem_parameters(p, loss=False)


def test_nft_script() -> None:
    assert nft_loss_threshold(0.1) == 100_000
    script = nft_loss_script("twb-x-loss", ["twb-x-s1", "twb-x-s2"], 0.1)
    assert script.startswith("table netdev twb-x-loss\ndelete table netdev twb-x-loss\n")
    assert script.count("numgen random mod 1000000 < 100000 counter drop") == 2
    assert 'hook ingress device "twb-x-s2"' in script
    assert nft_loss_script("t", ["a"], 0.0) == "table netdev t\ndelete table netdev t\n"


def test_plan_without_netem_notes_delay_and_uses_nftables() -> None:
    plan = plan_shaping(LinkProfile.parse("3g,delay=50ms,loss=1%"), "both", netem=False, nft=True)
    assert (plan.rate_by, plan.loss_by, plan.delay_applied) == ("tbf", "nftables", False)
    assert any("NOT applied" in note for note in plan.notes)
    with_netem = plan_shaping(LinkProfile.parse("3g,delay=50ms,loss=1%"), "up", True, True)
    assert (with_netem.loss_by, with_netem.delay_applied) == ("netem", True)
    with pytest.raises(ShapingUnavailable):
        plan_shaping(LinkProfile.parse("3g,loss=1%"), "both", netem=False, nft=False)
    with pytest.raises(ValueError):
        plan_shaping(LinkProfile.parse("3g"), "sideways", netem=True, nft=True)


def test_netem_parameters_encode_for_pyroute2() -> None:
    # This kernel may lack netem; at least the request must be one pyroute2 can build.
    plugins = pytest.importorskip("pyroute2.netlink.rtnl.tcmsg").plugins
    params = netem_parameters(LinkProfile.parse("3g,delay=50ms,jitter=10ms,loss=1%"), loss=True)
    options = plugins["netem"].get_parameters(dict(params))
    assert options["delay"] > 0 and options["jitter"] > 0 and options["loss"] > 0
