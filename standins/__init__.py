"""Stand-ins for systems that cannot run on this machine.

Each is a small loopback process or helper, named as a stand-in, and kept out
of ``agent/`` and its decision logic. A stand-in never tells the trainer or the
daemon anything the real system would not:

* :mod:`standins.pathways_worker` - a Pathways worker on a TPU host: it serves
  ``grpc.health.v1`` and nothing else.
* :mod:`standins.pathways_runtime` - the trainer-side view Pathways gives a
  JAX program: when a worker disappears, computations touching its devices
  fail with ``DATA_LOSS`` (raised by pathwaysutils' own fault injection).
* :mod:`standins.kube_api` - the Kubernetes API server's ``GET /api/v1/nodes/{name}``
  (a node's labels, hence its GKE node pool) and, for ``elastic-sidecar drill``, a
  JobSet's pods (list, get, delete) and the JobSet's ``status.restarts``; nothing else.
* :mod:`standins.provisioner` - Kueue/JobSet/GKE recreating a lost slice
  after a delay.
"""
