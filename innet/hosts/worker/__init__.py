"""The worker side of in-network and PBox all-reduce.

``call``: one worker's part of one all-reduce (``AllreduceCall``), the data it sends and takes in;
``window``: its slots, and what it resends when; ``framing``: its chunks' frames and the buffers they and
its results live in; ``process``: a worker host's whole run, one call per tensor (``WorkerProcess``).
"""
