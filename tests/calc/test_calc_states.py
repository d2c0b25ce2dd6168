"""State-driven calc-graph tests in the style of Felix's calc_graph_fv_test.

Every sequence of `calc_states` is replayed in several ways; after each state the recording
fake dataplane (strict `ExpectedDataplane`: it raises on any ordering violation) must hold
exactly the state's expectation, and when the sequence ends the datastore is emptied and
the dataplane must be empty too (every add had its remove).
"""

from __future__ import annotations

import pytest
from calc_states import SEQUENCES
from calc_testlib import EMPTY, Replayer, State

CASES = sorted(SEQUENCES)


def _states(name: str) -> list[State]:
    return SEQUENCES[name]


def _run(replayer: Replayer, states: list[State]) -> None:
    for state in states:
        replayer.go_to(state.docs)
        replayer.check(state)
    replayer.go_to([])
    replayer.check(EMPTY)
    assert not replayer.dataplane.ip_sets
    assert not replayer.dataplane.routes
    assert not replayer.dataplane.pools
    assert not replayer.dataplane.vteps


def test_at_least_25_states() -> None:
    assert sum(len(s) for s in SEQUENCES.values()) >= 25


@pytest.mark.parametrize("case", CASES)
def test_forwards(case: str) -> None:
    _run(Replayer(), _states(case))


@pytest.mark.parametrize("case", CASES)
def test_reversed(case: str) -> None:
    _run(Replayer(), list(reversed(_states(case))))


@pytest.mark.parametrize("case", CASES)
def test_with_empties_between(case: str) -> None:
    states: list[State] = []
    for state in _states(case):
        states += [state, EMPTY]
    _run(Replayer(), states)


@pytest.mark.parametrize("case", CASES)
def test_updates_in_reverse_key_order(case: str) -> None:
    _run(Replayer(order="reversed"), _states(case))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", [1, 2])
def test_shuffled_one_update_per_batch(case: str, seed: int) -> None:
    _run(Replayer(order="shuffled", seed=seed), _states(case))
    _run(Replayer(order="shuffled", seed=seed), list(reversed(_states(case))))


@pytest.mark.parametrize("case", CASES)
def test_squashed(case: str) -> None:
    """Each prefix of the sequence sent as one batch: only the last state may show."""
    states = _states(case)
    for end in range(1, len(states) + 1):
        replayer = Replayer()
        for state in states[:end]:
            replayer.queue(state.docs)
        replayer.process()
        replayer.check(states[end - 1])


@pytest.mark.parametrize("case", CASES)
def test_fresh_start_per_state(case: str) -> None:
    """Loading a state at start-up (the in-sync path) gives the same result."""
    for state in _states(case):
        replayer = Replayer()
        replayer.go_to(state.docs)
        replayer.check(state)


@pytest.mark.parametrize("case", CASES)
def test_naive_index_agrees(case: str) -> None:
    _run(Replayer(naive=True), _states(case))
    _run(Replayer(naive=True), list(reversed(_states(case))))


@pytest.mark.parametrize("case", CASES)
def test_other_host_sees_none_of_node1s_endpoints(case: str) -> None:
    """A host with no endpoints gets no endpoints, policies or IP sets at all."""
    replayer = Replayer("node9")
    for state in _states(case):
        replayer.go_to(state.docs)
        dp = replayer.dataplane
        assert not dp.workload_endpoints and not dp.host_endpoints
        assert not dp.policies and not dp.profiles and not dp.ip_sets
