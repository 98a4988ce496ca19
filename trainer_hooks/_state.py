"""The rest of a resumable checkpoint (seed 004's list): RNG states and the data position.

Model, optimizer, LR scheduler, grad scaler and module buffers come back with a restore by
themselves. What only the training script knows — its random number generators and where its
data loader stands — it passes as ``user_state`` (rank 0's is kept, in the COMMIT record):

    start = sg.restore_or_start()
    if start.restored:
        set_rng_state(start.user_state["rng"])
    for step in range(start.iteration, steps):
        ...
        sg.step(user_state={"rng": rng_state(), "step": step})

Every value is something ``torch.load(weights_only=True)`` reads back (tensors, lists, numbers),
about 12 KB in all (the COMMIT record's user state must fit one datagram with the rest).
"""

from __future__ import annotations

import random
from typing import Any

import torch

__all__ = ["rng_state", "set_rng_state"]


def rng_state() -> dict[str, Any]:
    """The state of torch's CPU (and, when initialised, CUDA) generators, Python's ``random``
    and NumPy's global generator, in a form the COMMIT blob carries."""
    import numpy as np

    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    out: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [int(version), torch.tensor(mt, dtype=torch.int64), gauss],
        "numpy": [
            str(kind),
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        ],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    import numpy as np

    torch.set_rng_state(state["torch"])
    version, mt, gauss = state["python"]
    random.setstate((int(version), tuple(int(x) for x in mt.tolist()), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state(
        (kind, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached))
    )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
