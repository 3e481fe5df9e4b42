"""Flow control: which queue a worker receives from next (``priorities``) and when a received job may run.
Long delays and holds (``delays``, ``attempts``: how a job's
attempts are counted); rate limits (``gcra``) and circuit breakers (``breaker``) shared by a fleet, pure; their items
in DynamoDB or this process (``store``); the gate a job passes before its handler runs (``gate``).

Only the pure, user-facing parts are re-exported here (``worker.jobs`` imports them); the runtime imports
``worker.flow.gate`` itself.
"""

from worker.flow.breaker import Breaker
from worker.flow.gcra import Rate, parse_rate

__all__ = ["Breaker", "Rate", "parse_rate"]
