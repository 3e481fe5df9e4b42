"""Flow control: which queue a worker receives from next (priorities), and later rate limits and breakers."""
