# Schedules from the YAML file: expression, time zone, window, retries, DLQ, the exact input, the role.

mock_provider "aws" {
  source = "./tests/mocks"
}

variables {
  name           = "billing"
  enable_ecs     = false
  schedules_file = "tests/schedules.yaml"
}

run "one_schedule_per_entry" {
  command = apply

  assert {
    condition     = toset(keys(aws_scheduler_schedule.this)) == toset(["weekday-report", "nightly-cleanup"])
    error_message = "one schedule per entry of the file"
  }

  assert {
    condition     = aws_scheduler_schedule.this["weekday-report"].group_name == "billing"
    error_message = "schedules live in the worker's own group"
  }

  assert {
    condition     = aws_scheduler_schedule.this["weekday-report"].schedule_expression == "cron(0 9 ? * MON-FRI *)"
    error_message = "the expression is passed through"
  }

  assert {
    condition     = aws_scheduler_schedule.this["weekday-report"].schedule_expression_timezone == "Europe/Berlin"
    error_message = "the time zone is passed through"
  }

  assert {
    condition     = aws_scheduler_schedule.this["nightly-cleanup"].schedule_expression_timezone == "UTC"
    error_message = "the time zone defaults to UTC"
  }

  assert {
    condition     = aws_scheduler_schedule.this["weekday-report"].flexible_time_window[0].mode == "FLEXIBLE" && aws_scheduler_schedule.this["weekday-report"].flexible_time_window[0].maximum_window_in_minutes == 15
    error_message = "flexible window from flexible_window_minutes"
  }

  assert {
    condition     = aws_scheduler_schedule.this["nightly-cleanup"].flexible_time_window[0].mode == "OFF"
    error_message = "no window by default"
  }

  assert {
    condition     = aws_scheduler_schedule.this["nightly-cleanup"].state == "DISABLED" && aws_scheduler_schedule.this["weekday-report"].state == "ENABLED"
    error_message = "enabled: false disables the schedule"
  }
}

run "target_is_the_queue_with_the_worker_envelope" {
  command = apply

  assert {
    condition     = aws_scheduler_schedule.this["weekday-report"].target[0].arn == aws_sqs_queue.queue.arn
    error_message = "schedules send to the work queue"
  }

  assert {
    condition     = aws_scheduler_schedule.this["weekday-report"].target[0].input == "{\"idempotency_key\":\"schedule:weekday-report:<aws.scheduler.scheduled-time>\",\"payload\":{\"limit\":10,\"report\":\"daily\"},\"type\":\"send_report\"}"
    error_message = "the input is the envelope with the scheduled-time placeholder, unescaped"
  }

  assert {
    condition     = aws_scheduler_schedule.this["nightly-cleanup"].target[0].input == "{\"idempotency_key\":\"schedule:nightly-cleanup:<aws.scheduler.scheduled-time>\",\"payload\":{},\"type\":\"cleanup\"}"
    error_message = "a missing payload is an empty object"
  }

  assert {
    condition     = length(aws_scheduler_schedule.this["weekday-report"].target[0].sqs_parameters) == 0
    error_message = "no MessageGroupId on a standard queue"
  }

  assert {
    condition     = aws_scheduler_schedule.this["weekday-report"].target[0].retry_policy[0].maximum_retry_attempts == 10 && aws_scheduler_schedule.this["weekday-report"].target[0].retry_policy[0].maximum_event_age_in_seconds == 3600
    error_message = "retry policy from the variables"
  }

  assert {
    condition     = aws_scheduler_schedule.this["weekday-report"].target[0].dead_letter_config[0].arn == aws_sqs_queue.scheduler_dlq[0].arn
    error_message = "failed deliveries go to the scheduler DLQ"
  }

  assert {
    condition     = aws_sqs_queue.scheduler_dlq[0].fifo_queue == false
    error_message = "Scheduler's DLQ must be a standard queue"
  }
}

run "scheduler_role_may_only_send" {
  command = apply

  assert {
    condition     = aws_scheduler_schedule.this["weekday-report"].target[0].role_arn == aws_iam_role.scheduler[0].arn
    error_message = "schedules assume the scheduler role"
  }

  assert {
    condition     = jsondecode(aws_iam_role.scheduler[0].assume_role_policy).Statement[0].Principal.Service == "scheduler.amazonaws.com"
    error_message = "only Scheduler assumes the role"
  }

  assert {
    condition     = flatten([for statement in jsondecode(aws_iam_role_policy.scheduler[0].policy).Statement : statement.Action]) == ["sqs:SendMessage"]
    error_message = "the scheduler role may only sqs:SendMessage"
  }

  assert {
    condition     = jsondecode(aws_iam_role_policy.scheduler[0].policy).Statement[0].Resource == [aws_sqs_queue.queue.arn, aws_sqs_queue.scheduler_dlq[0].arn]
    error_message = "... to the work queue and its own DLQ only"
  }
}

run "no_schedules_no_scheduler_resources" {
  command = apply

  variables {
    schedules_file = null
  }

  assert {
    condition     = length(aws_scheduler_schedule.this) == 0 && length(aws_iam_role.scheduler) == 0 && length(aws_sqs_queue.scheduler_dlq) == 0
    error_message = "without a schedule file there is no schedule, role or scheduler DLQ"
  }
}

run "unknown_keys_are_rejected_as_the_worker_does" {
  command = plan

  variables {
    schedules_file = "tests/bad-schedules.yaml"
  }

  expect_failures = [aws_scheduler_schedule.this]
}
