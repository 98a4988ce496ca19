"""shadowgrad.trainer_hooks: what a training script adds — DDP comm hooks, the gradient
transport, COMMIT records and the restore API. Imports only torch, numpy and the standard
library, never grpc, protobuf, scapy or mininet.

Nothing is exported yet; the trainer-hooks issue fills this package.
"""

__all__: list[str] = []
