"""Fixtures for tests and `make demo`, never used by a running node.

`standin` is a stand-in inference engine (``python -m populi_p2p.testing.standin``);
`tiny_gguf` writes a tiny llama GGUF for a real llama.cpp engine. They ship with the
package so that the demo runs from an installed copy.
"""
