"""The tune plan's rules (see jax_autotune/plan.py)."""

import jax
import pytest

from fakes import CPU, candidate_set, fake_candidate
from jax_autotune.tuning.candidates import CandidateSetBuilder
from jax_autotune.api import key_for
from jax_autotune.tuning.plan import DEMOTED, make_plan

KEY = key_for(jax.ShapeDtypeStruct((64, 64), "float32"), jax.ShapeDtypeStruct((64, 64), "float32"))


def rounds(cset, key=KEY, device=CPU):
    return [(r.group, r.tier, [c.name for c in r.candidates]) for r in make_plan(cset, key, device).rounds]


def test_groups_run_from_high_to_low_priority_and_tiers_become_fallback_rounds():
    cset = candidate_set(
        [("low", 1), ("high", 5)],
        [(fake_candidate("a"), [("low", 3)]),
         (fake_candidate("b"), [("high", 2)]),
         (fake_candidate("c"), [("high", 7)]),
         (fake_candidate("d"), [("high", 7)])],
    )
    assert rounds(cset) == [("high", 7, ["c", "d"]), ("high", 2, ["b"]), ("low", 3, ["a"])]


def test_negative_priorities_skip_a_group_or_a_candidate():
    cset = candidate_set(
        [("skipped", -1), ("kept", 1)],
        [(fake_candidate("a"), [("skipped", 5)]),
         (fake_candidate("b"), [("kept", -1)]),
         (fake_candidate("c"), [("kept", 0)])],
    )
    assert rounds(cset) == [("kept", 0, ["c"])]


def test_two_groups_with_the_same_priority_stay_separate_rounds_in_declaration_order():
    cset = candidate_set(
        [("first", 3), ("second", 3)],
        [(fake_candidate("a"), [("second", 1)]),
         (fake_candidate("b"), [("first", 1)])],
    )
    assert rounds(cset) == [("first", 1, ["b"]), ("second", 1, ["a"])]


@pytest.mark.parametrize("preset", [jax.lax.DotAlgorithmPreset.DEFAULT, "F32_F32_F32", "BF16_BF16_F32_X3"])
def test_an_algorithm_preset_has_no_rounds_only_xla_dot(preset):
    cset = candidate_set(
        [("g", 2)],
        [(fake_candidate("supported_everywhere"), [("g", 9)]),
         (fake_candidate("unsupported", supported=False), [("g", 1)])],
    )
    s = jax.ShapeDtypeStruct((64, 64), "float32")
    plan = make_plan(cset, key_for(s, s, precision=preset), CPU)
    assert plan.rounds == () and plan.baseline is cset.baseline and "preset" in plan.reason
    assert rounds(cset, key_for(s, s, precision="highest")) == [("g", 9, ["supported_everywhere"]),
                                                                  (DEMOTED, -1, ["unsupported"])]


def test_unsupported_candidates_are_demoted_to_a_last_round_not_removed():
    cset = candidate_set(
        [("g", 2), ("h", 1)],
        [(fake_candidate("fast_but_unsupported", supported=False), [("g", 9)]),
         (fake_candidate("ok"), [("g", 1)]),
         (fake_candidate("other"), [("h", 1)])],
    )
    assert rounds(cset) == [("g", 1, ["ok"]), ("h", 1, ["other"]),
                            (DEMOTED, -1, ["fast_but_unsupported"])]


def test_a_plan_of_only_unsupported_candidates_is_not_empty():
    cset = candidate_set([("g", 1)], [(fake_candidate("x", supported=False), [("g", 1)])])
    assert rounds(cset) == [(DEMOTED, -1, ["x"])]


def test_a_candidate_in_two_groups_runs_in_the_first_round_that_reaches_it():
    cset = candidate_set(
        [("a", 2), ("b", 1)],
        [(fake_candidate("shared"), [("a", 1), ("b", 5)]),
         (fake_candidate("only_b"), [("b", 5)])],
    )
    assert rounds(cset) == [("a", 1, ["shared"]), ("b", 5, ["only_b"])]


def test_priorities_are_functions_of_the_key():
    builder = CandidateSetBuilder("cpu", "fake")
    builder.add(fake_candidate("xla_dot"))
    small = builder.group("small", lambda key: 1 if key.m <= 32 else -1)
    builder.add(fake_candidate("tiny"), small, lambda key: 0)
    cset = builder.build()
    tiny_key = key_for(jax.ShapeDtypeStruct((8, 8), "float32"), jax.ShapeDtypeStruct((8, 8), "float32"))
    assert rounds(cset, tiny_key) == [("small", 0, ["tiny"])]
    assert rounds(cset, KEY) == []


def test_builder_rejects_duplicate_names_and_unknown_groups():
    builder = CandidateSetBuilder("cpu", "fake")
    builder.add(fake_candidate("xla_dot"))
    with pytest.raises(ValueError, match="not unique"):
        builder.add(fake_candidate("xla_dot"))
    other = CandidateSetBuilder("cpu", "fake").group("elsewhere", lambda k: 1)
    with pytest.raises(ValueError, match="unknown group"):
        builder.add(fake_candidate("y"), other, lambda k: 1)


def test_checksum_changes_when_a_candidate_is_added_renamed_or_reparametrised():
    base = candidate_set([("g", 1)], [(fake_candidate("a", tile=8), [("g", 1)])])
    same = candidate_set([("g", 1)], [(fake_candidate("a", tile=8), [("g", 1)])])
    renamed = candidate_set([("g", 1)], [(fake_candidate("b", tile=8), [("g", 1)])])
    retiled = candidate_set([("g", 1)], [(fake_candidate("a", tile=16), [("g", 1)])])
    added = candidate_set([("g", 1)], [(fake_candidate("a", tile=8), [("g", 1)]),
                                       (fake_candidate("c"), [("g", 1)])])
    assert base.checksum() == same.checksum()
    assert len({base.checksum(), renamed.checksum(), retiled.checksum(), added.checksum()}) == 4


def test_a_supports_rule_that_raises_demotes_its_candidate_instead_of_failing_the_plan():
    from jax_autotune.tuning.candidates import Candidate
    from jax_autotune.kernels.xla import XLA_DOT, xla_dot
    from jax_autotune.problem import MatmulProblem

    def broken(device, key):
        raise RuntimeError("no driver")

    builder = CandidateSetBuilder("cpu", "fake-cpu")
    builder.add(XLA_DOT)
    group = builder.group("g", lambda key: 1)
    builder.add(Candidate("broken", xla_dot, supports=broken), group, lambda key: 1)
    builder.add(Candidate("fine", xla_dot), group, lambda key: 1)
    problem = MatmulProblem(1, 8, 8, 8, "float32", "float32", "float32")
    plan = make_plan(builder.build(), problem.key(), CPU)
    assert [c.name for r in plan.runnable for c in r.candidates] == ["fine"]
