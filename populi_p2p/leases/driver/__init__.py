"""The trio driver of the lease agent: the node's lease service and its view.

`populi_p2p.leases` is sans-IO; this subpackage is where its I/O lives:
`service.LeaseService` carries the agent's commands out (the swim channel, the
executor, SQLite through `leases.store`) and `view` turns members' records into
placement candidates and the table into the API's rows. The simulator drives the same
agent without it.
"""
