"""From the executor's `TaskExited` to the `TaskResult` the owner posts: an exit code
that is never 0 by accident, a tail that says why, bounded whatever the output."""

from __future__ import annotations

import attrs

from populi_p2p.executor._types import TaskExited
from populi_p2p.executor.results import START_FAILED_CODE, result_of, result_tail
from populi_p2p.leases import TaskOutput
from populi_p2p.leases._entry import OUTPUT_TAIL_MAX


def _exited(code: int | None, reason: str, detail: str = "", out: bytes = b"") -> TaskExited:
    return TaskExited("t", 1, code, reason, out, b"", 10.0, 12.5, detail)


def test_results_say_why_and_never_succeed_by_accident() -> None:
    ok = result_of(_exited(0, "exited", "exited with code 0", b"done\n"))
    assert (ok.exit_code, ok.output_tail, ok.duration) == (0, b"done\n", 2.5)
    never_ran = result_of(_exited(None, "start_failed", "no such command: nope"))
    assert never_ran.exit_code == START_FAILED_CODE
    assert never_ran.output_tail.endswith(b"[populi] start_failed: no such command: nope")
    oom = result_of(_exited(-9, "memory", "used more than its memory limit of 268435456 bytes"))
    assert oom.exit_code == -9 and b"[populi] memory: used more" in oom.output_tail
    # A limit that struck as the command exited 0 is still a failure.
    assert result_of(_exited(0, "timeout", "ran past its timeout")).exit_code != 0
    # Bounded whatever the tails and the detail (results gossip).
    huge = result_of(_exited(1, "cpu", "x" * 10_000, b"y" * 100_000))
    assert len(huge.output_tail) <= OUTPUT_TAIL_MAX and b"[populi] cpu: " in huge.output_tail


def test_a_command_that_cannot_run_makes_a_final_result_that_says_so() -> None:
    detail = "cannot run 'pyhton3': command not found in PATH=/usr/bin:/bin"
    final = result_of(attrs.evolve(_exited(127, "start_failed", detail), final=True))
    assert final.final and final.exit_code == 127
    assert final.output_tail.endswith(f"[populi] start_failed: {detail}; not retried".encode())
    other = result_of(_exited(127, "start_failed", "cannot join the task cgroup"))
    assert not other.final and not other.output_tail.endswith(b"not retried")


def test_the_tail_is_stdout_then_stderr_after_a_marker() -> None:
    assert result_tail(b"out", b"") == b"out"
    assert result_tail(b"", b"err") == b"\n[stderr]\nerr"
    assert result_tail(b"out", b"err") == b"out\n[stderr]\nerr"
    both = attrs.evolve(_exited(3, "exited", out=b"out"), stderr_tail=b"err")
    assert result_of(both).output_tail == b"out\n[stderr]\nerr"


def test_the_why_line_survives_a_full_tail_and_is_itself_bounded() -> None:
    """The newest output is kept up to the room the line leaves; the line is cut to
    280 characters first, so a huge detail cannot push all output out."""
    result = result_of(_exited(1, "cpu", "d" * 10_000, b"o" * 100_000))
    line = b"\n[populi] cpu: " + b"d" * (280 - len("\n[populi] cpu: "))
    assert result.output_tail.endswith(line)
    assert result.output_tail == b"o" * (OUTPUT_TAIL_MAX - len(line)) + line


def test_an_end_the_command_chose_has_no_why_line() -> None:
    result = result_of(_exited(2, "exited", "exited with code 2", b"o" * 100_000))
    assert result.exit_code == 2 and b"[populi]" not in result.output_tail
    assert result.output_tail == b"o" * OUTPUT_TAIL_MAX


def test_a_clock_step_back_gives_a_zero_duration_not_a_negative_one() -> None:
    stepped = attrs.evolve(_exited(0, "exited"), started_at=20.0, ended_at=12.0)
    assert result_of(stepped).duration == 0.0


def test_outputs_and_holders_are_carried() -> None:
    output = TaskOutput("out.txt", "ab" * 32, 3)
    exited = attrs.evolve(_exited(0, "exited"), outputs=(output,), holders=("owner", "b"))
    result = result_of(exited)
    assert result.outputs == (output,) and result.holders == ("owner", "b")
