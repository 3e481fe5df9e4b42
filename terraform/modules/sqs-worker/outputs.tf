output "queue_url" {
  description = "URL of the work queue (WORKER_QUEUE), or of the first (highest priority) queue of a set."
  value       = aws_sqs_queue.queue.url
}

output "queue_name" {
  description = "Name of the work queue (the Queue dimension of the worker's metrics)."
  value       = aws_sqs_queue.queue.name
}

output "queue_arn" {
  description = "ARN of the work queue (for producers' IAM policies)."
  value       = aws_sqs_queue.queue.arn
}

output "queue_urls" {
  description = "URL of each queue of the worker, highest priority first (one: [queue_url])."
  value       = [for member in local.queue_members : member.queue.url]
}

output "dead_letter_queue_urls" {
  description = "URL of each queue's own DLQ, in the order of queue_urls."
  value       = [for member in local.queue_members : member.dlq.url]
}

output "dead_letter_queue_url" {
  description = "URL of the DLQ (WORKER_DEAD_LETTER_QUEUE)."
  value       = aws_sqs_queue.dlq.url
}

output "dead_letter_queue_arn" {
  description = "ARN of the DLQ."
  value       = aws_sqs_queue.dlq.arn
}

output "idempotency_table_name" {
  description = "Name of the idempotency table (WORKER_IDEMPOTENCY_TABLE), or null."
  value       = try(aws_dynamodb_table.idempotency[0].name, null)
}

output "idempotency_table_arn" {
  description = "ARN of the idempotency table, or null."
  value       = try(aws_dynamodb_table.idempotency[0].arn, null)
}

output "worker_environment" {
  description = "The WORKER_* settings the task definition sets; use them for workers run elsewhere."
  value       = local.worker_environment
}

output "schedule_arns" {
  description = "ARN of each Scheduler schedule, by schedule name."
  value       = { for name, schedule in aws_scheduler_schedule.this : name => schedule.arn }
}

output "schedule_inputs" {
  description = "The message body each schedule sends (with <aws.scheduler.scheduled-time> still in it), by name."
  value       = local.schedule_bodies
}

output "scheduler_dead_letter_queue_url" {
  description = "URL of the queue holding deliveries Scheduler gave up on, or null without schedules."
  value       = try(aws_sqs_queue.scheduler_dlq[0].url, null)
}

output "scheduler_role_arn" {
  description = "ARN of the role Scheduler assumes to send to the queue, or null without schedules."
  value       = try(aws_iam_role.scheduler[0].arn, null)
}

output "alarm_topic_arn" {
  description = "SNS topic the alarms notify."
  value       = local.alarm_topic_arn
}

output "alarm_names" {
  description = "Names of the CloudWatch alarms."
  value = concat(
    [for alarm in aws_cloudwatch_metric_alarm.queue : alarm.alarm_name],
    [aws_cloudwatch_metric_alarm.job_failures.alarm_name],
    aws_cloudwatch_metric_alarm.scheduler_dlq[*].alarm_name,
  )
}

output "dashboard_name" {
  description = "Name of the CloudWatch dashboard, or null."
  value       = try(aws_cloudwatch_dashboard.this[0].dashboard_name, null)
}

output "task_role_arn" {
  description = "ARN of the worker's task role, or null without ECS."
  value       = try(aws_iam_role.task[0].arn, null)
}

output "task_definition_arn" {
  description = "ARN of the task definition, or null without ECS."
  value       = try(aws_ecs_task_definition.worker[0].arn, null)
}

output "service_name" {
  description = "Name of the ECS service, or null without ECS."
  value       = try(aws_ecs_service.worker[0].name, null)
}

output "web_dashboard_url" {
  description = "The dashboard's address on its internal ALB (null unless enable_web_dashboard)."
  value       = local.web_dashboard ? "https://${aws_lb.web_dashboard[0].dns_name}/" : null
}
