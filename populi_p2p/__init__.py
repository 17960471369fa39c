"""populi node: identity, signed NodeRecords, GPU truth, state on disk, local API, CLI."""
