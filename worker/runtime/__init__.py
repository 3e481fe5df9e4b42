"""The event loop and a message's life: the consume loop, execution, heartbeats, outcomes, slots."""
