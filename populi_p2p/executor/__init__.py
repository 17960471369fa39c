"""The task executor: the processes of the tasks this node owns.

`service.ExecutorService` is the node's `runner.TaskRunner`: it starts each task under
a wrapper process (`_wrapper`, outside the daemon), isolated (`_isolation`, `_cgroup`),
bounded (`_supervisor`) and fenced, keeps its output (`logs` serves it to any node)
and reports its end as a `TaskExited` (`results` makes the signed `TaskResult` of
it). The lease driver (`populi_p2p.leases.driver`) decides what runs; this package
decides how. See docs/executor.md.
"""
