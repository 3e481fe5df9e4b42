# Alarms to an SNS topic (created here unless given), and a dashboard for the queue, the DLQ and the jobs.

resource "aws_sns_topic" "alarms" {
  count = var.alarm_topic_arn == null ? 1 : 0

  name              = "${var.name}-alarms"
  kms_master_key_id = var.kms_key_arn != null ? var.kms_key_arn : "alias/aws/sns"
  tags              = var.tags
}

locals {
  # Per queue (a queue set: each queue and its DLQ, named <name>-<queue>-<alarm>; one queue: <name>-<alarm>).
  queue_alarms = merge([
    for member in local.queue_members : {
      "${member.label == "" ? "" : "${member.label}-"}dlq-not-empty" = {
        description = "Messages are waiting in the dead-letter queue ${member.dlq.name}: jobs failed for good."
        metric      = "ApproximateNumberOfMessagesVisible"
        queue       = member.dlq.name
        statistic   = "Maximum"
        threshold   = 0
        periods     = 1
      }
      "${member.label == "" ? "" : "${member.label}-"}oldest-message-age" = {
        description = "The oldest message in ${member.queue.name} waited longer than ${var.alarm_oldest_message_age_s} s: workers are behind or stuck."
        metric      = "ApproximateAgeOfOldestMessage"
        queue       = member.queue.name
        statistic   = "Maximum"
        threshold   = var.alarm_oldest_message_age_s
        periods     = var.alarm_evaluation_periods
      }
      "${member.label == "" ? "" : "${member.label}-"}queue-depth" = {
        description = "More than ${var.alarm_queue_depth} messages wait in ${member.queue.name}."
        metric      = "ApproximateNumberOfMessagesVisible"
        queue       = member.queue.name
        statistic   = "Maximum"
        threshold   = var.alarm_queue_depth
        periods     = var.alarm_evaluation_periods
      }
    }
  ]...)
}

resource "aws_cloudwatch_metric_alarm" "queue" {
  for_each = local.queue_alarms

  alarm_name          = "${var.name}-${each.key}"
  alarm_description   = each.value.description
  namespace           = "AWS/SQS"
  metric_name         = each.value.metric
  dimensions          = { QueueName = each.value.queue }
  statistic           = each.value.statistic
  period              = 60
  evaluation_periods  = each.value.periods
  comparison_operator = "GreaterThanThreshold"
  threshold           = each.value.threshold
  treat_missing_data  = "notBreaching"
  alarm_actions       = [local.alarm_topic_arn]
  ok_actions          = [local.alarm_topic_arn]
  tags                = var.tags
}

# Dead-lettered jobs as the worker counts them (its own metrics, dimension Queue = the queue's name).
resource "aws_cloudwatch_metric_alarm" "job_failures" {
  alarm_name          = "${var.name}-job-failures"
  alarm_description   = "The worker dead-lettered jobs from ${local.queue_name} (metric JobsDeadLettered in ${var.metrics_namespace})."
  namespace           = var.metrics_namespace
  metric_name         = "JobsDeadLettered"
  dimensions          = { Queue = aws_sqs_queue.queue.name }
  statistic           = "Sum"
  period              = 60
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"
  alarm_actions       = [local.alarm_topic_arn]
  ok_actions          = [local.alarm_topic_arn]
  tags                = var.tags
}

resource "aws_cloudwatch_metric_alarm" "scheduler_dlq" {
  count = local.has_schedules ? 1 : 0

  alarm_name          = "${var.name}-scheduler-dlq-not-empty"
  alarm_description   = "EventBridge Scheduler could not deliver scheduled jobs to ${local.queue_name}; they wait in ${aws_sqs_queue.scheduler_dlq[0].name}."
  namespace           = "AWS/SQS"
  metric_name         = "ApproximateNumberOfMessagesVisible"
  dimensions          = { QueueName = aws_sqs_queue.scheduler_dlq[0].name }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"
  alarm_actions       = [local.alarm_topic_arn]
  ok_actions          = [local.alarm_topic_arn]
  tags                = var.tags
}

resource "aws_cloudwatch_dashboard" "this" {
  count = var.create_dashboard ? 1 : 0

  dashboard_name = var.name
  dashboard_body = jsonencode({
    widgets = [
      {
        type = "metric", x = 0, y = 0, width = 12, height = 6
        properties = {
          title  = "Queue: waiting and in flight"
          region = data.aws_region.current.name
          stat   = "Maximum"
          period = 60
          metrics = flatten([
            for member in local.queue_members : [
              ["AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", member.queue.name],
              ["AWS/SQS", "ApproximateNumberOfMessagesNotVisible", "QueueName", member.queue.name],
              ["AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", member.dlq.name, { label = "DLQ visible" }],
            ]
          ])
        }
      },
      {
        type = "metric", x = 12, y = 0, width = 12, height = 6
        properties = {
          title   = "Age of the oldest message (s)"
          region  = data.aws_region.current.name
          stat    = "Maximum"
          period  = 60
          metrics = [for member in local.queue_members : ["AWS/SQS", "ApproximateAgeOfOldestMessage", "QueueName", member.queue.name]]
          annotations = {
            horizontal = [{ label = "alarm", value = var.alarm_oldest_message_age_s }]
          }
        }
      },
      {
        type = "metric", x = 0, y = 6, width = 12, height = 6
        properties = {
          title  = "Jobs"
          region = data.aws_region.current.name
          stat   = "Sum"
          period = 60
          metrics = [
            for name in ["JobsProcessed", "JobsSucceeded", "JobsRetried", "JobsDeadLettered", "DuplicatesSkipped"] :
            [var.metrics_namespace, name, "Queue", aws_sqs_queue.queue.name]
          ]
        }
      },
      {
        type = "metric", x = 12, y = 6, width = 12, height = 6
        properties = {
          title  = "Job duration and queue wait (ms)"
          region = data.aws_region.current.name
          period = 60
          metrics = [
            [var.metrics_namespace, "JobDuration", "Queue", aws_sqs_queue.queue.name, { stat = "p50" }],
            [var.metrics_namespace, "JobDuration", "Queue", aws_sqs_queue.queue.name, { stat = "p99" }],
            [var.metrics_namespace, "QueueWait", "Queue", aws_sqs_queue.queue.name, { stat = "p99" }],
          ]
        }
      },
      {
        type = "metric", x = 0, y = 12, width = 24, height = 6
        properties = {
          title  = "Worker slots"
          region = data.aws_region.current.name
          stat   = "Average"
          period = 60
          metrics = [
            [var.metrics_namespace, "InFlight", "Queue", aws_sqs_queue.queue.name],
            [var.metrics_namespace, "FreeSlots", "Queue", aws_sqs_queue.queue.name],
          ]
        }
      },
    ]
  })
}
