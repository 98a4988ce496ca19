"""shadowgrad.controller: the ToR switch driver over P4Runtime (``switch``: desired state of
``p4/shadowgrad.p4`` from the job spec and the layout, idempotent convergence, counters) and the
project's one P4Runtime client (``p4runtime``). Needs the ``shadowgrad[controller]`` extra.

Membership, health, consistent-cut tracking, promotion and export come with the controller
issue.
"""

__all__ = ["P4RuntimeClient", "P4RuntimeError", "SwitchDriver", "plan"]


def __getattr__(name: str) -> object:
    # lazy: importing the package must not import grpc/protobuf until they are used
    if name in ("P4RuntimeClient", "P4RuntimeError"):
        from . import p4runtime

        return getattr(p4runtime, name)
    if name in ("SwitchDriver", "plan"):
        from . import switch

        return getattr(switch, name)
    raise AttributeError(name)
