"""Step outputs on the run page: a drain as a bar, power caps as before → after, artifacts with
their digest, held steps with their reason; nothing from an output is left unescaped."""

from __future__ import annotations

from remediator.adapters.http import outputs


def test_a_drain_in_progress_is_a_bar_of_pods_gone():
    shown = outputs.output(
        {
            "output": {
                "node": "gpu-node-03",
                "total": 4,
                "evicted": ["a/p1", "a/p2"],
                "remaining": ["a/p3", "a/p4"],
                "blocked": {"a/p4": {"pdb": "a/budget"}},
            },
            "error": None,
        }
    )
    assert '<progress class="drain" max="4" value="2">' in shown
    assert "2 of 4 pods evicted · 1 blocked by a PDB" in shown


def test_power_caps_read_before_and_after():
    shown = outputs.output(
        {
            "output": {
                "gpus": [
                    {"index": 0, "uuid": "GPU-0", "previous_limit": 700, "set_limit": 500},
                    {"index": 1, "uuid": "GPU-1", "previous_limit": 700, "verified_limit": 450.5},
                ]
            }
        }
    )
    assert "700 W → 500 W" in shown
    assert "700 W → 450.5 W" in shown


def test_an_artifact_links_its_file_with_its_sha256_and_output_is_escaped():
    digest = "ab" * 32
    shown = outputs.output(
        {"output": {"path": "n1/1-2-report.log.gz", "sha256": digest, "size": 10, "x": "<b>"}}
    )
    assert '<a href="/api/v1/artifacts/n1/1-2-report.log.gz">' in shown
    assert f'<code class="sha256">{digest}</code>' in shown
    assert "<b>" not in shown


def test_the_pods_to_evict_show_their_owner_and_the_budgets_verdict():
    preview = {
        "evict": ["research/jupyter-alice", "ml/train-0"],
        "pods": [
            {"key": "research/jupyter-alice", "owner": None, "gpus": 1},
            {"key": "ml/train-0", "owner": "StatefulSet/train", "gpus": 8},
        ],
        "pdbs": [{"key": "ml/train-pdb", "allowed": 0, "pods": ["ml/train-0"]}],
        "blocking_pdbs": {"ml/train-pdb": ["ml/train-0"]},
    }
    table = outputs.pods_table(preview)
    assert table.count('<tr class="evict-pod">') == 2
    assert "StatefulSet/train" in table
    assert "none (not recreated)" in table
    assert "blocked by a PDB" in table
    assert "blocks now" in outputs.pdb_table(preview)
