"""Session settings (`proxy.history.settings`): the declared keys read through their accessors, and folding."""

from __future__ import annotations

from proxy.history.settings import BUDGET_SETTING, STRATEGIES_SETTING, fold, session_budget, session_strategies


def test_the_accessors_read_only_well_formed_values() -> None:
    assert session_budget({BUDGET_SETTING: 1000}) == 1000
    assert session_budget({BUDGET_SETTING: True}) is None
    assert session_budget({BUDGET_SETTING: "1000"}) is None
    assert session_budget({}) is None
    assert session_strategies({STRATEGIES_SETTING: ["summarize"]}) == ("summarize",)
    assert session_strategies({STRATEGIES_SETTING: "summarize"}) is None
    assert session_strategies({}) is None


def test_fold_removes_none_and_keeps_the_same_mapping_when_nothing_changes() -> None:
    in_force = {BUDGET_SETTING: 900}
    assert fold(in_force, {BUDGET_SETTING: 900}) is in_force
    assert fold(in_force, {BUDGET_SETTING: None, STRATEGIES_SETTING: ["summarize"]}) == {
        STRATEGIES_SETTING: ["summarize"]
    }
