"""benchmarks/projection_tail.py's replicate floor, worked by hand, and its refusal of a bad corpus."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from projection_tail import main, replicate_floor  # noqa: E402


def test_the_floor_is_the_least_summed_error_of_one_answer():
    """min over x of Σ |x / e_i − 1|. Published 50 % and 100 %: answering 50 % misses the second by half
    (0.5), answering 100 % misses the first by all of it (1.0): 0.5. Published 60, 80 and 100 %: at 60,
    0 + 0.25 + 0.4 = 0.65; at 80, 1/3 + 0 + 0.2 = 8/15; at 100, 2/3 + 0.25 + 0 = 11/12: 8/15. Two rows that
    agree cost nothing."""
    assert replicate_floor([0.5, 1.0]) == pytest.approx(0.5)
    assert replicate_floor([0.6, 0.8, 1.0]) == pytest.approx(8 / 15)
    assert replicate_floor([0.9, 0.9]) == 0.0


def test_a_missing_corpus_exits_2(tmp_path, capsys):
    assert main(["--corpus", str(tmp_path / "none.csv")]) == 2
    assert "--corpus=" in capsys.readouterr().err
