# Cron jobs from the schedule file the worker also reads: each one an EventBridge Scheduler schedule that
# sends the worker's envelope to the queue. Scheduler fills in <aws.scheduler.scheduled-time>, so the
# idempotency key "schedule:<name>:<time>" is the same for every delivery of one fire (a double fire runs once).

locals {
  schedule_file = yamldecode(var.schedules_file == null ? "schedules: []" : file(var.schedules_file))
  schedules     = { for schedule in try(local.schedule_file.schedules, []) : schedule.name => schedule }

  # Built by hand rather than with one jsonencode so the placeholder's < and > are not escaped; keys are in
  # the order jsonencode writes them. worker.scheduling.schedules.Schedule.body_template builds the same bytes.
  schedule_bodies = {
    for name, schedule in local.schedules : name => join("", [
      "{\"idempotency_key\":\"schedule:${name}:<aws.scheduler.scheduled-time>\",",
      "\"payload\":${jsonencode(try(schedule.payload, {}))},",
      "\"type\":${jsonencode(schedule.type)}}",
    ])
  }
  has_schedules = length(local.schedules) > 0

  # The keys worker.scheduling.schedules.Schedule accepts; the worker rejects others, so Terraform does too.
  schedule_keys = ["name", "expression", "timezone", "type", "payload", "flexible_window_minutes", "enabled", "start_date", "end_date", "description"]
}

resource "aws_scheduler_schedule_group" "this" {
  count = local.has_schedules ? 1 : 0

  name = var.name
  tags = var.tags
}

# Deliveries Scheduler could not make after its retries (Scheduler needs a standard queue here).
resource "aws_sqs_queue" "scheduler_dlq" {
  count = local.has_schedules ? 1 : 0

  name                              = "${var.name}-scheduler-dlq"
  fifo_queue                        = false
  message_retention_seconds         = 1209600
  sqs_managed_sse_enabled           = var.kms_key_arn == null ? true : null
  kms_master_key_id                 = var.kms_key_arn
  kms_data_key_reuse_period_seconds = var.kms_key_arn == null ? null : 300
  tags                              = var.tags
}

resource "aws_scheduler_schedule" "this" {
  for_each = local.schedules

  name                         = each.key
  group_name                   = aws_scheduler_schedule_group.this[0].name
  description                  = try(each.value.description, null)
  schedule_expression          = each.value.expression
  schedule_expression_timezone = try(each.value.timezone, "UTC")
  state                        = try(each.value.enabled, true) ? "ENABLED" : "DISABLED"
  start_date                   = try(each.value.start_date, null)
  end_date                     = try(each.value.end_date, null)
  kms_key_arn                  = var.kms_key_arn

  flexible_time_window {
    mode                      = try(each.value.flexible_window_minutes, 0) > 0 ? "FLEXIBLE" : "OFF"
    maximum_window_in_minutes = try(each.value.flexible_window_minutes, 0) > 0 ? each.value.flexible_window_minutes : null
  }

  target {
    arn      = aws_sqs_queue.queue.arn
    role_arn = aws_iam_role.scheduler[0].arn
    input    = local.schedule_bodies[each.key]

    dynamic "sqs_parameters" {
      for_each = var.fifo_queue ? [each.key] : []
      content {
        message_group_id = sqs_parameters.value
      }
    }

    retry_policy {
      maximum_retry_attempts       = var.schedule_retry_attempts
      maximum_event_age_in_seconds = var.schedule_max_event_age_s
    }

    dead_letter_config {
      arn = aws_sqs_queue.scheduler_dlq[0].arn
    }
  }

  lifecycle {
    precondition {
      condition     = alltrue([for key in keys(each.value) : contains(local.schedule_keys, key)])
      error_message = "Schedule ${each.key}: unknown keys ${join(", ", setsubtract(keys(each.value), local.schedule_keys))} (allowed: ${join(", ", local.schedule_keys)}). Check with `sqs-worker schedules list`."
    }
    precondition {
      condition     = can(regex("^[0-9A-Za-z_.-]{1,64}$", each.key)) && can(tostring(each.value.type)) && can(tostring(each.value.expression))
      error_message = "Schedule ${each.key}: needs a name of 1-64 of [0-9A-Za-z_.-], an expression and a type."
    }
  }
}
