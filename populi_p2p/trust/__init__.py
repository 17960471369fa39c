"""Trust: who a node is and who may be in the cluster.

The node's Ed25519 identity (`identity`, key files in `_keyfiles`), the cluster
authority and the enrollment certificates it signs (`authority`, `certificate`), the
revocation list (`revocation`), operator keys that sign cancels (`operator`), the
signed `NodeRecord` and the book that verifies records (`record`, `record_book`), the
keys handed to the packet envelope (`envelope_keys`) and the canonical encoding every
signed message uses (`_codec`). Pure data and signatures: no sockets, no Trio. The
public types are re-exported by `populi_p2p`.
"""
