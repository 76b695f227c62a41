"""EngineChooser: which MNN engine (the thread ceiling or one thread) evaluates a prefill."""

from __future__ import annotations

from pocket_agent.runtime._mnn_engines import CEILING, ONE_THREAD, STEPS_PER_PREFILL, EngineChooser


def feed(chooser: EngineChooser, engine: int, prompt_s_per_token: float, step_s: float) -> None:
    """One prefill of 400 tokens and 8 steps on ``engine``."""
    chooser.record(engine, 400, 400 * prompt_s_per_token)
    for _ in range(8):
        chooser.record(engine, 1, step_s)


def test_measures_the_ceiling_then_one_thread_then_keeps_the_faster() -> None:
    chooser = EngineChooser()
    assert chooser.choose([400, 400]) == CEILING
    feed(chooser, CEILING, 0.002, 0.010)  # 8 steps measure the ceiling
    assert chooser.choose([400, 400]) == ONE_THREAD  # tried once
    feed(chooser, ONE_THREAD, 0.003, 0.012)
    # idle machine: the ceiling is faster, and the choice goes back to it
    assert chooser.choose([400, 400]) == CEILING
    assert chooser.active == CEILING


def test_a_collapsed_ceiling_moves_to_one_thread_and_is_retried_later() -> None:
    chooser = EngineChooser()
    chooser.choose([400, 400])
    feed(chooser, CEILING, 0.006, 0.030)  # beside a busy process
    chooser.choose([400, 400])
    feed(chooser, ONE_THREAD, 0.003, 0.012)
    picks = []
    for _ in range(20):
        picks.append(chooser.choose([400, 400]))
        feed(chooser, picks[-1], 0.006 if picks[-1] == CEILING else 0.003, 0.030 if picks[-1] == CEILING else 0.012)
    assert picks.count(ONE_THREAD) >= 17
    assert CEILING in picks  # looked at again (the machine's load may have changed)
    # the load went away: once retried, the ceiling measures faster and is kept
    for _ in range(40):
        pick = chooser.choose([400, 400])
        feed(chooser, pick, 0.002 if pick == CEILING else 0.003, 0.010 if pick == CEILING else 0.012)
    assert chooser.active == CEILING


def test_what_a_switch_costs_counts() -> None:
    """An engine whose cache already holds most of the prompt wins by the tokens it need not evaluate."""
    chooser = EngineChooser()
    chooser.choose([400, 400])
    feed(chooser, CEILING, 0.002, 0.010)
    chooser.choose([400, 400])
    feed(chooser, ONE_THREAD, 0.0015, 0.010)  # one thread a little faster here
    chooser.active = CEILING
    # the ceiling holds the prompt's first 390 tokens: evaluating 10 beats 400 on one thread
    assert chooser.choose([10, 400]) == CEILING
    # from scratch on both, one thread is clearly faster: 400 x 1.5 ms + steps against 400 x 2 ms + steps
    assert 400 * 0.0015 + STEPS_PER_PREFILL * 0.010 < 0.9 * (400 * 0.002 + STEPS_PER_PREFILL * 0.010)
    assert chooser.choose([400, 400]) == ONE_THREAD


def test_an_engine_that_never_gets_measured_is_given_up() -> None:
    """Prefills too short to time and no steps: the one-thread engine is tried a few times, then
    the model stays on its loaded thread count."""
    chooser = EngineChooser()
    chooser.choose([400, 400])
    feed(chooser, CEILING, 0.002, 0.010)
    picks = [chooser.choose([3, 3]) for _ in range(10)]  # nothing recorded on the one-thread engine
    assert picks[:4] == [ONE_THREAD] * 4
    assert picks[4:] == [CEILING] * 6
