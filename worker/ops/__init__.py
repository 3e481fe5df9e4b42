"""What the operator commands do: dead letters, stats, bootstrap, progress, firing a schedule."""
