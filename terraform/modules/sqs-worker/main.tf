data "aws_region" "current" {}

data "aws_partition" "current" {}

locals {
  suffix          = var.fifo_queue ? ".fifo" : ""
  queue_set       = length(var.queues) > 0
  first_label     = local.queue_set ? "${var.name}-${var.queues[0].name}" : var.name
  queue_name      = "${local.first_label}${local.suffix}"
  dlq_name        = "${local.first_label}-dlq${local.suffix}"
  table_name      = "${var.name}-idempotency"
  stop_timeout_s  = min(120, ceil(var.shutdown_grace_s) + 10)
  alarm_topic_arn = var.alarm_topic_arn != null ? var.alarm_topic_arn : aws_sns_topic.alarms[0].arn

  # The worker's settings, exactly as the task definition sets them (also an output, for other runtimes).
  # Each key is a field of worker.settings.WorkerSettings with the WORKER_ prefix; a test checks that.
  worker_environment = merge(
    local.queue_set ? {
      # Each queue of the set dead-letters into its own DLQ (its redrive target): no WORKER_DEAD_LETTER_QUEUE.
      WORKER_QUEUES      = join(",", [for member in local.queue_members : "${member.queue.url}:${member.weight}"])
      WORKER_QUEUES_MODE = var.queues_mode
      } : {
      WORKER_QUEUE             = aws_sqs_queue.queue.url
      WORKER_DEAD_LETTER_QUEUE = aws_sqs_queue.dlq.url
    },
    {
      WORKER_VISIBILITY_TIMEOUT_S = tostring(var.visibility_timeout_s)
      WORKER_MAX_RECEIVE_COUNT    = tostring(var.max_receive_count)
      WORKER_SHUTDOWN_GRACE_S     = tostring(var.shutdown_grace_s)
      WORKER_CONCURRENCY          = tostring(var.concurrency)
      WORKER_PREFETCH             = tostring(var.prefetch)
      WORKER_PROCESSES            = tostring(max(1, floor(var.cpu / 1024))) # one event loop per whole vCPU of the task
      WORKER_METRICS_NAMESPACE    = var.metrics_namespace
      WORKER_METRICS              = "emf"
      WORKER_LOG_FORMAT           = "json"
    },
    length(var.handlers) > 0 ? { WORKER_HANDLERS = join(",", var.handlers) } : {},
    var.create_idempotency_table ? { WORKER_IDEMPOTENCY_TABLE = aws_dynamodb_table.idempotency[0].name } : {},
    var.container_schedules_file != null ? { WORKER_SCHEDULES_FILE = var.container_schedules_file } : {},
  )
}
