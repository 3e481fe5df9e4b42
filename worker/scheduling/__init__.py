"""Cron expressions (AWS dialect) and the schedules file."""
