"""shadowgrad.bmv2_testbed: the P4 software target (a stand-in for ``simple_switch_grpc``),
network-namespace and Mininet topologies, the scenario runner and failure injection. Needs the
``shadowgrad[testbed]`` extra.

Nothing is exported yet; the P4-software-target issue fills this package.
"""

__all__: list[str] = []
