"""``tensorwire bench fl`` for real: a tiny matrix on the namespace testbed, run as users run
it (the CLI in a subprocess), then resumed, then reported alone and compared with another run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pandas as pd
import pytest

pytest.importorskip("torch", reason="torch is not installed (extra 'fl')")

from made_once import made_once
from tensorwire.bench.fl import DONE, protocol_problem
from tensorwire.testbed import probe_capabilities

ROUNDS = 2
FIGURES = ("comm_time", "accuracy", "bytes", "retransmissions", "breakdown")


def _protocols() -> list[str]:
    mqtt = protocol_problem("mqtt")
    if mqtt is not None:
        print(f"mqtt left out: {mqtt}")
    return ["tcp"] + ([] if mqtt else ["mqtt"])


def _bench(out: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tensorwire", "bench", "fl", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "COLUMNS": "200"},  # the table unwrapped, as on a wide terminal
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, str, list[str]]:
    caps = probe_capabilities()
    if caps.mode is None:
        pytest.skip(f"no network namespaces here: {caps['netns'].reason}")
    if not caps.has("tbf"):
        pytest.skip(f"no rate shaping here: {caps['tbf'].reason}")
    protocols = _protocols()

    def make(where: Path) -> str:
        return _bench(
            where / "run",
            "--protocols",
            ",".join(protocols),
            "--models",
            "vgg5",
            "--profiles",
            "4g",
            "--dataset",
            "synthetic",
            "--clients",
            "2",
            "--rounds",
            str(ROUNDS),
        )

    # one run for every worker that takes one of this module's tests
    where, stdout = made_once(tmp_path_factory, "bench-fl", make)
    out = where / "run"
    return out, stdout, protocols


def _own_copy(out: Path, tmp_path: Path) -> Path:
    """A copy of the shared run for a test that changes it (others read it meanwhile)."""
    copy = tmp_path / out.name
    subprocess.run(["cp", "-a", str(out), str(copy)], check=True)
    return copy


def _experiment_dirs(out: Path) -> list[Path]:
    return sorted((out / "experiments").iterdir())


@pytest.mark.slow
def test_run_directory_layout(run):
    out, _, protocols = run
    assert (out / "manifest.json").is_file()
    assert (out / "experiments.parquet").is_file()
    assert (out / "report.html").is_file()
    dirs = _experiment_dirs(out)
    assert sorted(d.name.split("_")[0] for d in dirs) == sorted(protocols)
    for d in dirs:
        for name in ("manifest.json", "rounds.parquet", "transfers.parquet", "counters.parquet"):
            assert (d / name).is_file(), f"{d.name}/{name}"
        assert (d / DONE).is_file()
        assert (d / "logs" / "server.log").is_file()
        assert (d / "logs" / "device-1.log").is_file() and (d / "logs" / "device-2.log").is_file()
        # each experiment has its own figures and report, as DESIGN's results layout says
        page = (d / "report.html").read_text()
        assert f"experiment {d.name}" in page
        for name in ("comm_time", "accuracy", "bytes"):
            assert (d / "figures" / f"{name}.png").is_file(), f"{d.name}/figures/{name}.png"
        assert page.count("data:image/png;base64,") == len(list((d / "figures").glob("*.png")))
    for name in FIGURES:
        assert (out / "figures" / f"{name}.png").is_file()
        assert (out / "figures" / f"{name}.svg").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["shaped"] is True
    assert manifest["matrix"]["protocols"] == protocols
    assert "capabilities" in manifest and "git_commit" in manifest and "versions" in manifest


def test_the_table_is_printed_with_the_report_path(run):
    out, stdout, protocols = run
    print(stdout)
    for protocol in protocols:
        assert re.search(rf"\b{protocol}\b", stdout)
    assert "comm/bound" in stdout
    assert f"report: {out / 'report.html'}" in stdout.replace("\n", "")


def test_parquet_contents_per_round(run):
    out, _, protocols = run
    frame = pd.read_parquet(out / "experiments.parquet")
    assert len(frame) == len(protocols) * ROUNDS
    assert set(frame["protocol"]) == set(protocols)
    assert set(frame["round"]) == set(range(1, ROUNDS + 1))
    assert (frame["shaped"]).all() and set(frame["label"]) == {"netns 4g: 20 Mbit/s"}
    assert (frame["rate_down_bps"] == 20e6).all() and (frame["rate_up_bps"] == 20e6).all()
    for column in ("comm_s", "lower_bound_s", "payload_bytes", "wire_bytes", "accuracy"):
        assert (frame[column] > 0).all(), column
    over_tcp = ~frame["protocol"].isin(["udp", "udp-best-effort", "quic"])
    assert (frame.loc[over_tcp, "retrans_segs"] >= 0).all()
    assert frame.loc[~over_tcp, "retrans_segs"].isna().all()  # n/a: their data is not TCP's
    # the shaped links cannot beat their rate, and should not be far above it
    assert (frame["comm_over_bound"] > 1.0).all()
    assert (frame["comm_over_bound"] < 1.5).all(), frame[["protocol", "comm_over_bound"]]
    # frames on the links: the messages plus headers and ACKs, not much more
    ratio = frame["wire_bytes"] / frame["payload_bytes"]
    assert ((ratio > 1.0) & (ratio < 1.2)).all(), ratio
    split = frame["encode_s"] + frame["wait_s"] + frame["wire_s"] + frame["decode_s"]
    assert split.to_numpy() == pytest.approx(frame["comm_s"].to_numpy(), rel=0.05)
    counters = pd.read_parquet(_experiment_dirs(out)[0] / "counters.parquet")
    assert list(dict.fromkeys(counters["point"])) == ["start", "round", "end"]
    assert {"srv", "dev1", "dev2"} <= set(counters["node"])


def test_report_embeds_every_figure_and_names_the_profile(run):
    out, _, _ = run
    page = (out / "report.html").read_text()
    for name in FIGURES:
        assert f'data-figure="{name}"' in page
    assert page.count("data:image/png;base64,") == len(list((out / "figures").glob("*.png")))
    assert "4g: 20 Mbit/s" in page and "unshaped loopback" not in page


def test_a_second_run_skips_what_is_done(run, tmp_path):
    out, protocols = _own_copy(run[0], tmp_path), run[2]
    stamps = {d.name: (d / DONE).stat().st_mtime_ns for d in _experiment_dirs(out)}
    stdout = _bench(out, "--resume", str(out))
    assert f"0 experiment(s) run, {len(protocols)} done before" in stdout
    assert {d.name: (d / DONE).stat().st_mtime_ns for d in _experiment_dirs(out)} == stamps


def test_an_interrupted_experiment_is_run_again(run, tmp_path):
    out, _, protocols = run
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(out), str(copy)], check=True)
    redo = _experiment_dirs(copy)[0]
    (redo / DONE).unlink()
    stdout = _bench(copy, "--resume", str(copy))
    assert f"1 experiment(s) run, {len(protocols) - 1} done before" in stdout
    assert (redo / DONE).is_file()


def test_report_command_rebuilds_one_run_and_compares_two(run, tmp_path):
    out = _own_copy(run[0], tmp_path)
    (out / "report.html").unlink()
    subprocess.run(
        [sys.executable, "-m", "tensorwire", "report", str(out)], check=True, timeout=120
    )
    assert (out / "report.html").is_file()
    other = tmp_path / "other"
    subprocess.run(["cp", "-a", str(out), str(other)], check=True)
    compared = tmp_path / "compared"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tensorwire",
            "report",
            str(out),
            str(other),
            "--out",
            str(compared),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert str(compared / "report.html") in done.stdout.replace("\n", "")
    page = (compared / "report.html").read_text()
    assert "comparison" in page
    assert f'<td class="text">{out.name}</td>' in page  # the key numbers, per run
    assert f'<td class="text">{other.name}</td>' in page
    frame = pd.read_parquet(compared / "experiments.parquet")
    assert set(frame["run"]) == {out.name, other.name}
    for name in FIGURES:
        assert f'data-figure="{name}"' in page


def test_without_namespaces_it_says_so_and_labels_everything_unshaped_loopback(
    monkeypatch, tmp_path
):
    from tensorwire.bench import fl
    from tensorwire.bench.fl_matrix import Matrix
    from tensorwire.testbed import Capabilities, Capability

    no = Capability(False, "not allowed in this test")
    for module in (fl.feasibility, fl.runner):
        monkeypatch.setattr(
            module,
            "probe_capabilities",
            lambda: Capabilities({"root": no, "userns": no, "netns": no}),
        )
    said: list[str] = []
    matrix = Matrix(protocols=("tcp",), losses=(0.0, 0.1), dataset="synthetic", clients=2, rounds=1)
    summary = fl.run_matrix(matrix, tmp_path / "run", say=said.append, show_progress=False)
    assert any("no network namespaces here" in s and "unshaped loopback" in s for s in said)
    assert summary.label == "unshaped loopback"
    assert len(summary.ran) == 1 and not summary.failed
    assert "packet loss needs the namespace testbed" in next(iter(summary.skipped.values()))
    frame = pd.read_parquet(tmp_path / "run" / "experiments.parquet")
    assert set(frame["label"]) == {"unshaped loopback"} and not frame["shaped"].any()
    assert frame["lower_bound_s"].isna().all()  # no link rate, no bound
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["label"] == "unshaped loopback" and manifest["shaped"] is False
    page = summary.report.read_text()
    assert "unshaped loopback" in page and "packet loss needs the namespace testbed" in page
    # the server took a port the kernel gave it (none picked here and bound later), and the
    # devices were sent to that one
    (progress,) = (tmp_path / "run").rglob("progress.jsonl")
    events = [json.loads(line) for line in progress.read_text().splitlines()]
    ready = next(e for e in events if e["event"] == "ready")
    device_url = json.loads((progress.parent / "manifest.json").read_text())["device_url"]
    assert urlsplit(ready["url"]).port == urlsplit(device_url).port != 0


@pytest.mark.parametrize("protocol", ["tcp", "udp", "zmq", "flight", "quic"])
def test_on_loopback_the_server_asks_for_port_0_and_devices_go_where_it_listens(protocol):
    from tensorwire.bench.fl.endpoints import endpoints
    from tensorwire.bench.fl_matrix import Matrix
    from tensorwire.testbed import LoopbackTestbed

    (exp,) = Matrix(protocols=(protocol,), dataset="synthetic", clients=2, rounds=1).experiments()
    with endpoints(LoopbackTestbed(devices=2), exp) as ends:
        assert urlsplit(ends.server_url).port == 0 and ends.bound is not None
        there = ends.bound(43210)
    assert urlsplit(there.device_url).port == 43210
    assert all(urlsplit(ends.url_of(i)).port == 0 for i in (1, 2))
    assert all(urlsplit(there.url_of(i)).port == 43210 for i in (1, 2))
