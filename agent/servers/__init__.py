"""What a sidecar serves to people and tools, beside its peer and trainer services.

* :mod:`agent.servers.admin`: the ``elastic_sidecar.v1.Admin`` gRPC API
  (status, decision stream, hold/resume/drain/checkpoint/abort), with
  ``grpc.health.v1`` and server reflection on the same port;
* :mod:`agent.servers.http`: ``/healthz``, ``/readyz``, ``/metrics``, ``/status``
  and a one-page status view;
* :mod:`agent.servers.status`: the status both of them report, built from the
  coordinator's state or a worker's view of itself;
* :mod:`agent.servers.feed`: the recent-decisions buffer the event streams read.
"""
