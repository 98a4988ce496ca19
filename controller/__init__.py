"""shadowgrad.controller: switch driver (P4Runtime), membership and health, consistent-cut
tracking, promotion and export. Needs the ``shadowgrad[controller]`` extra.

Nothing is exported yet; the controller issue fills this package.
"""

__all__: list[str] = []
