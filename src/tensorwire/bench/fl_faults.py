"""Faults for ``tensorwire bench fl --faults``: devices killed, hung, links flapped, the broker
restarted, at chosen rounds of a run, so the report can show what each costs against the
same run without them.

A scenario is ``none`` or events joined by ``+``:

- ``kill@R`` / ``killN@R``: SIGKILL N devices (default 1) in round R; ``kill@R-S`` restarts
  them (same id, a fresh process) when round S starts.
- ``hang@R`` / ``hangN@R``: SIGSTOP N devices in round R (the process stays, its sockets stay
  open, nothing answers); ``hang@R-S`` lets them go on (SIGCONT) when round S starts.
- ``flap@R`` / ``flapN@R`` / ``flap@R:Ts``: N devices' links go down in round R for T seconds
  (default 5), then up again.
- ``broker@R`` / ``broker@R:Ts``: the broker is restarted in round R, down for T seconds
  (default 2); only for protocols with a broker.

Events take devices from the last one down, in the order they are written, never one device
twice: ``kill@2-4+hang@3`` kills device 4 in round 2 (back in round 4) and hangs device 3 in
round 3. Rounds start at 2 at the earliest (round 1 is when the devices join). An event "in
round R" happens :data:`INJECT_AFTER_S` seconds after round R started, while the model is on
its way or the devices train.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Callable
from typing import Any

KINDS = ("kill", "hang", "flap", "broker")
NONE = "none"
INJECT_AFTER_S = 1.0  # seconds into the round at which an event happens
FLAP_S = 5.0  # default seconds a flapped link stays down
BROKER_DOWN_S = 2.0  # default seconds a restarted broker stays down

_EVENT = re.compile(
    r"^(?P<kind>[a-z]+)(?P<count>\d+)?@(?P<round>\d+)(?:-(?P<until>\d+))?(?::(?P<seconds>[\d.]+)s?)?$"
)


class FaultSpecError(ValueError):
    """A ``--faults`` scenario that does not parse or cannot happen in the run."""


@dataclasses.dataclass(frozen=True)
class FaultEvent:
    """One event of a scenario: ``kind`` on ``devices`` (device numbers, 1-based; none for
    the broker) in round ``round``; ``until`` the round at which a killed device restarts or
    a hung one goes on (None: never); ``seconds`` a flap's or a broker restart's length."""

    kind: str
    round: int
    devices: tuple[int, ...] = ()
    until: int | None = None
    seconds: float | None = None

    def describe(self) -> str:
        who = "the broker" if self.kind == "broker" else _devices(self.devices)
        what = {
            "kill": "killed (SIGKILL)",
            "hang": "hung (SIGSTOP)",
            "flap": f"link down for {self.seconds or FLAP_S:g} s",
            "broker": f"restarted (down {self.seconds or BROKER_DOWN_S:g} s)",
        }[self.kind]
        text = f"{who} {what} in round {self.round}"
        if self.until is not None:
            text += f", {'restarted' if self.kind == 'kill' else 'going on'} in round {self.until}"
        return text


def _devices(devices: tuple[int, ...]) -> str:
    names = ", ".join(str(d) for d in devices)
    return f"device{'s' if len(devices) > 1 else ''} {names}"


def parse_scenario(text: str, clients: int, rounds: int) -> tuple[FaultEvent, ...]:
    """The events of scenario ``text`` for a run of ``clients`` devices and ``rounds``
    rounds (``()`` for ``none``); :class:`FaultSpecError` names what is wrong."""
    text = text.strip().lower()
    if text in ("", NONE):
        return ()
    events: list[FaultEvent] = []
    next_device = clients
    for part in text.split("+"):
        m = _EVENT.match(part.strip())
        if m is None or m["kind"] not in KINDS:
            raise FaultSpecError(
                f"fault {part!r}: write kind[N]@ROUND[-BACK][:SECONDSs] with kind one of "
                f"{', '.join(KINDS)}, e.g. kill@2-4, hang@3, flap@2:5s, broker@2"
            )
        kind, r = m["kind"], int(m["round"])
        count = int(m["count"]) if m["count"] else 1
        until = int(m["until"]) if m["until"] else None
        seconds = float(m["seconds"]) if m["seconds"] else None
        if not 2 <= r <= rounds:
            raise FaultSpecError(
                f"fault {part!r}: round {r} is not in 2..{rounds} (round 1 is when devices join)"
            )
        if until is not None and (kind not in ("kill", "hang") or not r < until <= rounds):
            raise FaultSpecError(
                f"fault {part!r}: only kill and hang take -BACK, a round after {r} and at "
                f"most {rounds}"
            )
        if seconds is not None and kind not in ("flap", "broker"):
            raise FaultSpecError(f"fault {part!r}: only flap and broker take :SECONDS")
        if kind == "broker":
            if m["count"]:
                raise FaultSpecError(f"fault {part!r}: there is one broker")
            events.append(FaultEvent(kind, r, (), None, seconds or BROKER_DOWN_S))
            continue
        if count < 1 or count > next_device:
            raise FaultSpecError(
                f"fault {part!r}: {count} device(s), but only {next_device} of {clients} are "
                "left for it (events never take a device twice)"
            )
        devices = tuple(range(next_device, next_device - count, -1))
        next_device -= count
        default = FLAP_S if kind == "flap" else None
        events.append(FaultEvent(kind, r, devices, until, seconds or default))
    return tuple(events)


def needs_broker(events: tuple[FaultEvent, ...]) -> bool:
    return any(e.kind == "broker" for e in events)


def needs_links(events: tuple[FaultEvent, ...]) -> bool:
    return any(e.kind == "flap" for e in events)


@dataclasses.dataclass
class FaultActions:
    """What an injector does to the run; the benchmark gives its processes and testbed."""

    kill: Callable[[int], None]  # SIGKILL device i's processes
    stop: Callable[[int], None]  # SIGSTOP device i
    resume: Callable[[int], None]  # SIGCONT device i
    restart: Callable[[int], None]  # start device i again (same id)
    link: Callable[[int, bool], None]  # device i's link down (False) or up (True)
    restart_broker: Callable[[float], None]  # stop the broker, wait, start it: blocks


class FaultInjector:
    """Carries out a scenario's events as the run's rounds start: :meth:`round_started` when
    the server begins round r, :meth:`tick` often (it does what is due; a broker restart runs
    on a thread of its own so the rounds' bookkeeping goes on). Every action is logged with
    its time in :attr:`log` (JSON-ready rows), and :meth:`finish` undoes what is still in
    effect (hung devices go on, links come up) so the run can end cleanly."""

    def __init__(
        self,
        events: tuple[FaultEvent, ...],
        actions: FaultActions,
        *,
        after_s: float = INJECT_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.events = events
        self.actions = actions
        self.after_s = after_s
        self.clock = clock
        self.log: list[dict[str, Any]] = []
        self.killed: set[int] = set()  # devices whose exit is the plan's, not a failure
        self._due: list[tuple[float, int, str, Callable[[], None]]] = []
        self._hung: set[int] = set()
        self._down: set[int] = set()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._seq = 0

    def round_started(self, r: int) -> None:
        """Round ``r`` began now: schedule its events, and bring back what returns in it."""
        now = self.clock()
        for event in self.events:
            if event.until == r:
                for d in event.devices:
                    if event.kind == "kill":
                        self._at(now, r, f"restart device {d}", self._restart(d))
                    else:
                        self._at(now, r, f"continue device {d}", self._resume(d))
            if event.round != r:
                continue
            when = now + self.after_s
            if event.kind == "broker":
                seconds = event.seconds or BROKER_DOWN_S
                self._at(when, r, f"restart the broker ({seconds:g} s down)", self._broker(seconds))
            for d in event.devices:
                if event.kind == "kill":
                    self._at(when, r, f"kill device {d}", self._kill(d))
                elif event.kind == "hang":
                    self._at(when, r, f"hang device {d}", self._stop(d))
                elif event.kind == "flap":
                    self._at(when, r, f"link of device {d} down", self._link(d, False))
                    up = when + (event.seconds or FLAP_S)
                    self._at(up, r, f"link of device {d} up", self._link(d, True))

    def tick(self) -> None:
        """Do every action that is due."""
        now = self.clock()
        due = sorted(a for a in self._due if a[0] <= now)
        self._due = [a for a in self._due if a[0] > now]
        for when, _, what, action in due:
            action()
            self._record(what, when)

    def finish(self) -> None:
        """Undo what is still in effect: pending link-ups happen now, hung devices go on;
        wait (bounded) for a broker restart in progress."""
        self._due.clear()
        for d in sorted(self._down):
            self.actions.link(d, True)
            self._record(f"link of device {d} up (at the end)", self.clock())
        self._down.clear()
        for d in sorted(self._hung):
            self.actions.resume(d)
        self._hung.clear()
        for thread in self._threads:
            thread.join(timeout=60.0)

    # -- scheduling ------------------------------------------------------------------------

    def _at(self, when: float, r: int, what: str, action: Callable[[], None]) -> None:
        self._seq += 1
        self._due.append((when, self._seq, f"round {r}: {what}", action))

    def _record(self, what: str, when: float) -> None:
        with self._lock:
            self.log.append({"action": what, "due": when, "at": self.clock(), "time": time.time()})

    def _kill(self, d: int) -> Callable[[], None]:
        def act() -> None:
            self.killed.add(d)
            self._hung.discard(d)
            self.actions.kill(d)

        return act

    def _restart(self, d: int) -> Callable[[], None]:
        def act() -> None:
            self.killed.discard(d)
            self.actions.restart(d)

        return act

    def _stop(self, d: int) -> Callable[[], None]:
        def act() -> None:
            self._hung.add(d)
            self.actions.stop(d)

        return act

    def _resume(self, d: int) -> Callable[[], None]:
        def act() -> None:
            self._hung.discard(d)
            self.actions.resume(d)

        return act

    def _link(self, d: int, up: bool) -> Callable[[], None]:
        def act() -> None:
            (self._down.discard if up else self._down.add)(d)
            self.actions.link(d, up)

        return act

    def _broker(self, seconds: float) -> Callable[[], None]:
        def act() -> None:
            def run() -> None:
                try:
                    self.actions.restart_broker(seconds)
                except Exception as exc:  # said in the log; the run shows what it cost
                    self._record(f"broker restart failed: {type(exc).__name__}: {exc}", 0.0)
                else:
                    self._record("broker back", 0.0)

            thread = threading.Thread(target=run, name="tw-fault-broker", daemon=True)
            self._threads.append(thread)
            thread.start()

        return act
