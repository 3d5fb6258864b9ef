"""A secured group: only enrolled ranks join, each link proves which rank is at its other
end, strangers at a rank's port are refused while the group goes on, and no tensor byte
travels in clear; with per-rank keys and with mutual TLS certificates, 4 ranks in processes
of their own (``secure_rank.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from ranks import SRC, Ranks

from tensorwire.collective import Group, GroupOptions, RankFailed, Rendezvous, messages
from tensorwire.collective.credentials import GroupCredentials, rank_credentials
from tensorwire.collective.link import LinkSecurity
from tensorwire.collective.mesh import Mesh, listen
from tensorwire.collective.state import GroupState
from tensorwire.errors import AuthenticationError, TransportError
from tensorwire.transports.certs import make_certs
from tensorwire.transports.security import TLS
from tensorwire.transports.sockets import StreamReader, connect_stream, send_encoded
from tensorwire.wire import Limits, MessageStream

pytest.importorskip("cryptography", reason="cryptography is not installed")

WORKER = Path(__file__).with_name("secure_rank.py")
SIZE = 4
T = 60.0
MODES = ["keys", "tls"]


def _keys_only(source: Path, target: Path) -> Path:
    """``source`` without the ranks' certificates: the ranks prove their secrets only."""
    shutil.copytree(source, target)
    for f in target.glob("rank-*"):
        if f.suffix in (".pem", ".key"):
            f.unlink()
    return target


@pytest.fixture(scope="module")
def enrolments(tmp_path_factory) -> dict[str, Path]:
    """Directories ``tensorwire certs`` wrote: ``tls`` (certificates and secrets), ``keys``
    (secrets only), and ``other``: another enrolment, whose ranks no group here knows."""
    base = tmp_path_factory.mktemp("enrolments")
    ranks = [f"rank-{r}" for r in range(SIZE)]
    tls = make_certs(base / "tls", hosts=["127.0.0.1"], clients=ranks).directory
    other = make_certs(base / "other", hosts=["127.0.0.1"], clients=[*ranks, "rank-4"])
    return {"tls": tls, "keys": _keys_only(tls, base / "keys"), "other": other.directory}


def _secured(scenario: str, credentials: Path | None, size: int = SIZE) -> Ranks:
    arg = "-" if credentials is None else str(credentials)
    return Ranks(
        scenario,
        size,
        worker=WORKER,
        credentials=credentials,
        extra=[[arg] for _ in range(size)],
    )


# --- in clear or not ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_sealed_allreduce_is_right_and_its_bytes_never_travel_in_clear(mode, enrolments):
    with _secured("pattern", enrolments[mode]) as ranks:
        reports = [ranks.until(r, "right", timeout=T)[0] for r in range(SIZE)]
    assert all(r["right"] for r in reports), reports
    assert sum(r["seen"] for r in reports) > 3 * (1 << 20), "the proxies saw little: broken"
    assert not any(r["clear"] for r in reports), "tensor bytes crossed a link in clear"


def test_without_credentials_the_same_bytes_do_travel_in_clear():
    """The check above can fail: the same proxies see the pattern on plain links."""
    with _secured("pattern", None) as ranks:
        reports = [ranks.until(r, "right", timeout=T)[0] for r in range(SIZE)]
    assert all(r["right"] for r in reports), reports
    assert any(r["clear"] for r in reports)


# --- strangers at a rank's port ------------------------------------------------------------


def _answer(address: tuple[str, int], payload: bytes) -> bytes:
    """What a rank's listener answers ``payload`` with, up to the end of the connection."""
    with socket.create_connection(address, timeout=T) as sock:
        sock.sendall(payload)
        answer = b""
        for _ in range(1000):  # bounded: the listener closes the connection
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer


def _welcomed(address: tuple[str, int], tls: TLS, hello: bytes) -> bool:
    """Whether a TLS stranger with ``tls``'s settings gets a welcome for ``hello``."""
    ctx = tls.client_context()
    ctx.check_hostname = False
    if tls.ca is None:
        ctx.verify_mode = ssl.CERT_NONE
    try:
        sock = connect_stream(address, time.monotonic() + T, ctx)
        try:
            sock.send_all([hello], time.monotonic() + T)  # type: ignore[attr-defined]
            reader = StreamReader(sock, MessageStream())
            return reader.read_message(time.monotonic() + T).kind == messages.WELCOME
        finally:
            sock.close()
    except (TransportError, OSError, ValueError):
        return False


@pytest.mark.parametrize("mode", MODES)
def test_strangers_at_a_ranks_port_are_refused_and_the_group_goes_on(mode, enrolments):
    other = enrolments["other"]
    with _secured("stranger", enrolments[mode]) as ranks:
        ready = [ranks.until(r, "ready", timeout=T)[0] for r in range(SIZE)]
        address = tuple(ready[0]["address"])
        hello = messages.hello(2, "0" * 32).to_bytes()
        answers = [
            _answer(address, b"GET / HTTP/1.0\r\n\r\n" * 100),  # garbage
            _answer(address, hello),  # a hello in clear
        ]
        stranger = TLS()  # no certificate, trusts any
        thief = TLS(cert=other / "rank-2.pem", key=other / "rank-2.key", ca=other / "ca.pem")
        welcomed = [_welcomed(address, stranger, hello), _welcomed(address, thief, hello)]
        for rank in range(SIZE):
            ranks.procs[rank].stdin.write("4\n")  # type: ignore[union-attr]
            ranks.procs[rank].stdin.flush()  # type: ignore[union-attr]
        results = [ranks.until(r, "total", timeout=T)[0] for r in range(SIZE)]
    assert not any(b"tw.coll" in a for a in answers), answers
    assert welcomed == [False, False]
    assert [r["total"] for r in results] == [sum(range(SIZE))] * SIZE
    assert len(results[0]["refusals"]) == 4, results[0]["refusals"]


# --- ranks the rendezvous does not know -------------------------------------------------------


def _impostor(enrolments: dict[str, Path], mode: str, tmp: Path, rank: int, what: str) -> Path:
    """``mode``'s directory with rank ``rank``'s files from the other enrolment: ``key`` its
    secret only (the right certificate, a wrong key), ``all`` every file (another CA's)."""
    fake = Path(shutil.copytree(enrolments[mode], tmp / "impostor"))
    taken = [".secret"] if what == "key" or mode == "keys" else [".secret", ".pem", ".key"]
    for suffix in taken:
        shutil.copy(enrolments["other"] / f"rank-{rank}{suffix}", fake)
    return fake


@pytest.mark.parametrize(
    ("mode", "rank", "what"),
    [
        ("keys", 1, "key"),  # enrolled as rank-1, with a wrong secret
        ("keys", 4, "all"),  # rank-4 is not enrolled
        ("tls", 1, "key"),  # rank-1's certificate, a wrong secret
        ("tls", 4, "all"),  # not enrolled: a certificate from another CA
    ],
)
def test_a_rank_with_a_wrong_key_or_not_enrolled_cannot_join(
    mode, rank, what, enrolments, tmp_path
):
    fake = _impostor(enrolments, mode, tmp_path, rank, what)
    with Rendezvous("tcp://127.0.0.1:0", 5, timeout=5, credentials=enrolments[mode]) as rv:
        command = [sys.executable, str(WORKER), "join", rv.url, str(rank), "5", str(fake)]
        env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert not any("ready" in line for line in lines), lines
    assert lines and "error" in lines[-1], (lines, done.stderr[-2000:])
    error = lines[-1]
    if what == "key" or mode == "keys":  # refused by the hub, with the reason
        assert error["error"] == "AuthenticationError", error
    else:  # TLS refused before any hello: the rank gives up at its deadline
        assert error["error"] in ("AuthenticationError", "CollectiveError"), error
    assert "rendezvous" in error["message"], error


# --- the link's own checks, in this process ---------------------------------------------------

TOKEN = "5" * 32


def _rank0(
    credentials: GroupCredentials, keys: dict[int, bytes]
) -> tuple[GroupState, Mesh, tuple[str, int]]:
    """Rank 0 of 3 listening (its mesh opening in a thread): the dialled end of a link."""
    state = GroupState(0, 3, 2.0)
    mesh = Mesh(state, TOKEN, 0.5, Limits(), LinkSecurity(0, TOKEN, credentials, keys))
    sock = listen("127.0.0.1")
    address = sock.getsockname()[:2]

    def opening() -> None:
        with contextlib.suppress(RankFailed):  # ranks 1 and 2 never both come: it gives up
            mesh.open(sock, [address] * 3, time.monotonic() + 10)

    threading.Thread(target=opening, daemon=True).start()
    return state, mesh, address


OPEN: list[socket.socket] = []  # welcomed links, kept open until the test closes rank 0


def _dial(security: LinkSecurity, address: tuple[str, int]) -> str:
    """Dial as ``security``'s rank toward rank 0: "welcomed", or why not."""
    shake = security.dialling(0)
    try:
        sock = shake.secure(connect_stream(address, time.monotonic() + T), time.monotonic() + T)
        send_encoded(sock, shake.hello(), time.monotonic() + T)
        reply = StreamReader(sock, MessageStream()).read_message(time.monotonic() + T)
        shake.check(reply)
        OPEN.append(sock)
        return "welcomed"
    except (TransportError, OSError) as exc:
        return f"refused: {exc}"


def _wait_refusals(state: GroupState, n: int) -> list[tuple[str, str]]:
    deadline = time.monotonic() + T
    while len(state.refusals) < n and time.monotonic() < deadline:
        time.sleep(0.01)  # polling the state, not waiting for time to pass
    return list(state.refusals)


def test_a_link_key_proves_the_rank_and_a_wrong_one_or_another_ranks_is_refused():
    k1, k2 = os.urandom(32), os.urandom(32)
    secret = GroupCredentials(secret=os.urandom(32))
    state, mesh, address = _rank0(secret, {1: k1, 2: k2})
    try:
        wrong = _dial(LinkSecurity(1, TOKEN, secret, {0: os.urandom(32)}), address)
        as_other = _dial(LinkSecurity(1, TOKEN, secret, {0: k2}), address)  # rank 2's key
        no_proof = _dial(LinkSecurity(1, TOKEN, secret, {2: k2}), address)  # none for rank 0
        right = _dial(LinkSecurity(1, TOKEN, secret, {0: k1}), address)
        refusals = _wait_refusals(state, 3)
    finally:
        state.closing = True  # as Group.close: links ending now are no failure
        mesh.close(1.0)
        while OPEN:
            OPEN.pop().close()
    assert [wrong[:7], as_other[:7], no_proof[:7]] == ["refused"] * 3, (wrong, as_other, no_proof)
    assert right == "welcomed"
    assert len(refusals) == 3, refusals
    assert all("rank-1" in why for _, why in refusals), refusals
    assert [why.split("'rank-1' ")[-1] for _, why in refusals] == [
        "does not know its secret",
        "does not know its secret",
        "sent no proof of its secret",
    ]


def test_a_replayed_hello_is_refused():
    k1 = os.urandom(32)
    secret = GroupCredentials(secret=os.urandom(32))
    listener = LinkSecurity(0, TOKEN, secret, {1: k1})
    dialler = LinkSecurity(1, TOKEN, secret, {0: k1})
    server = listen("127.0.0.1")
    accepted: list[socket.socket] = []

    def accept() -> None:
        conn, _ = server.accept()
        accepted.append(listener.accept(conn, time.monotonic() + T))

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    shake = dialler.dialling(0)
    sock = shake.secure(
        connect_stream(server.getsockname()[:2], time.monotonic() + T), time.monotonic() + T
    )
    t.join(T)
    hello = MessageStream().receive_one(shake.hello().to_bytes())
    try:
        assert listener.admit(hello, 1, accepted[0]) is not None
        with pytest.raises(AuthenticationError, match="replayed"):
            listener.admit(hello, 1, accepted[0])
        with pytest.raises(AuthenticationError, match="rank-2"):  # the same proof, as rank 2
            listener.admit(hello, 2, accepted[0])
    finally:
        sock.close()
        accepted[0].close()
        server.close()


def test_credentials_from_a_directory(enrolments):
    tls = rank_credentials(enrolments["tls"], 3)
    keys = rank_credentials(enrolments["keys"], 3)
    assert tls is not None and tls.tls is not None and tls.tls.cert is not None
    assert tls.secret is not None and tls.hub is not None
    assert keys is not None and keys.tls is not None and keys.tls.cert is None
    with pytest.raises(AuthenticationError, match="rank-7"):
        rank_credentials(enrolments["tls"], 7)
    with pytest.raises(AuthenticationError, match="link keys"):
        LinkSecurity(1, TOKEN, keys, None)  # a secret, and nobody gave out link keys


# --- certificates alone: a group formed without a hub (as under MPI or torch's store) ----------


def _without_a_hub(size: int, credentials: list) -> list:
    """Form a group of ``size`` ranks in threads with MPI's kind of exchange (addresses and a
    token, no link keys), rank ``r`` with ``credentials[r]``; each rank's allreduce result,
    or its error."""
    addresses: list = [None] * size
    met = threading.Barrier(size)
    results: list = [None] * size

    def rank(r: int) -> None:
        def exchange(address):
            addresses[r] = address
            met.wait(T)
            return list(addresses), "7" * 32

        opts = GroupOptions(credentials=credentials[r], timeout=T, connect_timeout=5)
        try:
            with Group._connect(r, size, "127.0.0.1", opts, exchange) as group:
                x = np.full(10, r + 1.0)
                group.allreduce(x)
                results[r] = float(x[0])
        except Exception as exc:  # handed to the test, which asserts on it
            results[r] = exc

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(T)
    return results


def test_certificates_alone_secure_a_group_formed_without_a_hub(enrolments):
    results = _without_a_hub(3, [enrolments["tls"]] * 3)
    assert results == [6.0, 6.0, 6.0], results


def test_without_a_hub_a_secret_alone_is_not_enough(enrolments):
    results = _without_a_hub(2, [enrolments["keys"]] * 2)
    assert all(isinstance(r, AuthenticationError) for r in results), results
    assert "link keys" in str(results[0])


def test_without_a_hub_a_rank_with_another_ranks_certificate_is_refused(enrolments, caplog):
    d = enrolments["tls"]
    as_rank_2 = GroupCredentials(
        tls=TLS(cert=d / "rank-2.pem", key=d / "rank-2.key", ca=d / "ca.pem")
    )
    results = _without_a_hub(3, [d, as_rank_2, d])
    assert all(isinstance(r, RankFailed) for r in results), results
    assert results[0].rank == 1, results  # it never came: rank 0 refused it
    refusals = [r.message for r in caplog.records if "rank 0 refused" in r.message]
    assert any("certificate is for 'rank-2', the hello says 'rank-1'" in m for m in refusals)
