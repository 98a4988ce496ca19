"""shadowgrad.trainer_hooks: what a training script adds — per-iteration checkpointing of a DDP
job into the shadows, the COMMIT records, the restore API, and the in-band ring all-reduce comm
hook. Imports only torch, numpy, pyzmq and the standard library, never grpc, protobuf, scapy or
mininet.

    sg = attach(ddp_model, optimizer, "job.toml", lr_scheduler=sched, grad_scaler=scaler,
                max_grad_norm=1.0)
    start = sg.restore_or_start()
    for it in range(start.iteration, steps):
        sg.backward(loss_fn(ddp_model(x), y))
        sg.step(user_state={"it": it})

See docs/trainer.md.
"""

from ._launch import init_process_group
from ._session import Shadowgrad, Start, StepInfo, attach
from ._state import rng_state, set_rng_state

__all__ = [
    "attach",
    "Shadowgrad",
    "Start",
    "StepInfo",
    "init_process_group",
    "rng_state",
    "set_rng_state",
]
