"""The ZeroMQ context a process's zmq+tcp:// channels share (``transports/zmq/context.py``):
room for hundreds of channels, its own (a program ending pyzmq's global context keeps its
channels), and a close that returns once libzmq has ended the channel's socket.

That last one matters because libzmq 4.3.5 aborts the process (``session_base.cpp:233``)
when a connection fails while a closed socket's session is still ending in the middle of a
multipart message. A channel whose send timed out against a hub that reads nothing is in
that state. Before the close waited, a hub closing right after such a close killed a child
playing this sequence in 8 runs of 9 (6 of 6 with 30 rounds, 2 of 3 with 12).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("zmq", reason="pyzmq is not installed (extra 'zmq')")

from zmq_helpers import T, fixture_hub  # noqa: F401  (a fixture: hub)

import tensorwire

HERE = str(Path(__file__).parent)
ROUNDS = 30
CHANNELS = 400  # 1,200 sockets: past libzmq's default of 1,023 per context


def _child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), HERE, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_one_process_holds_hundreds_of_channels(hub):
    channels = []
    try:
        for i in range(CHANNELS):
            channels.append(tensorwire.connect(hub.url, client_id=f"c{i}", timeout=T))
        hub.wait_for(CHANNELS, timeout=T)
        result = hub.broadcast({"w": np.arange(4)}, timeout=T)
        assert len(result) == CHANNELS and not result.failed
        assert all((ch.recv(timeout=T)["w"] == np.arange(4)).all() for ch in channels)
    finally:
        for ch in channels:
            ch.close()


def test_a_program_ending_pyzmqs_global_context_keeps_its_channels():
    done = _child(
        """
        import sys
        import numpy as np, zmq
        sys.path.insert(0, sys.argv[1])
        import tensorwire
        from zmq_helpers import T

        with tensorwire.serve("zmq+tcp://127.0.0.1:0") as hub:
            with tensorwire.connect(hub.url, client_id="c", timeout=T) as ch:
                hub.wait_for(1, timeout=T)
                zmq.Context.instance().term()  # the program's own ZeroMQ, ended
                hub.broadcast({"w": np.arange(3)}, timeout=T)
                print(ch.recv(timeout=T)["w"].tolist())
        """
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.strip() == "[0, 1, 2]"


def test_a_hub_that_goes_away_right_after_a_close_mid_message_does_not_abort_the_process():
    done = _child(
        """
        import sys, threading
        import numpy as np, zmq
        sys.path.insert(0, sys.argv[1])
        import tensorwire
        from tensorwire.errors import TransportTimeout
        from zmq_helpers import T, fake_welcome

        piece = np.ones(1 << 18, np.float32)  # 1 MiB: a multipart ZeroMQ message
        for i in range(int(sys.argv[2])):
            ctx = zmq.Context()
            fake = ctx.socket(zmq.ROUTER)
            fake.rcvhwm = 4
            port = fake.bind_to_random_port("tcp://127.0.0.1")
            t = threading.Thread(target=fake_welcome, args=(fake,))
            t.start()
            ch = tensorwire.connect(f"zmq+tcp://127.0.0.1:{port}", client_id="c", timeout=T,
                                    codec=None)
            t.join(T)
            try:
                for _ in range(1000):  # the fake hub reads nothing more: a send times out
                    ch.send({"v": piece}, timeout=0.5)
                sys.exit("no send timed out")
            except TransportTimeout:
                pass
            # A close without a goodbye (what a channel does when the hub said bye, or a
            # connection failed): close() says one and lingers, which hides the race.
            ch._drop()
            ctx.destroy(linger=0)  # the hub goes away at once, resetting the connection
            print("round", i, flush=True)
        """,
        str(ROUNDS),
    )
    rounds = done.stdout.count("round")
    assert done.returncode == 0, f"died after {rounds} rounds: {done.stderr[-500:]}"
    assert rounds == ROUNDS
