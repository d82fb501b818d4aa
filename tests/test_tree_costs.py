"""scripts/tree_costs.py: each tree size's forward against `ar`'s at the same question and context,
on a run folder written here with known step times."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import tree_costs  # noqa: E402 - a script, not a package


def _row(method: str, qid: str, forward: list[float], sizes: list[int], accepted: list[int]) -> dict:
    return {"question_id": qid, "turn": 1, "method": method, "prompt_len": 10, "tree_sizes": sizes,
            "accept_lengths": accepted, "step_ms": {"forward": forward}}


@pytest.fixture
def run(tmp_path: Path) -> Path:
    # ar's forward grows with the context (40 ms at 10 tokens, +1 ms a token), so a tree step's
    # ratio is right only if it is read at the step's own context.
    ar = _row("ar", "q1", [40.0 + i for i in range(12)], [1] * 12, [1] * 12)
    # racer: a 4-node step at context 10 (44 ms against ar's 42), then an 8-node one at context 13
    # (64.5 ms against ar's median around position 3, 43.5), then 4 nodes at 18 (52.8 against 47.5).
    racer = _row("racer", "q1", [44.0, 64.5, 52.8], [4, 8, 4], [3, 5, 1])
    other = _row("racer", "q2", [50.0], [4], [2])  # no ar row for q2: left out
    (tmp_path / "results.jsonl").write_text("\n".join(json.dumps(r) for r in (ar, racer, other)) + "\n")
    (tmp_path / "summary.json").write_text(json.dumps(
        {"cost_curve": {"sizes": [1, 2, 4, 8], "contexts": [12], "context": 12, "grid": [[40.0, 41.0, 44.0, 60.0]],
                        "ms": [40.0, 41.0, 44.0, 60.0]}}))
    return tmp_path


def test_ratios_read_ar_at_the_steps_own_context(run: Path):
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    groups = tree_costs.by_size(rows, "racer")
    assert sorted(groups) == [4, 8]
    # context 10 -> ar's median of positions 0..4 = 42; context 18 -> positions 4..11 -> 47.5
    assert groups[4] == [(pytest.approx(44.0 / 42.0), 3), (pytest.approx(52.8 / 47.5), 1)]
    # context 13 -> positions 0..7 -> median 43.5
    assert groups[8] == [(pytest.approx(64.5 / 43.5), 5)]


def test_curve_interpolates_between_measured_sizes(run: Path):
    context, ratios = tree_costs.curve_ratios(run)
    assert context == 12
    assert ratios[1] == 1.0 and ratios[4] == pytest.approx(1.1)
    assert ratios[3] == pytest.approx(42.5 / 40.0)
    assert ratios[6] == pytest.approx(52.0 / 40.0)


def test_table_pools_rare_sizes(run: Path):
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    _, ratios = tree_costs.curve_ratios(run)
    lines = tree_costs.table(tree_costs.by_size(rows, "racer"), ratios, min_steps=2)
    assert lines[2].startswith("| 4 | 2 | 66.7% |")
    assert lines[-1].startswith("| other sizes | 1 | 33.3% |")
