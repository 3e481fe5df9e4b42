"""The fault-injecting proxy of the endpoint-faults test: benchmarks/countproxy.py's counting proxy with a
seeded mix of faults (``rates=``); see that module for the fates a request can draw."""

from __future__ import annotations

from benchmarks.countproxy import ISSUE_MIX, NO_FAULTS, FaultRates
from benchmarks.countproxy import CountingProxy as FaultProxy

__all__ = ["ISSUE_MIX", "NO_FAULTS", "FaultProxy", "FaultRates"]
