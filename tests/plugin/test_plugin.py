"""A third-party package adds a transport and a codec through entry points, without editing
tensorwire: installed with pip (into a directory of its own, put on the path of the processes
below), its scheme works in serve / connect, its codec in the registry and in a session's
announcement, and the benchmark and the CLI list and run its transport."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).with_name("toy_plugin_pkg")


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """The environment of a process that has the toy plugin installed."""
    work = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(PACKAGE, work / "src")  # the build writes beside its sources
    site = work / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
        timeout=300,
    )
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def _python(env: dict[str, str], code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_its_scheme_and_codec_work_in_serve_and_connect(env):
    out = _python(
        env,
        """
import numpy as np
import tensorwire
from tensorwire.codecs import available_codecs, get_codec

assert "toyxor" in available_codecs()
raw = np.arange(1000, dtype=np.float32)
codec = get_codec({"id": "toyxor"})
assert bytes(codec.encode(raw)) != raw.tobytes()
assert np.array_equal(np.frombuffer(codec.decode(codec.encode(raw)), np.float32), raw)
with tensorwire.serve("toy+tcp://127.0.0.1:0") as hub:
    assert hub.url.startswith("toy+tcp://") and hub.protocol == "toy"
    with tensorwire.connect(hub.url, client_id="plugged") as ch:
        hub.wait_for(1, timeout=30)
        ch.send({"x": raw}, timeout=30)
        who, msg = hub.recv(timeout=30)
        assert who == "plugged" and np.array_equal(msg["x"], raw)
        assert "toyxor" in hub._members["plugged"].decoders  # announced in its hello
print("ok")
""",
    )
    assert out.strip() == "ok"


def test_the_benchmark_and_the_cli_list_and_run_its_transport(env, tmp_path):
    out = _python(
        env,
        "from tensorwire.bench.fl_matrix import registered_protocols; "
        "print(' '.join(registered_protocols()))",
    )
    assert "toy" in out.split()
    helped = subprocess.run(
        [sys.executable, "-m", "tensorwire", "bench", "fl", "--help"],
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert helped.returncode == 0 and " toy" in helped.stdout, helped.stdout
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "tensorwire",
            "bench",
            "transfer",
            "--transports",
            "toy",
            "--baselines",
            "",
            "--repeat",
            "1",
            "--dtypes",
            "float32",
            "--shapes",
            "100x100",
            "--big-mib",
            "0",
            "--rss-gib",
            "0",
            "--out",
            str(tmp_path / "results"),
        ],
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "tensorwire-toy" in ran.stdout, ran.stdout


def test_a_broken_plugin_is_skipped_with_a_warning_and_the_rest_works(env, tmp_path):
    broken = tmp_path / "broken"
    dist = broken / "tensorwire_broken-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorwire-broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[tensorwire.transports]\nbroken = no_such_module:ENTRY\n"
    )
    path = os.pathsep.join((str(broken), env["PYTHONPATH"]))
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import tensorwire.transports as t; print(sorted(e.name for e in t.transports()))",
        ],
        env={**env, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "'toy'" in done.stdout and "'tcp'" in done.stdout
    assert "skipped the plugin broken = no_such_module:ENTRY" in done.stderr
