"""The ``tensorwire fl`` commands: what --help shows, defaults taken from FLConfig, bad
models and data sets refused before anything starts, --resume of a directory without one."""

from __future__ import annotations

import re

import click
import pytest
import typer
from typer.testing import CliRunner

from tensorwire.cli.fl import _check_model, fl_app
from tensorwire.fl.config import BUILTIN_DATASETS, FLConfig
from tensorwire.fl.errors import CheckpointError

runner = CliRunner()


def _plain(text: str) -> str:
    """The text without colours, box drawing and line wrapping."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", text))


def _option(command: str, name: str) -> click.Option:
    cmd = typer.main.get_command(fl_app).commands[command]  # type: ignore[attr-defined]
    return next(p for p in cmd.params if p.name == name)


def test_server_help_shows_the_run_settings_and_hides_the_plumbing():
    out = _plain(runner.invoke(fl_app, ["server", "--help"], env={"COLUMNS": "250"}).output)
    for shown in ("--resume", "--min-updates", "--fraction", "--strategy", "--clip-norm"):
        assert shown in out
    assert "--progress" not in out  # bench fl's plumbing
    assert "fedadam" in out and "trimmed-mean" in out
    assert "|".join(BUILTIN_DATASETS) in out.replace(" ", "")  # the choices, listed


@pytest.mark.parametrize("command", ["run", "server"])
def test_defaults_come_from_the_config(command):
    d = FLConfig()
    for name in ("model", "dataset", "rounds", "clients", "batch_size", "min_updates", "strategy"):
        assert _option(command, name).default == getattr(d, name), name
    assert d.model == "vgg5"  # the same as bench fl's


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--model", "vgg11"],
            "choose vgg5, vgg8, resnet18, mlp, payload:<size> (e.g. payload:10MB), or "
            "package.module:function",
        ),
        (["--model", "no_such_module_here:make"], "cannot import 'no_such_module_here'"),
        (["--model", "json:no_such_function"], "has no 'no_such_function'"),
        (["--dataset", "imagenet"], "imagenet"),
    ],
)
def test_a_bad_model_or_data_set_is_refused_before_anything_starts(args, said):
    result = runner.invoke(
        fl_app, ["server", "--url", "tcp://127.0.0.1:1", *args], terminal_width=400
    )
    assert result.exit_code == 2, result.output
    assert said in _plain(result.output)


def test_a_model_factory_by_name_is_accepted():
    assert _check_model("tensorwire.fl.models:build_model") == "tensorwire.fl.models:build_model"
    assert _check_model("vgg8") == "vgg8"


def test_resuming_a_directory_without_a_checkpoint_says_so(tmp_path):
    result = runner.invoke(
        fl_app, ["server", "--url", "tcp://127.0.0.1:0", "--resume", str(tmp_path)]
    )
    assert isinstance(result.exception, CheckpointError)
    assert "holds no checkpoint" in str(result.exception)
