"""The experiment matrix: stable keys, order, round trips, validation."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="torch is not installed (extra 'fl')")

from tensorwire.bench.fl_matrix import Experiment, Matrix, registered_protocols
from tensorwire.testbed import ProfileError


def test_keys_are_stable_and_tell_every_setting_apart():
    exp = Experiment("tcp", profile="4g", loss=0.05, stress="cpu", uplink="topk", ratio=0.01)
    assert (
        exp.key == "tcp_vgg5_4g_loss0.05_stress-cpu_up-topk0.01_codec-auto_digits_4dev_3rounds_rep0"
    )
    assert Experiment.from_config(exp.to_config()).key == exp.key
    variants = [
        Experiment("tcp"),
        Experiment("mqtt"),
        Experiment("tcp", model="vgg8"),
        Experiment("tcp", profile="3g"),
        Experiment("tcp", loss=0.1),
        Experiment("tcp", stress="network"),
        Experiment("tcp", uplink="fp16"),
        Experiment("tcp", uplink="topk", ratio=0.1),
        Experiment("tcp", rounds=5),
        Experiment("tcp", clients=2),
        Experiment("tcp", dataset="synthetic"),
        Experiment("tcp", rep=1),
        Experiment("tcp", downlink="delta"),
        Experiment("tcp", downlink="fp16"),
        Experiment("tcp", epochs=5),
        Experiment("tcp", codec="none"),
        Experiment("tcp", codec="lz4"),
    ]
    assert len({v.key for v in variants}) == len(variants)


def test_the_lossless_codec_is_an_axis_auto_by_default_and_old_runs_read_as_raw():
    matrix = Matrix(protocols=("tcp",), codecs=("none", "auto", "zstd"))
    assert [e.codec for e in matrix.experiments()] == ["none", "auto", "zstd"]
    assert Matrix(protocols=("tcp",)).codecs == ("auto",)
    assert Matrix.from_config(matrix.to_config()) == matrix
    old = Matrix(protocols=("tcp",)).to_config()
    del old["codecs"]  # a run recorded before codecs were an axis sent everything raw
    assert Matrix.from_config(old).codecs == ("none",)
    raw = Experiment("tcp", codec="none")
    assert raw.key == "tcp_vgg5_4g_loss0_stress-none_up-none_digits_4dev_3rounds_rep0"
    recorded = raw.to_config()
    del recorded["codec"]
    assert Experiment.from_config(recorded).key == raw.key  # an old run resumes, not redone
    with pytest.raises(ValueError, match=r"codec 'zip': choose one of none, auto, .*lz4"):
        Experiment("tcp", codec="zip")
    # lossy both ways: no lossless codec is used, so it is not a setting of its own
    assert Experiment("tcp", uplink="fp16", downlink="fp16", codec="lz4").codec == "none"


def test_downlink_and_epochs_name_the_experiment_only_where_not_the_defaults():
    exp = Experiment("tcp", uplink="topk", downlink="delta", epochs=5)
    assert (
        exp.key
        == "tcp_vgg5_4g_loss0_stress-none_up-topk0.01_down-delta_5ep_digits_4dev_3rounds_rep0"
    )
    assert exp.codec_label == "topk 1% / down delta"  # no lossless codec used: none shown
    assert Experiment("tcp").codec_label == "auto"
    assert Experiment("tcp", codec="none").codec_label == "none"
    assert Experiment("tcp", uplink="topk", codec="lz4").codec_label == "topk 1% + lz4"
    with pytest.raises(ValueError, match="downlink 'xor'"):
        Experiment("tcp", downlink="xor")
    with pytest.raises(ValueError, match="epochs"):
        Matrix(protocols=("tcp",), epochs=0)
    matrix = Matrix(protocols=("tcp",), uplinks=("none", "topk"), downlinks=("none", "delta"))
    assert [(e.uplink, e.downlink) for e in matrix.experiments()] == [
        ("none", "none"),
        ("none", "delta"),
        ("topk", "none"),
        ("topk", "delta"),
    ]
    assert Matrix.from_config(matrix.to_config()) == matrix


def test_a_custom_profile_becomes_a_safe_directory_name_and_loss_is_applied():
    exp = Experiment("udp", profile="20mbit,delay=30ms", loss=0.2)
    assert "/" not in exp.key and "," not in exp.key and "=" not in exp.key
    profile = exp.link_profile()
    assert profile.rate == 20e6 and profile.delay == 0.03 and profile.loss == 0.2


def test_matrix_runs_every_combination_with_protocols_innermost():
    matrix = Matrix(protocols=("tcp", "mqtt"), profiles=("3g", "4g"), losses=(0, 0.1), reps=2)
    exps = matrix.experiments()
    assert len(exps) == 2 * 2 * 2 * 2
    assert [e.protocol for e in exps[:4]] == ["tcp", "mqtt", "tcp", "mqtt"]
    assert exps[0].rep == 0 and exps[-1].rep == 1
    assert len({e.key for e in exps}) == len(exps)
    assert Matrix.from_config(matrix.to_config()) == matrix


def test_quick_is_the_issue_setting():
    quick = Matrix.quick()
    assert quick.protocols == tuple(registered_protocols())
    assert (quick.models, quick.profiles, quick.rounds, quick.clients, quick.dataset) == (
        ("vgg5",),
        ("4g",),
        3,
        4,
        "digits",
    )
    assert quick.losses == (0.0,) and quick.stresses == ("none",) and quick.uplinks == ("none",)


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("protocol", "carrier-pigeon", ValueError),
        ("stress", "thermal", ValueError),
        ("uplink", "zip", ValueError),
        ("profile", "fast", ProfileError),
    ],
)
def test_bad_settings_fail_when_the_matrix_is_made(field, value, error):
    settings = {"protocol": "tcp", field: value}
    with pytest.raises(error):
        Experiment(**settings)


def test_the_security_axis_names_secured_experiments_and_checks_its_values():
    from tensorwire.bench.fl_matrix import Experiment, Matrix

    matrix = Matrix(protocols=("tcp",), securities=("none", "tls"))
    keys = [e.key for e in matrix.experiments()]
    assert len(keys) == 2 and "sec-tls" in keys[1] and "sec-" not in keys[0]
    with pytest.raises(ValueError, match="security"):
        Experiment(protocol="tcp", security="ssh")
