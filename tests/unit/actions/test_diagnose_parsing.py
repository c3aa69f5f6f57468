"""dcgmi diag -j results as DCGM 2.x and 3.x print them, and PCIe rows by position."""

from __future__ import annotations

import json

import pytest

from remediator.actions import diagnose


def test_diag_results_read_both_dcgm_json_shapes() -> None:
    old = {  # DCGM 2.x: gpu_ids and a warning string
        "DCGM GPU Diagnostic": {
            "test_categories": [
                {
                    "category": "Hardware",
                    "tests": [
                        {
                            "name": "GPU Memory",
                            "results": [
                                {"gpu_ids": "0", "status": "Pass"},
                                {"gpu_ids": "1", "status": "Fail", "warnings": "bad row"},
                            ],
                        }
                    ],
                },
                {
                    "category": "Deployment",
                    "tests": [{"name": "Denylist", "results": [{"status": "Skip"}]}],
                },
            ]
        }
    }
    results = diagnose.parse_diag(json.dumps(old))
    assert [(r.test, r.gpu, r.status) for r in results] == [
        ("GPU Memory", "0", "Pass"),
        ("GPU Memory", "1", "Fail"),
        ("Denylist", None, "Skip"),
    ]
    assert results[1].describe() == "GPU Memory (Hardware) Fail on GPU 1: bad row"
    new = {  # DCGM 3.x: gpu_id and a list of warnings
        "DCGM GPU Diagnostic": {
            "test_categories": [
                {
                    "category": "Integration",
                    "tests": [
                        {
                            "name": "PCIe",
                            "results": [
                                {
                                    "gpu_id": "2",
                                    "status": "Warn",
                                    "warnings": [{"error_id": 8, "warning": "link x8"}],
                                }
                            ],
                        }
                    ],
                }
            ]
        }
    }
    [warned] = diagnose.parse_diag(json.dumps(new))
    assert (warned.gpu, warned.status, warned.warnings) == ("2", "Warn", ("link x8",))


@pytest.mark.parametrize("text", ["", "Error: unable to connect to host engine", '{"a": 1}', "[]"])
def test_output_that_is_not_a_diag_report_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"Expecting value|no DCGM diagnostic"):
        diagnose.parse_diag(text)


def test_pcie_rows_are_read_by_position_and_compared_with_the_maximum() -> None:
    rows = (
        "0, GPU-a, 00000000:18:00.0, 5, 5, 16, 16, 580.159.04\n"
        "1, GPU-b, 00000000:28:00.0, 5, 5, 8, 16, 580.159.04\n"
        "2, GPU-c, 00000000:38:00.0, [N/A], 5, 16, 16, 580.159.04\n"
    )
    links = diagnose.parse_pcie(rows)
    assert [link.width for link in links] == [16, 8, 16]
    problems = diagnose.pcie_problems(links, diagnose.PcieParams(driver_version="580.159.04"))
    assert problems == {
        "GPU-b": "PCIe link width x8 of x16",
        "GPU-c": "PCIe link generation None of 5",
    }
