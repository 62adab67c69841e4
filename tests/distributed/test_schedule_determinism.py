"""The overlap pass's order and the bucketing pass's buckets depend on the graph alone: two processes with
different hash seeds (so different set and dict-of-object orders) compile the same program. Every rank must
issue the same collectives in the same order."""
import os
import sys

from spawn_ranks import _env, requires_gloo, run_processes

pytestmark = requires_gloo
PRINT_SCHEDULE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "print_schedule.py")


def test_schedule_is_the_same_in_processes_with_different_hash_seeds():
    done = run_processes([[sys.executable, PRINT_SCHEDULE]] * 2,
                         [_env(PYTHONHASHSEED=seed) for seed in ("1", "2")], 120, "print_schedule")
    (code0, program0), (code1, program1) = done
    assert code0 == 0 and code1 == 0, program0[-4000:] + program1[-4000:]
    # the program holds the overlapped collectives and the buckets (one all-gather of all four tensors)
    assert program0.count("aten_all_gather_into_tensor_default(") == 1, program0
    # (each all-reduce's input dies with it: reduced in place)
    assert program0.count("aten_all_reduce__default(") == 2, program0
    assert program0 == program1
