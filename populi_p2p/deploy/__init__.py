"""Deployments: a model served by N replicas, placed and owned as lease tasks
(docs/models.md, "Deployments"). `runner.DeploymentRunner` brings a replica up on its
owner; `service.DeployService` is ``deploy``, ``deployments`` and ``undeploy``;
`engine_command` is the one place that says how an engine is started."""
