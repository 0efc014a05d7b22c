"""The ETA and stall rules on recorded batch timings and a fake clock: pure
functions of what the database holds, so no test waits for real time.

tests/campaigns/data/run_timings.json is a real run (bench/record_timings.py:
1,500 docstrings as JSONL records, the real model on this machine's CPU,
length-grouped token-budget batches: short texts first, long ones last).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from campaigns.watch import eta, stall

T0 = dt.datetime(2026, 12, 4, 2, 0, tzinfo=dt.UTC)
RECORDED = json.loads((Path(__file__).parent / "data" / "run_timings.json").read_text())


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def recorded_timings() -> list[eta.Timing]:
    return [
        eta.Timing(at(b["started"]), at(b["finished"]), b["size"], b["real_tokens"])
        for b in RECORDED["batches"]
    ]


def steady(n: int, *, every: float = 10.0, size: int = 100, cost: int | None = 5000):
    """n batches back to back, one finished every `every` seconds."""
    return [eta.Timing(at(i * every), at((i + 1) * every), size, cost) for i in range(n)]


# --- ETA --------------------------------------------------------------------


def test_no_estimate_before_three_batches_nor_when_nothing_is_left():
    assert eta.estimate(steady(2), remaining_units=500, remaining_cost=1, now=at(20)) is None
    assert eta.estimate(steady(10), remaining_units=0, remaining_cost=0, now=at(100)) is None


def test_a_steady_run_is_estimated_exactly_in_its_cost_unit():
    # 500 tokens/s: 50,000 tokens left take 100 s, whatever the unit count.
    found = eta.estimate(steady(10), remaining_units=3, remaining_cost=50_000, now=at(100))
    assert found is not None and found.by_cost
    assert found.seconds == pytest.approx(100)
    assert found.finishes_at == at(200)
    assert found.low_seconds == pytest.approx(100) and found.high_seconds == pytest.approx(100)


def test_the_cost_not_the_unit_count_sets_the_estimate():
    """Short texts first: 100 units a batch at 2,000 tokens; what is left is
    100 long units worth 40,000 tokens. By units it would say 10 s; by tokens
    it is 200 s, which is what the run will take."""
    short = steady(10, size=100, cost=2000)  # 200 tokens/s, 10 units/s
    found = eta.estimate(short, remaining_units=100, remaining_cost=40_000, now=at(100))
    assert found.seconds == pytest.approx(200)
    by_units = eta.estimate(short, remaining_units=100, remaining_cost=None, now=at(100))
    assert by_units.seconds == pytest.approx(10) and not by_units.by_cost


def test_workers_in_parallel_add_up_on_the_wall_clock():
    one = steady(12)
    two = one + [eta.Timing(t.started_at, t.finished_at, t.size, t.cost) for t in one]
    rate_one, rate_two = eta.measure(one), eta.measure(two)
    assert rate_two.cost_per_s == pytest.approx(2 * rate_one.cost_per_s)


def test_one_slow_batch_widens_the_range_and_moves_the_estimate_little():
    timings = steady(24)
    slow = timings[:12] + [eta.Timing(at(120), at(200), 100, 5000)]  # 80 s, a redelivery
    slow += [eta.Timing(at(200 + i * 10), at(210 + i * 10), 100, 5000) for i in range(11)]
    found = eta.estimate(slow, remaining_units=100, remaining_cost=50_000, now=at(310))
    steady_found = eta.estimate(timings, remaining_units=100, remaining_cost=50_000, now=at(240))
    # The late side of the range opens; the estimate itself stays the steady one's.
    assert found.high_seconds > 1.3 * found.seconds
    assert found.low_seconds <= found.seconds
    assert found.seconds == pytest.approx(steady_found.seconds)


def test_only_recent_batches_count():
    """A run that sped up (a second worker joined) is estimated at its new speed."""
    old = [eta.Timing(at(i * 60), at((i + 1) * 60), 100, 5000) for i in range(100)]
    new = [eta.Timing(at(6000 + i * 10), at(6010 + i * 10), 100, 5000) for i in range(60)]
    found = eta.measure(old + new)
    assert found.cost_per_s == pytest.approx(500)
    assert found.batches == eta.RECENT_BATCHES


def test_on_a_recorded_run_the_estimate_narrows_to_the_real_end():
    """Replayed batch by batch: from a third of the way in, the estimate made
    at each batch is within 35% of the time the run really took to finish, and
    from two thirds within 20% (or one batch's time, at the very end). The
    batches hold 341 units at first and 16 at the end: counted in units, the
    estimate is less than half the real time."""
    timings = recorded_timings()
    total_cost = RECORDED["unit_cost_sum"]
    end = timings[-1].finished_at
    done_cost, done_units = 0, 0
    one_batch = sorted((t.finished_at - t.started_at).total_seconds() for t in timings)[
        len(timings) // 2
    ]
    errors = []
    for i, t in enumerate(timings[:-1]):
        done_cost += t.cost
        done_units += t.size
        now = t.finished_at
        found = eta.estimate(
            timings[: i + 1],
            remaining_units=RECORDED["units"] - done_units,
            remaining_cost=max(1, total_cost - done_cost),
            now=now,
        )
        if found is None or i < len(timings) // 3:
            continue
        real = (end - now).total_seconds()
        # Near the end a second is a large share: an error of one batch's
        # time is allowed there.
        errors.append((i / len(timings), abs(found.seconds - real), real))
    assert errors, "the recorded run has too few batches"
    for share, error, real in errors:
        assert error <= max((0.35 if share < 2 / 3 else 0.20) * real, one_batch), (share, real)
    third = len(timings) // 3
    by_units = eta.estimate(
        timings[: third + 1],
        remaining_units=RECORDED["units"] - sum(t.size for t in timings[: third + 1]),
        remaining_cost=None,
        now=timings[third].finished_at,
    )
    real = (end - timings[third].finished_at).total_seconds()
    assert by_units.seconds < 0.5 * real


def test_the_rental_fit_says_before_or_after_the_end():
    found = eta.estimate(steady(10), remaining_units=3, remaining_cost=50_000, now=at(100))
    early = eta.rental_fit(starts_at=at(-900), ends_at=at(1100), eta=found, now=at(100))
    assert early.fits and early.margin_seconds == pytest.approx(900)
    assert early.used_share == pytest.approx(0.5)
    late = eta.rental_fit(starts_at=at(-900), ends_at=at(150), eta=found, now=at(100))
    assert late.fits is False and late.margin_seconds == pytest.approx(-50)
    unknown = eta.rental_fit(starts_at=at(0), ends_at=at(100), eta=None, now=at(200))
    assert unknown.fits is None and unknown.used_share == 1.0


# --- stall ------------------------------------------------------------------

RULES = stall.Rules(factor=5, floor=120, beat_seconds=15, lease_seconds=60)


def worker(name="gpu1:10", beat=0.0, queues="gpu", stopped=False, busy=False):
    return stall.Worker(name, at(beat), queues, stopped, busy=busy)


def situation(now, **kw):
    values = {
        "now": at(now),
        "queued": 3,
        "running": [stall.Held(7, "gpu1:10", at(now + 30))],
        "planning": False,
        "planner_died": False,
        "last_progress_at": at(0),
        "batch_seconds": [10.0] * 10,
        "workers": [worker(beat=now - 5)],
    }
    values.update(kw)
    return stall.Situation(**values)


def test_a_run_making_progress_is_not_stalled():
    assert stall.verdict(situation(40), RULES) is None
    # Beyond 5 x the median batch time but within the floor.
    assert stall.verdict(situation(100), RULES) is None


def test_live_workers_and_no_progress_past_the_limit_is_a_hung_batch():
    found = stall.verdict(situation(121), RULES, broker_waiting=lambda: 3)
    assert found.cause == "hung" and found.limit == 120 and found.notify
    slow = situation(400, batch_seconds=[60.0] * 10)  # limit 5 x 60 s = 300 s
    assert stall.verdict(slow, RULES).cause == "hung"
    assert stall.verdict(situation(290, batch_seconds=[60.0] * 10), RULES) is None


def test_a_broker_that_does_not_answer_is_named_and_asked_only_past_the_limit():
    asked = []

    def broker():
        asked.append(1)
        return None  # does not answer

    assert stall.verdict(situation(100), RULES, broker) is None
    assert not asked
    assert stall.verdict(situation(130), RULES, broker).cause == "broker"


def test_a_dead_worker_holding_the_batch_is_a_stall_before_the_limit():
    """The worker was killed (its beat stopped 60 s ago) with its batch: the
    heartbeats prove it, so the banner does not wait the 120 s limit."""
    dead = situation(50, workers=[worker(beat=-10)], last_progress_at=at(0))
    found = stall.verdict(dead, RULES)
    assert found.cause == "no_worker"
    assert "celery -A portal worker -Q gpu" in found.advice
    # A second, live worker serves the queue: the batch comes back to it.
    other = situation(
        50, workers=[worker(beat=-10), worker("gpu2:11", beat=45)], last_progress_at=at(0)
    )
    assert stall.verdict(other, RULES).cause == "dead_holders"


def test_a_lease_long_expired_means_the_sweeper_does_not_run():
    held = [stall.Held(7, "gpu1:10", at(100))]
    found = stall.verdict(
        situation(300, running=held, workers=[worker(beat=40)], last_progress_at=at(0)), RULES
    )
    assert found.cause == "sweeper" and "celery -A portal beat" in found.advice


def test_queued_work_and_no_worker_on_its_queue():
    nobody = situation(50, running=[], workers=[worker(queues="portal", beat=48)])
    assert stall.verdict(nobody, RULES).cause == "no_worker"
    stopped = situation(50, running=[], workers=[worker(beat=48, stopped=True)])
    assert stall.verdict(stopped, RULES).cause == "no_worker"


def test_a_planner_that_died_with_units_pending():
    found = stall.verdict(
        situation(60, queued=0, running=[], planner_died=True, workers=[worker(beat=55)]),
        RULES,
    )
    assert found.cause == "planner" and "Resume" in found.advice


def test_nothing_to_do_is_never_a_stall():
    idle = situation(10_000, queued=0, running=[], workers=[])
    assert stall.verdict(idle, RULES) is None


def test_on_the_recorded_run_the_limit_follows_its_own_batch_times():
    """With no floor, the limit is five times the run's median batch time (1.2 s
    here): at every batch end, and halfway to the next, the run is not
    stalled; the same run silent for six median batch times is."""
    fast = stall.Rules(factor=5, floor=0, beat_seconds=0.05, lease_seconds=60)
    timings = recorded_timings()

    def at_moment(i: int, now: dt.datetime) -> stall.Stall | None:
        durations = [(x.finished_at - x.started_at).total_seconds() for x in timings[: i + 1]]
        return stall.verdict(
            stall.Situation(
                now=now,
                queued=1,
                running=[stall.Held(1, "w:1", now + dt.timedelta(seconds=60))],
                planning=False,
                planner_died=False,
                last_progress_at=timings[i].finished_at,
                batch_seconds=durations[-20:],
                workers=[stall.Worker("w:1", now, "gpu")],
            ),
            fast,
            lambda: 1,
        )

    for i, t in enumerate(timings[:-1]):
        nxt = timings[i + 1].finished_at
        assert at_moment(i, t.finished_at) is None
        assert at_moment(i, t.finished_at + (nxt - t.finished_at) / 2) is None
    median = sorted((t.finished_at - t.started_at).total_seconds() for t in timings[:10])[5]
    silent = at_moment(9, timings[9].finished_at + dt.timedelta(seconds=6 * median))
    assert silent is not None and silent.cause == "hung"


def test_batches_queued_behind_another_campaigns_work_are_not_stalled():
    """Shared workers busy with another campaign: this one waits its turn."""
    busy = [worker(beat=395, busy=True)]
    waiting = situation(400, running=[], workers=busy)
    assert stall.verdict(waiting, RULES, lambda: 40) is None
    idle = situation(400, running=[], workers=[worker(beat=395)])
    assert stall.verdict(idle, RULES, lambda: 40).cause == "hung"


def test_a_planner_at_work_is_not_a_stall():
    planning = situation(400, queued=0, running=[], planning=True, workers=[worker(beat=395)])
    assert stall.verdict(planning, RULES) is None


def test_queued_batches_the_broker_holds_no_message_for():
    lost = situation(400, running=[], workers=[worker(beat=395)])
    found = stall.verdict(lost, RULES, lambda: 0)
    assert found.cause == "lost" and "Resume" in found.advice


def test_a_dead_holder_that_a_live_worker_will_replace_is_shown_not_notified():
    other = situation(
        50, workers=[worker(beat=-10), worker("gpu2:11", beat=45)], last_progress_at=at(0)
    )
    found = stall.verdict(other, RULES)
    assert found.cause == "dead_holders" and not found.notify


def test_a_new_process_that_reused_the_pid_does_not_hold_the_old_batch():
    """A container restarted under the same host name: gpu1:10 beats again,
    but registered after the batch started, so the batch's holder is dead."""
    held = [stall.Held(7, "gpu1:10", at(100), started_at=at(-30))]
    reborn = worker(beat=48)
    reborn = stall.Worker(reborn.name, reborn.beat_at, reborn.queues, started_at=at(20))
    found = stall.verdict(situation(50, running=held, workers=[reborn]), RULES)
    assert found is not None and found.cause == "dead_holders"
    same = stall.Worker(reborn.name, reborn.beat_at, reborn.queues, started_at=at(-60))
    assert stall.verdict(situation(50, running=held, workers=[same]), RULES) is None


def test_batches_that_report_no_cost_are_counted_in_units():
    zero = steady(10, cost=0)
    found = eta.estimate(zero, remaining_units=300, remaining_cost=1000, now=at(100))
    assert found is not None and not found.by_cost
    assert found.seconds == pytest.approx(30)  # 10 units/s
