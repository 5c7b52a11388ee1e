"""Text tables for people (jax_autotune/columns.py) and the warmup report built on them."""

import dataclasses

from jax_autotune.columns import CUT_MARK, aligned, fitted
from jax_autotune.epilogue import Epilogue
from jax_autotune.problem import MatmulProblem
from jax_autotune.warmup import WarmupEntry, WarmupReport

ROWS = [("id", "key", "winner", "time"),
        ("a1", "256x512x512 bfloat16 NT DEFAULT ragged m g4 | add(y,full)", "ragged_padded_dense_x2", "7.0ms"),
        ("b22", "16x8x16 float32 NN DEFAULT", "xla_dot", "11.25ms")]


def test_aligned_pads_each_column_to_its_widest_cell_and_right_aligns_numbers():
    lines = aligned(ROWS, right={3})
    starts = {line.index(cell) for line, (_, _, cell, _) in zip(lines, ROWS)}
    assert len(starts) == 1  # every winner starts in one column
    assert len({len(line) for line in lines}) == 1  # the right-aligned last column ends in one place
    assert lines[0].endswith("   time") and all(line == line.rstrip() for line in lines)
    assert aligned([]) == []


def test_fitted_cuts_the_columns_in_turn_down_to_their_narrowest():
    full = max(len(line) for line in aligned(ROWS))
    narrowest = max(len(line) for line in aligned(fitted(ROWS, 0, cut=((2, 10), (1, 12)))))
    for width in (full, full - 5, full - 30, 10):
        rows = fitted(ROWS, width, cut=((2, 10), (1, 12)))
        assert max(len(line) for line in aligned(rows)) <= max(width, narrowest)
        for original, shortened in zip(ROWS, rows):
            for before, after in zip(original, shortened):
                assert after == before or (after.endswith(CUT_MARK) and before.startswith(after[:-1]))
    rows = fitted(ROWS, full - 5, cut=((2, 10), (1, 12)))
    assert rows[1][1] == ROWS[1][1] and rows[1][2].endswith(CUT_MARK) and len(rows[1][2]) == len(ROWS[1][2]) - 5
    rows = fitted(ROWS, full - 30, cut=((2, 10), (1, 12)))
    assert len(rows[1][2]) == 10 and rows[1][1].endswith(CUT_MARK)  # the winner at its narrowest, then the key
    assert fitted(ROWS, 1000, cut=((1, 12),)) == [tuple(r) for r in ROWS]


def test_the_warmup_report_stays_aligned_with_epilogues_and_missing_times():
    bare = MatmulProblem(1, 256, 384, 512, "bfloat16", "bfloat16", "bfloat16")
    in_context = dataclasses.replace(bare, epilogue=Epilogue.parse("row:bfloat16|add(y,$0);tanh(%0)"))
    entries = (WarmupEntry(bare.key(), bare, "xla_dot", None, None, "memory", "no other candidate can run this key"),
               WarmupEntry(in_context.key(), in_context, "mosaic_gemm_r0_epilogue", 1.5e-5, 2.25e-5, "tuned"))
    lines = str(WarmupReport(entries)).splitlines()
    assert lines[0].split() == ["problem", "winner", "us", "xla", "us", "source", "why"]
    winner_at = {line.index(w) for line, w in zip(lines, ("winner", "xla_dot", "mosaic_gemm_r0_epilogue"))}
    source_at = {line.index(s) for line, s in zip(lines, ("source", "memory", "tuned"))}
    assert len(winner_at) == 1 and len(source_at) == 1
    assert "15.0" in lines[2] and "22.5" in lines[2] and in_context.describe() in lines[2]
    assert lines[1].index("-") < lines[1].index("memory")
