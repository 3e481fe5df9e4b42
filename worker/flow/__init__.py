"""Flow control: when a received job may run (long delays, holds) and how its attempts are counted."""
