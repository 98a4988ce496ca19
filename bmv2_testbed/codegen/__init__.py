"""The P4 target's two backends, both from what the checker produced.

:mod:`.general` is the code every accepted program runs on: a class per header and struct, a
codec per header type, the context functions, and the naming and value rules the checker's
code of blocks, tables and actions follows. :mod:`.straight` builds, for the programs it
covers, one straight-line function per program from the general backend's block code (as a
tree, parsed once) and the layout in :class:`~..frontend.model.ProgramFacts`. The pipeline
(:mod:`..pipeline`) compiles both into one namespace; the dataplane runs the straight-line
function when it can and the general code otherwise.
"""

__all__ = ["general", "straight"]
