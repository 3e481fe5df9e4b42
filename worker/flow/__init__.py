"""Flow control shared by a fleet of workers: rate limits (``gcra``) and circuit breakers (``breaker``), pure;
their items in DynamoDB or this process (``store``); the gate a job passes before its handler runs (``gate``).

Only the pure, user-facing parts are re-exported here (``worker.jobs`` imports them); the runtime imports
``worker.flow.gate`` itself.
"""

from worker.flow.breaker import Breaker
from worker.flow.gcra import Rate, parse_rate

__all__ = ["Breaker", "Rate", "parse_rate"]
