"""Local launcher: results, failures in bounded time, torchrun/SLURM detection."""

import os
import signal
import time

import pytest

from plexus_tune.launch import RankFailure, detect_environment, launch_local


def _sum_ranks(rank, world_size, scale):
    import torch
    import torch.distributed as dist

    x = torch.tensor([float(rank)])
    dist.all_reduce(x)
    return (rank, world_size, float(x.item()) * scale, torch.get_num_threads())


def _fail_on_rank(rank, world_size, bad_rank, mode):
    import torch
    import torch.distributed as dist

    if rank == bad_rank:
        time.sleep(0.3)
        if mode == "raise":
            raise ValueError(f"injected failure on rank {rank}")
        os.kill(os.getpid(), signal.SIGKILL)
    x = torch.ones(1)
    dist.all_reduce(x)  # the healthy ranks block here until the parent stops them
    time.sleep(120)
    return rank


def _sleep_forever(rank, world_size):
    time.sleep(600)


def test_launch_returns_per_rank_values_and_sets_threads():
    out = launch_local(_sum_ranks, 3, args=(2.0,), timeout_s=120, threads_per_rank=1)
    assert [o[0] for o in out] == [0, 1, 2]
    assert all(o[1] == 3 for o in out)
    assert all(o[2] == 6.0 for o in out)  # (0 + 1 + 2) * 2
    assert all(o[3] == 1 for o in out)


@pytest.mark.parametrize("mode, needle", [("raise", "ValueError: injected failure on rank 1"),
                                          ("kill", "SIGKILL")])
def test_failing_rank_stops_the_set_in_bounded_time(mode, needle):
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        launch_local(_fail_on_rank, 3, args=(1, mode), timeout_s=300)
    elapsed = time.monotonic() - start
    assert info.value.rank == 1
    assert needle in str(info.value)
    assert elapsed < 60, elapsed  # far below the 300 s timeout: no hang in the collective


def test_timeout_stops_a_hung_set():
    start = time.monotonic()
    with pytest.raises(RankFailure, match="timed out"):
        launch_local(_sleep_forever, 2, timeout_s=5)
    assert time.monotonic() - start < 40


def test_detect_environment_torchrun_slurm_and_none():
    assert detect_environment({}) is None
    env = detect_environment({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                              "MASTER_ADDR": "node7", "MASTER_PORT": "29400"})
    assert (env.rank, env.world_size, env.local_rank, env.master_addr, env.master_port, env.source) == \
        (3, 8, 1, "node7", 29400, "torchrun")
    env = detect_environment({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
                              "SLURM_JOB_NODELIST": "nid[001-004,010]", "SLURM_JOB_ID": "12345"})
    assert (env.rank, env.world_size, env.local_rank, env.master_addr, env.master_port, env.source) == \
        (5, 8, 1, "nid001", 22345, "slurm")
    # a batch script or an allocation's shell (no job step of its own) is run by hand, not as a rank
    assert detect_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None
    assert detect_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "7"}) is None
    assert detect_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "4294967291"}) is None


@pytest.mark.parametrize("how", ["signal", "raise"])
def test_interrupt_while_starting_the_ranks_stops_every_started_rank(monkeypatch, how):
    """Ctrl-C, or an error, while rank 1 is being started: no rank outlives the launch. A rank
    left behind waits in the rendezvous for a peer that never comes (its own Ctrl-C unseen
    inside the C++ wait) and holds the fork server's pipes, on which the command's exit waits."""
    import plexus_tune.launch.local as local

    real_context = local._context
    made = []

    def context(preload):
        ctx = real_context(preload)

        def process(*args, **kwargs):
            if made:  # rank 1
                if how == "raise":
                    raise KeyboardInterrupt
                signal.raise_signal(signal.SIGINT)  # as Ctrl-C: held until every started rank is recorded
            proc = ctx.Process(*args, **kwargs)
            made.append(proc)
            return proc

        class Context:
            Process = staticmethod(process)

            def __getattr__(self, name):
                return getattr(ctx, name)

        return Context()

    monkeypatch.setattr(local, "_context", context)
    with pytest.raises(KeyboardInterrupt):
        launch_local(_sum_ranks, 2, args=(1.0,), timeout_s=300)
    assert len(made) == (1 if how == "raise" else 2)
    for proc in made:
        proc.join(10)
        assert not proc.is_alive(), f"{proc.name} outlived the interrupted launch"


def test_signals_deferred_delivers_once_at_the_end():
    from plexus_tune.launch.local import signals_deferred

    reached = []
    with pytest.raises(KeyboardInterrupt):
        with signals_deferred():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            reached.append("end of block")  # not interrupted inside
    assert reached == ["end of block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
