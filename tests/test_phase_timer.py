"""The phase timer: host clock on CPU, events read after the epoch on CUDA (fake events here)."""

import pytest

from plexus_tune.trainer.comm import PARTITION_KEYS, PhaseTimer


class FakeClock:
    def __init__(self):
        self.t_ms = 0.0
        self.done_until = float("inf")  # events recorded at or before this time have passed
        self.syncs = 0


def fake_events(clock):
    class Event:
        def record(self):
            self.t = clock.t_ms

        def query(self):
            return self.t <= clock.done_until

        def synchronize(self):
            clock.syncs += 1
            clock.done_until = max(clock.done_until, self.t)

        def elapsed_time(self, end):
            return end.t - self.t

    return Event


def test_events_are_read_after_the_epoch_and_add_up():
    clock = FakeClock()
    timer = PhaseTimer(event_factory=fake_events(clock))
    assert timer.uses_events
    clock.done_until = -1.0  # the device lags: nothing has passed yet
    start = timer.now()
    for key, ms in (("spmm_ms", 5.0), ("gemm_ms", 3.0), ("loss_ms", 1.0)):
        t0 = timer.now()
        clock.t_ms += ms
        timer.add(t0, key)
        clock.t_ms += 0.5  # untimed gap
    t0 = timer.now()
    clock.t_ms += 2.0
    timer.add_comm(t0, "all_reduce", 0)
    timer.end_epoch(start)
    assert timer.resolve() == [] and timer.host_syncs == 0  # not passed: not read, no wait
    rows = timer.resolve(wait=True)
    assert timer.host_syncs == 1 and clock.syncs == 1
    (row,) = rows
    assert row["epoch_ms"] == pytest.approx(12.5)
    assert row["spmm_ms"] == 5.0 and row["gemm_ms"] == 3.0 and row["comm_ms"] == 2.0
    assert row["comm_x_ms"] == 2.0 and row["all_reduce_ms"] == 2.0 and row["loss_ms"] == 1.0
    assert sum(row[k] for k in PARTITION_KEYS) == pytest.approx(row["epoch_ms"])
    assert row["other_ms"] == pytest.approx(2.5)  # loss 1 + gaps 1.5
    assert timer.epochs == [row]


def test_epochs_resolve_in_order_once_passed():
    clock = FakeClock()
    timer = PhaseTimer(event_factory=fake_events(clock))
    for _ in range(3):
        start = timer.now()
        t0 = timer.now()
        clock.t_ms += 4.0
        timer.add(t0, "spmm_ms")
        timer.end_epoch(start)
    clock.done_until = 8.0  # two epochs have passed on the device
    assert [r["spmm_ms"] for r in timer.resolve()] == [4.0, 4.0]
    assert timer.host_syncs == 0
    assert len(timer.epochs) == 3 and timer.host_syncs == 1


def test_host_durations_and_cpu_clock():
    clock = FakeClock()
    timer = PhaseTimer(event_factory=fake_events(clock))
    start = timer.now()
    timer.add_ms(1.5, "comm_ms", "comm_y_ms")
    clock.t_ms += 3.0
    timer.end_epoch(start)
    (row,) = timer.epochs
    assert row["comm_ms"] == 1.5 and row["comm_y_ms"] == 1.5 and row["other_ms"] == pytest.approx(1.5)
    cpu = PhaseTimer()
    assert not cpu.uses_events
    start = cpu.now()
    t0 = cpu.now()
    cpu.add(t0, "gemm_ms")
    cpu.end_epoch(start)
    (row,) = cpu.epochs
    assert 0 <= row["gemm_ms"] <= row["epoch_ms"] and cpu.host_syncs == 0
