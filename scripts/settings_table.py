"""Rewrite the `populi-node up` settings table of docs/configuration.md.

The table is made from the declarations of `populi_p2p.config.NodeConfig`; run this
after adding or changing a setting (tests/node/test_settings.py fails while the docs are
stale)::

    python scripts/settings_table.py
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from populi_p2p.config import NodeConfig  # noqa: E402
from populi_p2p.settings import docs_with_table, settings_table  # noqa: E402


def main() -> None:
    docs = REPO / "docs" / "configuration.md"
    docs.write_text(docs_with_table(docs.read_text(), settings_table(NodeConfig)))
    print(f"rewrote the settings table in {docs.relative_to(REPO)}")


if __name__ == "__main__":
    main()
