"""`TaskSpec`: validation with one-line errors, canonical encoding, content id, signing."""

from __future__ import annotations

import pytest

from populi_p2p.leases import Requirements, TaskKind, TaskSpec, check_new_requirements
from populi_p2p.leases._spec import VRAM_WITHOUT_GPUS

from .helpers import fake_sign, fake_verify, spec


def test_task_id_is_the_content_hash_and_ignores_dict_order() -> None:
    a = TaskSpec(TaskKind.BATCH, Requirements(), ["x"], env={"A": "1", "B": "2"}, submitted_by="n0")
    b = TaskSpec(TaskKind.BATCH, Requirements(), ["x"], env={"B": "2", "A": "1"}, submitted_by="n0")
    assert a.canonical() == b.canonical() and a.task_id() == b.task_id()
    assert len(a.task_id()) == 32
    assert spec(1).task_id() != spec(2).task_id()


def test_round_trip_through_wire_layout() -> None:
    s = spec(3, labels=("zone=eu",))
    assert TaskSpec.from_wire(s.to_wire()) == s


def test_signature_checks_with_the_submitter() -> None:
    s = spec(0, by="n0")
    sig = s.sign(fake_sign("n0"))
    assert s.verify(sig, fake_verify)
    assert not s.verify(fake_sign("evil")(b"x"), fake_verify)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"command": []}, "command is empty"),
        ({"command": ["x"] * 65}, "at most 64"),
        ({"env": {f"K{i}": "v" for i in range(65)}}, "env has 65"),
        ({"env": {"K": "v" * 5000}}, "env is larger"),
        ({"timeout": 0}, "timeout must be"),
        ({"retry_limit": 9}, "retry_limit"),
        ({"submitted_by": ""}, "submitted_by"),
    ],
)
def test_bad_specs_raise_one_line_value_errors(kwargs: dict, message: str) -> None:
    base = {
        "kind": TaskKind.BATCH,
        "requirements": Requirements(),
        "command": ["x"],
        "submitted_by": "n0",
    }
    with pytest.raises(ValueError, match=message) as info:
        TaskSpec(**(base | kwargs))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpu_count": -1}, "gpu_count"),
        ({"vram_per_gpu": -5}, "vram_per_gpu"),
        ({"ram": -1}, "ram"),
        ({"compute_capability_min": (8, 100)}, "compute_capability_min"),
        ({"labels_required": frozenset({""})}, "labels_required"),
    ],
)
def test_bad_requirements(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Requirements(**kwargs)


def test_new_specs_with_vram_but_no_gpus_are_refused_but_old_ones_still_decode() -> None:
    """VRAM is per GPU: asking for it with no GPUs was silently ignored (issue 17)."""
    with pytest.raises(ValueError) as info:
        check_new_requirements(Requirements(gpu_count=0, vram_per_gpu=16 << 30))
    assert str(info.value) == VRAM_WITHOUT_GPUS
    assert "--gpus 1" in VRAM_WITHOUT_GPUS and "\n" not in VRAM_WITHOUT_GPUS
    check_new_requirements(Requirements(gpu_count=1, vram_per_gpu=16 << 30))
    check_new_requirements(Requirements(gpu_count=2))
    check_new_requirements(Requirements())
    # A spec accepted before the rule (stored, or gossiped by an older node) decodes.
    old = spec(7, gpus=0)
    assert old.requirements.vram_per_gpu > 0
    assert TaskSpec.from_wire(old.to_wire()) == old
