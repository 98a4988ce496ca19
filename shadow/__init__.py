"""shadowgrad.shadow: the shadow node — receive, verify and reassemble FINAL gradient chunks,
replay the optimizer bit-exactly, serve and persist state.

Nothing is exported yet; the shadow-node issue fills this package.
"""

__all__: list[str] = []
