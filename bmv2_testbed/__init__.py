"""shadowgrad.bmv2_testbed: the testbed for bmv2-style emulation runs.

Hosts behind one P4 switch on one machine (:mod:`.topology`: network namespaces + veths, or
loopback UDP ports; :mod:`.p4_mininet`: the same as Mininet hosts behind a Mininet
``P4RuntimeSwitch``), the in-band job's switch (:mod:`.inband`), the demo's scenarios, runner,
training worker, progress and report (:mod:`.scenario`, :mod:`.runner`, :mod:`.demo_worker`,
:mod:`.progress`, :mod:`.report`; ``shadowgrad demo``), and p4lang/tutorials' exercise runner
(:mod:`.exercise`, ``shadowgrad-run-exercise``). The switch it runs is ``sg-switch-grpc``, the P4
software target (:mod:`shadowgrad.p4target`), or real ``simple_switch_grpc`` where installed.
Needs the ``shadowgrad[testbed]`` extra; see docs/testbed.md.
"""

__all__: list[str] = []
