# The work queue and its dead-letter queue. Encrypted at rest: SSE-SQS, or the customer managed key when given.

resource "aws_sqs_queue" "dlq" {
  name                              = local.dlq_name
  fifo_queue                        = var.fifo_queue
  message_retention_seconds         = var.dead_letter_retention_s
  max_message_size                  = var.max_message_size
  sqs_managed_sse_enabled           = var.kms_key_arn == null ? true : null
  kms_master_key_id                 = var.kms_key_arn
  kms_data_key_reuse_period_seconds = var.kms_key_arn == null ? null : 300
  tags                              = var.tags

  lifecycle {
    precondition {
      condition     = var.dead_letter_retention_s > var.message_retention_s
      error_message = "dead_letter_retention_s must exceed message_retention_s: a standard DLQ keeps each message's original enqueue time."
    }
  }
}

resource "aws_sqs_queue" "queue" {
  name                              = local.queue_name
  fifo_queue                        = var.fifo_queue
  content_based_deduplication       = var.fifo_queue ? var.content_based_deduplication : null
  visibility_timeout_seconds        = var.visibility_timeout_s
  message_retention_seconds         = var.message_retention_s
  max_message_size                  = var.max_message_size
  receive_wait_time_seconds         = var.receive_wait_time_s
  sqs_managed_sse_enabled           = var.kms_key_arn == null ? true : null
  kms_master_key_id                 = var.kms_key_arn
  kms_data_key_reuse_period_seconds = var.kms_key_arn == null ? null : 300
  tags                              = var.tags

  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.dlq.arn
    maxReceiveCount     = var.max_receive_count
  })
}

# Only the work queue may use the DLQ as its dead-letter target.
resource "aws_sqs_queue_redrive_allow_policy" "dlq" {
  count = var.redrive_allow_policy ? 1 : 0

  queue_url = aws_sqs_queue.dlq.id

  redrive_allow_policy = jsonencode({
    redrivePermission = "byQueue"
    sourceQueueArns   = [aws_sqs_queue.queue.arn]
  })
}

# The other queues of a queue set (var.queues after the first, which is aws_sqs_queue.queue above), each with
# its own DLQ, redrive policy and redrive-allow policy, configured as the first.
locals {
  extra_queues = { for index, entry in var.queues : entry.name => entry if index > 0 }
  # Every queue of the worker with its DLQ and weight, highest priority first.
  queue_members = concat(
    [{ label = local.queue_set ? var.queues[0].name : "", queue = aws_sqs_queue.queue, dlq = aws_sqs_queue.dlq, weight = local.queue_set ? var.queues[0].weight : 1 }],
    [for index, entry in var.queues : { label = entry.name, queue = aws_sqs_queue.extra[entry.name], dlq = aws_sqs_queue.extra_dlq[entry.name], weight = entry.weight } if index > 0],
  )
}

resource "aws_sqs_queue" "extra_dlq" {
  for_each = local.extra_queues

  name                              = "${var.name}-${each.key}-dlq${local.suffix}"
  fifo_queue                        = var.fifo_queue
  message_retention_seconds         = var.dead_letter_retention_s
  max_message_size                  = var.max_message_size
  sqs_managed_sse_enabled           = var.kms_key_arn == null ? true : null
  kms_master_key_id                 = var.kms_key_arn
  kms_data_key_reuse_period_seconds = var.kms_key_arn == null ? null : 300
  tags                              = var.tags
}

resource "aws_sqs_queue" "extra" {
  for_each = local.extra_queues

  name                              = "${var.name}-${each.key}${local.suffix}"
  fifo_queue                        = var.fifo_queue
  content_based_deduplication       = var.fifo_queue ? var.content_based_deduplication : null
  visibility_timeout_seconds        = var.visibility_timeout_s
  message_retention_seconds         = var.message_retention_s
  max_message_size                  = var.max_message_size
  receive_wait_time_seconds         = var.receive_wait_time_s
  sqs_managed_sse_enabled           = var.kms_key_arn == null ? true : null
  kms_master_key_id                 = var.kms_key_arn
  kms_data_key_reuse_period_seconds = var.kms_key_arn == null ? null : 300
  tags                              = var.tags

  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.extra_dlq[each.key].arn
    maxReceiveCount     = var.max_receive_count
  })
}

resource "aws_sqs_queue_redrive_allow_policy" "extra_dlq" {
  for_each = var.redrive_allow_policy ? local.extra_queues : {}

  queue_url = aws_sqs_queue.extra_dlq[each.key].id

  redrive_allow_policy = jsonencode({
    redrivePermission = "byQueue"
    sourceQueueArns   = [aws_sqs_queue.extra[each.key].arn]
  })
}
