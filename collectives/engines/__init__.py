"""The engines a :class:`~collectives.Communicator` hands its calls to: one per communicator,
chosen once when it is made (:class:`~collectives.engines.base.Engine`, the protocol).

* :mod:`~collectives.engines.host`: the channel's collectives on the host backend, with the
  plan-cache fast path of small repeated calls;
* :mod:`~collectives.engines.gpu`: the GPU kernels on the nvshmem backend (it loads CUDA, so
  it is imported only there);
* :mod:`~collectives.engines.team`: a proper team's collectives, on the team's communicator.
"""
