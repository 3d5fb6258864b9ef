"""torch.distributed's backend "tensorwire" and the DDP comm hook, on rank processes over
loopback, against gloo in the same processes (see ``torch_ranks.py``)."""

from __future__ import annotations

import pytest

try:
    import torch.distributed as dist
except ImportError as exc:  # torch is the fl extra's
    print(f"skipping the torch backend tests: torch is not importable ({exc})")
    pytest.skip(f"torch is not importable: {exc}", allow_module_level=True)

from torch_ranks import FAULT_TIMEOUT, max_difference, run

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="torch.distributed with gloo is not available in this torch build",
)


def test_every_operation_matches_gloo_and_the_rest_are_refused_by_name(tmp_path):
    reports = run("operations", 3, str(tmp_path / "store"))
    for rank, report in enumerate(reports):
        assert report is not None and "error" not in report, (rank, report)
        assert report["backend"] == "tensorwire"
        assert report["differs"] == {}, (rank, report["differs"])
        assert set(report["refused"]) == {
            "reduce",
            "gather",
            "all_to_all_single",
            "all_reduce PRODUCT",
        }
        for name, message in report["refused"].items():
            assert name.split()[0] in message or "PRODUCT" in message, message


@pytest.mark.slow
def test_ddp_over_tensorwire_follows_gloo_step_for_step(tmp_path):
    reports = run("ddp", 4, str(tmp_path / "store"), timeout=300)
    for rank, report in enumerate(reports):
        assert report is not None and "error" not in report, (rank, report)
        gloo = report["gloo"]
        for name in ("tensorwire", "hook"):
            ours = report[name]
            diff = max_difference(ours["losses"][:20], gloo["losses"][:20])
            print(
                f"rank {rank} {name}: first 20 losses within {diff:.2e} of gloo's; "
                f"accuracy {ours['accuracy']:.4f} vs {gloo['accuracy']:.4f}; "
                f"{ours['seconds']:.2f} s vs {gloo['seconds']:.2f} s"
            )
            assert diff <= 1e-5, (rank, name, diff)
            assert abs(ours["accuracy"] - gloo["accuracy"]) <= 0.005
        for name in ("hook_bf16", "hook_fp16"):
            half = report[name]
            print(
                f"rank {rank} {name}: accuracy {half['accuracy']:.4f}, losses within "
                f"{max_difference(half['losses'], gloo['losses']):.2e} of gloo's"
            )
            assert abs(half["accuracy"] - gloo["accuracy"]) <= 0.02
        int8 = report["hook_int8"]
        print(
            f"rank {rank} hook_int8: accuracy {int8['accuracy']:.4f} vs {gloo['accuracy']:.4f}, "
            f"losses within {max_difference(int8['losses'], gloo['losses']):.2e} of gloo's"
        )
        assert abs(int8["accuracy"] - gloo["accuracy"]) <= 0.01  # the 1 point


@pytest.mark.parametrize("scenario", ["fault", "hang"])
def test_a_rank_that_dies_or_stops_mid_allreduce_makes_the_others_wait_raise_naming_it(
    tmp_path, scenario
):
    size = 3
    reports = run(scenario, size, str(tmp_path / "store"), timeout=60, lost=size - 1)
    assert reports[size - 1] is None  # it died (or was killed, stopped) without a report
    for rank, report in enumerate(reports[: size - 1]):
        assert report is not None and "error" not in report, (rank, report)
        print(
            f"{scenario}: rank {rank}'s wait() raised after {report['seconds']:.2f} s: "
            f"{report['raised']}"
        )
        assert report["raised"] is not None and f"rank {size - 1}" in report["raised"]
        assert report["seconds"] < FAULT_TIMEOUT + 2
