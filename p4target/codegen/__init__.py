"""The P4 target's two backends, both from the checked program's IR (:mod:`..frontend.ir`).

:mod:`.general` writes the code every accepted program runs on from the IR: a class per header
and struct, a codec per header type, the parse function, a function per control, action, table
and sub-control, the context functions. :mod:`.straight` builds, for the programs it covers,
one straight-line function per program by rewriting the general backend's tree of the blocks,
tables and actions, with the layout in :class:`~..frontend.model.ProgramFacts`. The pipeline
(:mod:`..pipeline`) compiles both into one namespace; the dataplane runs the straight-line
function when it can and the general code otherwise.
"""

__all__ = ["general", "straight"]
