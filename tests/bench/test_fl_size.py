"""Issue 13, items 3-5: model size (ResNet-18, ``--payload`` updates that do not train), mixed
links (per-device times, what dropping the slowest buys), and the report for people who
compare (protocols ranked per condition with CIs, comm / bound on its own axis, verdicts)."""

from __future__ import annotations

import json
import math

import matplotlib

matplotlib.use("Agg")
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from tensorwire.bench import fl_figures
from tensorwire.bench.fl_figures import draw_figures, t95
from tensorwire.bench.fl_matrix import Experiment, Matrix, registered_protocols
from tensorwire.bench.fl_ranking import paired_ratio, ranking_table, section_html, verdicts
from tensorwire.bench.fl_results import device_frame
from tensorwire.bench.topology_report import mixed_links_table
from tensorwire.fl.config import FLConfig, is_builtin_model, payload_bytes

torch = pytest.importorskip("torch", reason="torch is not installed (extra 'fl')")

from tensorwire.fl.models import Payload, build_model, count_parameters, model_bytes  # noqa: E402
from tensorwire.fl.strategies import model_update  # noqa: E402
from tensorwire.fl.train import ArrayData, state_to_numpy, train_model  # noqa: E402

# Two protocols the figures can tell apart, whatever the registry holds besides tcp.
OTHER = next(p for p in registered_protocols() if p not in ("tcp", "udp"))


# --- models --------------------------------------------------------------------------------


def test_resnet18_is_the_cifar_variant_of_11_million_parameters():
    model = build_model("resnet18")
    assert count_parameters(model) == 11_173_962
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    first = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    assert first.kernel_size == (3, 3) and first.stride == (1, 1)  # CIFAR stem
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in model.modules())
    assert 44e6 < model_bytes("resnet18") < 46e6


@pytest.mark.parametrize(
    ("name", "size"),
    [("payload:10MB", 10_000_000), ("payload:1.5kb", 1_500), ("payload:2GB", 2 * 10**9)],
)
def test_payload_names_give_their_size(name, size):
    assert payload_bytes(name) == size
    assert is_builtin_model(name)
    FLConfig(model=name)  # a run accepts it


@pytest.mark.parametrize("name", ["vgg5", "payload:10", "payload:MB", "payload:10XB"])
def test_other_names_are_no_payload(name):
    assert payload_bytes(name) is None


def test_a_payload_too_small_to_hold_the_head_is_refused():
    with pytest.raises(ValueError, match="at least 64 bytes"):
        payload_bytes("payload:10B")


def test_a_payload_state_is_its_size_in_tensors_of_at_most_8_mb():
    state = state_to_numpy(build_model("payload:20MB"))
    assert sum(v.nbytes for v in state.values()) == 20_000_000
    assert max(v.nbytes for v in state.values()) <= 8 * 2**20
    assert len(state) > 2  # spread over several tensors, as a real model's layers are


def test_a_payload_trains_in_no_time_and_its_update_is_its_size():
    model = Payload(4_000_000)
    before = state_to_numpy(model)
    rng = np.random.default_rng(0)
    data = ArrayData(
        rng.standard_normal((300, 3, 32, 32)).astype(np.float32),
        rng.integers(0, 10, 300).astype(np.int64),
    )
    train_model(Payload(1000), data, epochs=1)  # torch's one-time costs (its first step)
    result = train_model(model, data, epochs=1, batch_size=100)
    after = state_to_numpy(model)
    update = model_update(after, before)
    assert sum(v.nbytes for v in update.values()) == 4_000_000
    assert result.seconds < 1.0
    for key in before:
        if key.startswith("payload."):
            np.testing.assert_array_equal(after[key], before[key])  # never trained
    assert not np.array_equal(after["bias"], before["bias"])  # a real SGD step ran
    assert float(np.std(before["payload.0"])) > 0.5  # random, not zeros a codec would shrink


# --- the matrix and the command line -------------------------------------------------------


def test_a_payload_experiment_has_a_directory_safe_key():
    exp = Experiment("tcp", model="payload:10MB", profile="wifi")
    assert exp.key.startswith("tcp_payload-10mb_wifi_")
    assert ":" not in exp.key
    assert Experiment("tcp").key.startswith("tcp_vgg5_4g_")  # keys of before stay


def test_payload_sizes_join_the_models_axis():
    from tensorwire.cli.bench_fl import _check_fl_choices, _models_and_payloads

    assert _models_and_payloads(None, "1MB,10MB") == ("payload:1MB", "payload:10MB")
    assert _models_and_payloads("resnet18", "1MB") == ("resnet18", "payload:1MB")
    assert _models_and_payloads(None, None) is None
    _check_fl_choices({"models": ("resnet18", "payload:1MB"), "dataset": None})
    import typer

    with pytest.raises(typer.BadParameter, match="payload"):
        _check_fl_choices({"models": ("payload:12XB",), "dataset": None})
    with pytest.raises(typer.BadParameter, match="at least 64 bytes"):
        _check_fl_choices({"models": ("payload:1B",), "dataset": None})


def test_the_estimate_knows_payloads_resnet_and_mixed_links():
    from tensorwire.cli.app import estimate_seconds

    def one(**fields) -> float:
        return estimate_seconds(Matrix(protocols=("tcp",), rounds=1, **fields), cores=2)

    mixed = one(links=(("3g", "4g", "4g", "wifi"),))  # its profile is 'mixed': no rate
    assert mixed == pytest.approx(one(profiles=("3g",)))  # the slowest link's
    big, small = one(models=("payload:100MB",)), one(models=("payload:1MB",))
    assert big - small == pytest.approx(2 * 99e6 * 8 / 20e6)  # no training, 4g both ways
    assert one(models=("resnet18",)) > one(models=("vgg8",))


# --- per-device times ----------------------------------------------------------------------


def _device_experiment(tmp_path, protocol, rep, slow_up):
    """A mixed star of three devices whose updates reach the server at 2, 3 and 3 + slow_up s."""
    d = tmp_path / f"{protocol}-{rep}"
    d.mkdir()
    manifest = {
        "key": d.name,
        "label": "netns",
        "experiment": {
            "protocol": protocol,
            "model": "vgg5",
            "profile": "mixed",
            "loss": 0.0,
            "rep": rep,
            "links": ["wifi", "4g", "3g"],
        },
        "device_rate_bps": {f"device-{i}": {"downlink": 1e6, "uplink": 1e6} for i in (1, 2, 3)},
    }
    (d / "manifest.json").write_text(json.dumps(manifest))
    rows = []
    for r in (1, 2):
        start = 1000.0 * r
        for i, up in ((1, 1.0), (2, 2.0), (3, 2.0 + slow_up)):
            dev = f"device-{i}"
            rows += [
                {"round": r, "side": "server", "role": "send", "direction": "downlink",
                 "device": dev, "started_at": start, "wall_s": 0.5, "e2e_s": None},
                {"round": r, "side": "device", "role": "recv", "direction": "downlink",
                 "device": dev, "started_at": start, "wall_s": 0.5, "e2e_s": 1.0},
                {"round": r, "side": "server", "role": "recv", "direction": "uplink",
                 "device": dev, "started_at": start + 1.0, "wall_s": up, "e2e_s": up},
            ]  # fmt: skip
    pd.DataFrame(rows).to_parquet(d / "transfers.parquet")
    return d


def test_each_device_says_when_the_server_had_its_update(tmp_path):
    devices = device_frame(_device_experiment(tmp_path, "tcp", 0, slow_up=4.0))
    assert list(devices["link"][:3]) == ["wifi", "4g", "3g"]
    np.testing.assert_allclose(devices["finished_s"][:3], [2.0, 3.0, 7.0])
    np.testing.assert_allclose(devices["comm_s"][:3], [2.0, 3.0, 7.0])


def test_the_mixed_table_says_what_dropping_the_slowest_would_have_bought(tmp_path):
    devices = pd.concat(
        [
            device_frame(_device_experiment(tmp_path, "tcp", 0, slow_up=4.0)),
            device_frame(_device_experiment(tmp_path, "udp", 0, slow_up=1.5)),
        ],
        ignore_index=True,
    )
    table = mixed_links_table(devices).set_index("protocol")
    assert table.loc["tcp", "slowest_link"] == "3g"
    assert table.loc["tcp", "round_s"] == pytest.approx(7.0)
    assert table.loc["tcp", "without_slowest_s"] == pytest.approx(3.0)
    assert table.loc["udp", "drop_saves_s"] == pytest.approx(1.5)


def test_the_device_figure_shows_each_device_and_the_round_without_the_slowest(tmp_path):
    devices = pd.concat(
        [
            device_frame(_device_experiment(tmp_path, p, rep, slow_up))
            for p, slow_up in (("tcp", 4.0), ("udp", 1.5))
            for rep in (0, 1)
        ],
        ignore_index=True,
    )
    devices["series"] = devices["protocol"]
    frame = _frame(protocols=("tcp", "udp"), reps=2)
    figures = {f.name: f for f in draw_figures(frame, tmp_path / "fig", devices)}
    fig = figures["device_times"]
    assert "95 % confidence interval" in fig.caption
    svg = fig.svg.read_text()
    assert "<!-- without the slowest device -->" in svg and "<!-- 3g -->" in svg


# --- the ranking, the ratio figure and the verdicts ----------------------------------------


def _frame(protocols=("tcp", "udp"), reps=3, profiles=("3g", "wifi"), models=("vgg5",)):
    """Per-round rows: udp takes 0.6 of tcp's time at 3g and, give or take 10 ms, the same at
    wifi; each repetition scales both (a machine's load)."""
    rows = []
    for protocol, rep, profile, model in _product(protocols, range(reps), profiles, models):
        factor = 0.6 if (protocol != "tcp" and profile == "3g") else 1.0
        size = payload_bytes(model) or 2e6
        bound = size * 8 / (5e6 if profile == "3g" else 60e6)
        for r in (1, 2):
            noisy = protocol != "tcp" and profile == "wifi"
            noise = 0.01 * (-1) ** rep if noisy else 0.0  # either side of tcp
            comm = bound * 1.2 * factor * (1 + 0.1 * rep) + noise
            rows.append(
                {
                    "key": f"{protocol}_{profile}_{model}_{rep}",
                    "protocol": protocol,
                    "series": protocol,
                    "model": model,
                    "profile": profile,
                    "loss": 0.0,
                    "stress": "none",
                    "codec": "none",
                    "epochs": 1,
                    "security": "none",
                    "topology": "star",
                    "links": "uniform",
                    "rep": rep,
                    "round": r,
                    "rounds_total": 2,
                    "label": "netns",
                    "shaped": True,
                    "accuracy": 0.5,
                    "comm_s": comm,
                    "lower_bound_s": bound,
                    "encode_s": 0.001,
                    "decode_s": 0.001,
                    "wire_s": comm,
                    "payload_bytes": 2 * size,
                    "wire_bytes": 2.1 * size,
                    "retrans_segs": 0.0,
                }
            )
    return pd.DataFrame(rows)


def _product(*axes):
    import itertools

    return itertools.product(*axes)


def test_protocols_are_ranked_per_condition_with_a_95_percent_ci():
    table = ranking_table(_frame())
    three_g = table[table["condition"] == "3g"]
    assert list(three_g["series"]) == ["udp", "tcp"]
    assert list(three_g["rank"]) == [1, 2]
    tcp = three_g.set_index("series").loc["tcp"]
    each = [3.2 * 1.2 * (1 + 0.1 * rep) for rep in range(3)]  # 2 MB over 5 Mbit/s = 3.2 s
    assert tcp["comm_s"] == pytest.approx(np.mean(each))
    assert tcp["comm_ci"] == pytest.approx(t95(3) * np.std(each, ddof=1) / math.sqrt(3))
    assert tcp["x_fastest"] == pytest.approx(1 / 0.6, rel=1e-2)
    assert tcp["ratio"] == pytest.approx(1.2 * np.mean([1.0, 1.1, 1.2]))


def test_a_verdict_gives_the_factor_and_its_paired_ci():
    said = verdicts(_frame())
    three_g = next(s for s in said if s.startswith("3g:"))
    assert "udp is 1.67x faster than tcp" in three_g
    assert "95 % CI 1.6" in three_g and "3 repetitions paired" in three_g
    wifi = next(s for s in said if s.startswith("wifi:"))
    assert "not told apart at 95 %" in wifi  # 10 ms either way: within the noise


def test_one_repetition_gives_no_interval_and_tells_nothing_apart():
    said = verdicts(_frame(reps=1))
    assert said and all("not told apart: one repetition, no confidence interval" in s for s in said)
    assert not any(" is " in s and "x faster than" in s for s in said)  # no claim
    table = ranking_table(_frame(reps=1))
    assert set(table["rank"]) == {1} and table["tied"].all()  # even 0.6x: one repetition
    html = section_html(_frame(reps=1))
    assert "± " not in html.split("</th></tr>")[1]  # no ± without two repetitions
    assert "<td>1=</td>" in html


def test_protocols_within_each_others_interval_share_a_rank():
    table = ranking_table(_frame())
    wifi = table[table["condition"] == "wifi"]
    assert list(wifi["rank"]) == [1, 1] and wifi["tied"].all()  # 10 ms either way
    three_g = table[table["condition"] == "3g"]
    assert not three_g["tied"].any()  # 0.6x, three repetitions: told apart


def test_the_paired_ratio_takes_the_geometric_mean_of_the_repetitions():
    slow = pd.DataFrame({"rep": [0, 1], "comm_s": [2.0, 8.0]})
    fast = pd.DataFrame({"rep": [0, 1], "comm_s": [1.0, 2.0]})
    factor, low, high, n = paired_ratio(slow, fast)
    assert (factor, n) == (pytest.approx(math.sqrt(2 * 4)), 2)
    assert low < factor < high


def test_the_ratio_figure_does_not_start_at_zero(tmp_path, monkeypatch):
    seen = {}
    save = fl_figures.bound.save_figure

    def keep(fig, out_dir, name, title, caption):
        seen[name] = fig.axes[0].get_ylim()
        return save(fig, out_dir, name, title, caption)

    monkeypatch.setattr(fl_figures.bound, "save_figure", keep)
    figures = {f.name: f for f in draw_figures(_frame(), tmp_path)}
    low, high = seen["comm_over_bound"]
    assert 0.5 < low < 0.72 < 1.0 < 1.44 < high  # udp at 0.72 of the bound... tcp 1.44
    assert "not at zero" in figures["comm_over_bound"].caption


def test_the_payload_figure_is_log_log_with_the_bound(tmp_path, monkeypatch):
    seen = {}
    save = fl_figures.bound.save_figure

    def keep(fig, out_dir, name, title, caption):
        seen[name] = [(ax.get_xscale(), ax.get_yscale(), len(ax.lines)) for ax in fig.axes]
        return save(fig, out_dir, name, title, caption)

    monkeypatch.setattr(fl_figures.bound, "save_figure", keep)
    models = ("payload:1MB", "payload:10MB", "payload:100MB")
    frame = _frame(protocols=("tcp", OTHER), reps=2, profiles=("3g", "4g", "wifi"), models=models)
    figures = {f.name: f for f in draw_figures(frame, tmp_path)}
    panels = seen["comm_time_payload"]
    assert len(panels) == 6  # 3g, 4g, wifi: the time on top, over the bound below
    top, below = panels[:3], panels[3:]
    assert all(x == "log" and y == "log" for x, y, _ in top)
    assert all(x == "log" and y == "linear" for x, y, _ in below)  # a few % must show
    assert all(lines >= 3 for *_, lines in panels)  # two protocols and the bound
    assert "accuracy" not in figures  # a payload learns nothing: no accuracy to show
    with Image.open(figures["comm_time_payload"].png) as png:
        assert png.info["dpi"] == pytest.approx((300, 300), abs=0.5)


def test_the_report_and_the_summary_carry_the_ranking(tmp_path):
    from tensorwire.bench.report import render_summary

    frame = _frame()
    figures = draw_figures(frame, tmp_path / "figures")
    page = render_summary({"run": {"shaped": True}}, frame, figures, tmp_path)
    assert "Ranking per condition" in page and "udp is 1.67x faster than tcp" in page
    assert 'data-figure="comm_over_bound"' in page


def test_a_run_of_one_condition_names_it_by_its_settings():
    said = verdicts(_frame(profiles=("wifi",), models=("resnet18",)))
    assert said and said[0].startswith("wifi, resnet18: ")
