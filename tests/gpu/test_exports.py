"""The package's public surface: everything in __all__ exists and comes from _x modules."""

from __future__ import annotations

import populi_p2p.gpu as gpu


def test_all_names_exist_and_are_sorted_and_unique():
    assert len(set(gpu.__all__)) == len(gpu.__all__)
    assert gpu.__all__ == sorted(gpu.__all__, key=lambda n: (not n.isupper(), n))
    for name in gpu.__all__:
        assert hasattr(gpu, name), name


def test_public_objects_live_in_private_modules():
    for name in gpu.__all__:
        module = getattr(getattr(gpu, name), "__module__", None)
        if module is not None and module != "builtins":
            assert module.startswith("populi_p2p.gpu._"), (name, module)


def test_no_public_name_is_left_out():
    public = {
        n
        for n, v in vars(gpu).items()
        if not n.startswith("_") and getattr(v, "__module__", "").startswith("populi_p2p.gpu._")
    }
    assert public <= set(gpu.__all__)
