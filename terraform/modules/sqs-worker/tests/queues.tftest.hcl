# Queues, DLQ, redrive, encryption and the idempotency table, against a mocked AWS provider.

mock_provider "aws" {
  source = "./tests/mocks"
}

variables {
  name       = "billing"
  enable_ecs = false
}

run "standard_queue_and_dlq" {
  command = apply

  assert {
    condition     = aws_sqs_queue.queue.name == "billing" && aws_sqs_queue.dlq.name == "billing-dlq"
    error_message = "queue and DLQ are named <name> and <name>-dlq"
  }

  assert {
    condition     = jsondecode(aws_sqs_queue.queue.redrive_policy).deadLetterTargetArn == aws_sqs_queue.dlq.arn
    error_message = "the queue redrives to the DLQ"
  }

  assert {
    condition     = jsondecode(aws_sqs_queue.queue.redrive_policy).maxReceiveCount == 7
    error_message = "maxReceiveCount comes from var.max_receive_count (default 7)"
  }

  assert {
    condition     = jsondecode(aws_sqs_queue_redrive_allow_policy.dlq[0].redrive_allow_policy).redrivePermission == "byQueue"
    error_message = "the DLQ allows redrive by queue only"
  }

  assert {
    condition     = jsondecode(aws_sqs_queue_redrive_allow_policy.dlq[0].redrive_allow_policy).sourceQueueArns == [aws_sqs_queue.queue.arn]
    error_message = "only the work queue may use the DLQ"
  }

  assert {
    condition     = aws_sqs_queue.dlq.message_retention_seconds > aws_sqs_queue.queue.message_retention_seconds
    error_message = "the DLQ keeps messages longer than the queue"
  }

  assert {
    condition     = aws_sqs_queue.queue.sqs_managed_sse_enabled && aws_sqs_queue.dlq.sqs_managed_sse_enabled
    error_message = "both queues are encrypted at rest (SSE-SQS without a CMK)"
  }

  assert {
    condition     = aws_sqs_queue.queue.fifo_queue == false
    error_message = "standard queue by default"
  }
}

run "idempotency_table" {
  command = apply

  assert {
    condition     = aws_dynamodb_table.idempotency[0].name == "billing-idempotency" && aws_dynamodb_table.idempotency[0].hash_key == "key"
    error_message = "the table is <name>-idempotency with partition key 'key' (the worker's ledger)"
  }

  assert {
    condition     = one([for attribute in aws_dynamodb_table.idempotency[0].attribute : attribute.type if attribute.name == "key"]) == "S"
    error_message = "the key is a string"
  }

  assert {
    condition     = aws_dynamodb_table.idempotency[0].billing_mode == "PAY_PER_REQUEST"
    error_message = "on-demand billing"
  }

  assert {
    condition     = aws_dynamodb_table.idempotency[0].ttl[0].attribute_name == "expiration" && aws_dynamodb_table.idempotency[0].ttl[0].enabled
    error_message = "TTL on the 'expiration' attribute"
  }

  assert {
    condition     = aws_dynamodb_table.idempotency[0].point_in_time_recovery[0].enabled
    error_message = "point-in-time recovery on"
  }

  assert {
    condition     = aws_dynamodb_table.idempotency[0].server_side_encryption[0].enabled
    error_message = "encrypted with KMS"
  }
}

run "fifo_queues" {
  command = apply

  variables {
    fifo_queue     = true
    schedules_file = "tests/schedules.yaml"
  }

  assert {
    condition     = aws_sqs_queue.queue.name == "billing.fifo" && aws_sqs_queue.dlq.name == "billing-dlq.fifo"
    error_message = "FIFO names end in .fifo, and the DLQ is FIFO too"
  }

  assert {
    condition     = aws_sqs_queue.queue.fifo_queue && aws_sqs_queue.dlq.fifo_queue && aws_sqs_queue.queue.content_based_deduplication
    error_message = "FIFO queues with content-based deduplication (Scheduler sends no deduplication id)"
  }

  assert {
    condition     = aws_scheduler_schedule.this["weekday-report"].target[0].sqs_parameters[0].message_group_id == "weekday-report"
    error_message = "a FIFO target needs a MessageGroupId: the schedule's name"
  }
}

run "customer_managed_key" {
  command = apply

  variables {
    kms_key_arn = "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
  }

  assert {
    condition     = aws_sqs_queue.queue.kms_master_key_id == var.kms_key_arn && aws_dynamodb_table.idempotency[0].server_side_encryption[0].kms_key_arn == var.kms_key_arn
    error_message = "the CMK encrypts the queue and the table"
  }
}

run "dlq_retention_must_exceed_the_queue" {
  command = plan

  variables {
    message_retention_s     = 1209000
    dead_letter_retention_s = 1209000
  }

  expect_failures = [aws_sqs_queue.dlq]
}

run "shutdown_grace_must_fit_the_stop_timeout" {
  command = plan

  variables {
    shutdown_grace_s = 115
  }

  expect_failures = [var.shutdown_grace_s]
}

run "queue_set_each_queue_with_its_own_dlq" {
  command = apply

  variables {
    queues      = [{ name = "critical", weight = 10 }, { name = "default", weight = 3 }, { name = "bulk" }]
    queues_mode = "strict"
  }

  assert {
    condition     = aws_sqs_queue.queue.name == "billing-critical" && aws_sqs_queue.dlq.name == "billing-critical-dlq" && aws_sqs_queue.extra["bulk"].name == "billing-bulk" && aws_sqs_queue.extra_dlq["bulk"].name == "billing-bulk-dlq" && length(aws_sqs_queue.extra) == 2
    error_message = "the set is <name>-<queue> with <name>-<queue>-dlq, the first one as aws_sqs_queue.queue"
  }

  assert {
    condition     = alltrue([for key in ["default", "bulk"] : jsondecode(aws_sqs_queue.extra[key].redrive_policy).deadLetterTargetArn == aws_sqs_queue.extra_dlq[key].arn && jsondecode(aws_sqs_queue.extra[key].redrive_policy).maxReceiveCount == 7])
    error_message = "each queue of the set redrives to its own DLQ"
  }

  assert {
    condition     = alltrue([for key in ["default", "bulk"] : jsondecode(aws_sqs_queue_redrive_allow_policy.extra_dlq[key].redrive_allow_policy).sourceQueueArns == [aws_sqs_queue.extra[key].arn]])
    error_message = "each DLQ accepts only its own queue"
  }

  assert {
    condition     = alltrue([for key in ["default", "bulk"] : aws_sqs_queue.extra_dlq[key].message_retention_seconds > aws_sqs_queue.extra[key].message_retention_seconds && aws_sqs_queue.extra[key].sqs_managed_sse_enabled && aws_sqs_queue.extra_dlq[key].sqs_managed_sse_enabled])
    error_message = "the set's queues are configured as the first: encrypted, DLQ retention above the queue's"
  }

  assert {
    condition     = output.worker_environment.WORKER_QUEUES == "${aws_sqs_queue.queue.url}:10,${aws_sqs_queue.extra["default"].url}:3,${aws_sqs_queue.extra["bulk"].url}:1" && output.worker_environment.WORKER_QUEUES_MODE == "strict"
    error_message = "the worker gets WORKER_QUEUES (URL:weight, highest priority first) and WORKER_QUEUES_MODE"
  }

  assert {
    condition     = !contains(keys(output.worker_environment), "WORKER_QUEUE") && !contains(keys(output.worker_environment), "WORKER_DEAD_LETTER_QUEUE")
    error_message = "no WORKER_QUEUE or WORKER_DEAD_LETTER_QUEUE with a set (the worker refuses both): each queue's DLQ is its redrive target"
  }

  assert {
    condition     = output.queue_urls == [aws_sqs_queue.queue.url, aws_sqs_queue.extra["default"].url, aws_sqs_queue.extra["bulk"].url] && output.dead_letter_queue_urls == [aws_sqs_queue.dlq.url, aws_sqs_queue.extra_dlq["default"].url, aws_sqs_queue.extra_dlq["bulk"].url]
    error_message = "every queue and DLQ URL is an output, in priority order"
  }
}

run "queue_set_names_must_be_distinct" {
  command = plan

  variables {
    queues = [{ name = "bulk" }, { name = "bulk", weight = 2 }]
  }

  expect_failures = [var.queues]
}

run "queue_set_weights_are_whole_numbers_up_to_1000" {
  command = plan

  variables {
    queues = [{ name = "critical", weight = 0 }]
  }

  expect_failures = [var.queues]
}
