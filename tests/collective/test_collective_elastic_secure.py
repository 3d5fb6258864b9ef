"""An elastic group with credentials: per-rank keys (and certificates alone) admit the
ranks at the coordinator and seal every link, a rejoining rank's too; a rank SIGKILLed
mid-allreduce is dropped, the others go on over 3, and restarted it rejoins over sealed
links; a stranger, an unenrolled rank and a rank claiming another's id are refused at the
coordinator. Ranks in processes of their own (``elastic_rank.py``)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from ranks import Ranks

from tensorwire.collective import Rendezvous
from tensorwire.collective.credentials import rank_credentials
from tensorwire.errors import AuthenticationError, TransportError
from tensorwire.transports import connect
from tensorwire.transports.certs import make_certs

pytest.importorskip("cryptography", reason="cryptography is not installed")

WORKER = Path(__file__).with_name("elastic_rank.py")
SIZE = 4
VICTIM = 2
T = 60.0


@pytest.fixture(scope="module")
def enrolments(tmp_path_factory) -> dict[str, Path]:
    """``keys``: the ranks' secrets only (and the hub's certificate and keys.json);
    ``certs``: the ranks' certificates only; ``other``: an enrolment no group here knows."""
    base = tmp_path_factory.mktemp("elastic-enrolments")
    ranks = [f"rank-{r}" for r in range(SIZE)]
    full = make_certs(base / "full", hosts=["127.0.0.1"], clients=ranks).directory
    keys, certs = shutil.copytree(full, base / "keys"), shutil.copytree(full, base / "certs")
    for f in keys.glob("rank-*"):
        if f.suffix in (".pem", ".key"):
            f.unlink()
    for f in [*certs.glob("*.secret"), certs / "keys.json"]:
        f.unlink(missing_ok=True)
    other = make_certs(base / "other", hosts=["127.0.0.1"], clients=[*ranks, "rank-4"])
    return {"keys": keys, "certs": certs, "other": other.directory}


def _group(certs: Path, stop: Path) -> Ranks:
    return Ranks(
        "train", SIZE, WORKER, elastic=True, credentials=certs, extra=(str(stop), str(certs))
    )


def _step_over(ranks: Ranks, rank: int, over: list[int], after: float = 0.0) -> dict[str, Any]:
    """Rank ``rank``'s first step over ``over`` (past ``after``); every step up to it is
    right and over sealed links."""
    deadline = time.monotonic() + T
    while True:
        line, _ = ranks.until(rank, "step", max(deadline - time.monotonic(), 0.01))
        assert line["ok"] and line["sealed"], line
        if line["over"] == over and line["t"] > after:
            return line


def _rejoined(ranks: Ranks) -> None:
    """The restarted victim joins, and from then on every rank's steps include it, over
    sealed links (the rejoined rank's too, on every rank)."""
    ranks.until(VICTIM, "ready", T)
    joined = time.monotonic()
    for rank in range(SIZE):
        _step_over(ranks, rank, list(range(SIZE)), after=joined)


def _stop_all(ranks: Ranks, stop: Path) -> None:
    stop.touch()
    for rank in range(SIZE):
        ranks.until(rank, "done", timeout=T)


def test_a_keyed_elastic_group_drops_a_killed_rank_and_rejoins_it_over_sealed_links(
    enrolments, tmp_path
):
    stop = tmp_path / "stop"
    with _group(enrolments["keys"], stop) as ranks:
        for rank in range(SIZE):
            _step_over(ranks, rank, list(range(SIZE)))
        os.kill(ranks.procs[VICTIM].pid, signal.SIGKILL)
        left = [r for r in range(SIZE) if r != VICTIM]
        for rank in left:
            _step_over(ranks, rank, left)
            for _ in range(3):  # and training goes on
                line, _ = ranks.until(rank, "step", T)
                assert line["ok"] and line["sealed"] and line["over"] == left, line
        ranks.restart(VICTIM)
        _rejoined(ranks)
        ranks.procs[VICTIM].kill()
        ranks.restart(VICTIM)  # at once, as the same client id: it replaces its predecessor
        _rejoined(ranks)
        coordinator = ranks.rendezvous.coordinator if ranks.rendezvous else None
        assert coordinator is not None and not coordinator.refusals, coordinator
        _stop_all(ranks, stop)


def test_certificates_alone_seal_an_elastic_group(enrolments, tmp_path):
    stop = tmp_path / "stop"
    with _group(enrolments["certs"], stop) as ranks:
        for rank in range(SIZE):
            for _ in range(2):
                _step_over(ranks, rank, list(range(SIZE)))
        _stop_all(ranks, stop)


def _refused(url: str, client_id: str, credentials: Any, hello: dict[str, Any]) -> str:
    """How the coordinator at ``url`` answers ``hello`` from ``client_id``: "hub: why" when
    the hub let it not in (no TLS, a wrong secret or certificate), else its error."""
    try:
        with connect(url, client_id=client_id, timeout=3, credentials=credentials) as ch:
            ch.send(meta=hello)
            answer = ch.recv(timeout=T).meta
    except (AuthenticationError, TransportError) as exc:
        return f"hub: {exc}"
    assert "error" in answer, answer
    return str(answer["error"])


@pytest.mark.parametrize("mode", ["keys", "certs"])
def test_strangers_unenrolled_ranks_and_impostors_are_refused_at_the_coordinator(mode, enrolments):
    hello = {"rank": 1, "size": SIZE, "host": "127.0.0.1", "port": 9, "elastic": True}
    ours, other = enrolments[mode], enrolments["other"]
    with Rendezvous("tcp://127.0.0.1:0", SIZE, timeout=T, elastic=True, credentials=ours) as rv:
        assert rv.coordinator is not None
        stranger = _refused(rv.url, "rank-1", None, hello)  # no credentials at all
        unenrolled = _refused(
            rv.url, "rank-4", rank_credentials(other, 4).channel(), {**hello, "rank": 3}
        )
        # another enrolment's rank-1: its secret / certificate is not this group's
        foreign = _refused(rv.url, "rank-1", rank_credentials(other, 1).channel(), hello)
        impostor = _refused(  # rank 1, rightly enrolled, claims rank 2
            rv.url, "rank-1", rank_credentials(ours, 1).channel(), {**hello, "rank": 2}
        )
        assert "rank-1" in impostor and "rank-2" in impostor, impostor
        assert [c for c, _ in rv.coordinator.refusals] == ["rank-1"], rv.coordinator.refusals
        for refused in (stranger, unenrolled, foreign):
            assert refused.startswith("hub: "), refused
