# Alarms, IAM statements, the ECS task definition and autoscaling, against a mocked AWS provider.

mock_provider "aws" {
  source = "./tests/mocks"
}

variables {
  name           = "billing"
  image          = "123456789012.dkr.ecr.us-east-1.amazonaws.com/billing-worker:1.0.0"
  vpc_id         = "vpc-0123456789abcdef0"
  subnet_ids     = ["subnet-0123456789abcdef0"]
  handlers       = ["billing.jobs", "billing.reports"]
  schedules_file = "tests/schedules.yaml"
}

run "alarms_notify_the_topic" {
  command = apply

  assert {
    condition     = toset([for alarm in aws_cloudwatch_metric_alarm.queue : alarm.alarm_name]) == toset(["billing-dlq-not-empty", "billing-oldest-message-age", "billing-queue-depth"])
    error_message = "alarms on the DLQ, the oldest message's age and the queue depth"
  }

  assert {
    condition     = aws_cloudwatch_metric_alarm.queue["dlq-not-empty"].dimensions.QueueName == "billing-dlq" && aws_cloudwatch_metric_alarm.queue["dlq-not-empty"].threshold == 0 && aws_cloudwatch_metric_alarm.queue["dlq-not-empty"].comparison_operator == "GreaterThanThreshold"
    error_message = "the DLQ alarm fires on any visible message"
  }

  assert {
    condition     = aws_cloudwatch_metric_alarm.queue["oldest-message-age"].metric_name == "ApproximateAgeOfOldestMessage" && aws_cloudwatch_metric_alarm.queue["oldest-message-age"].threshold == 600 && aws_cloudwatch_metric_alarm.queue["oldest-message-age"].dimensions.QueueName == "billing"
    error_message = "the age alarm watches the work queue against var.alarm_oldest_message_age_s"
  }

  assert {
    condition     = aws_cloudwatch_metric_alarm.queue["queue-depth"].threshold == 1000
    error_message = "the depth alarm uses var.alarm_queue_depth"
  }

  assert {
    condition     = aws_cloudwatch_metric_alarm.job_failures.namespace == "SqsWorker" && aws_cloudwatch_metric_alarm.job_failures.metric_name == "JobsDeadLettered" && aws_cloudwatch_metric_alarm.job_failures.dimensions == tomap({ Queue = "billing" }) && aws_cloudwatch_metric_alarm.job_failures.statistic == "Sum"
    error_message = "job failures: Sum of JobsDeadLettered with Queue=<queue name> in the worker's namespace"
  }

  assert {
    condition     = alltrue([for alarm in concat(values(aws_cloudwatch_metric_alarm.queue), [aws_cloudwatch_metric_alarm.job_failures], aws_cloudwatch_metric_alarm.scheduler_dlq) : alarm.alarm_actions == toset([aws_sns_topic.alarms[0].arn])])
    error_message = "every alarm notifies the topic"
  }

  assert {
    condition     = aws_sns_topic.alarms[0].kms_master_key_id == "alias/aws/sns"
    error_message = "the topic is encrypted"
  }

  assert {
    condition     = length(aws_cloudwatch_dashboard.this) == 1 && strcontains(aws_cloudwatch_dashboard.this[0].dashboard_body, "JobsDeadLettered")
    error_message = "a dashboard with the job metrics"
  }
}

run "given_topic" {
  command = apply

  variables {
    alarm_topic_arn = "arn:aws:sns:us-east-1:123456789012:ops"
  }

  assert {
    condition     = length(aws_sns_topic.alarms) == 0 && aws_cloudwatch_metric_alarm.job_failures.alarm_actions == toset(["arn:aws:sns:us-east-1:123456789012:ops"])
    error_message = "a given topic is used, none is created"
  }
}

run "task_role_least_privilege" {
  command = apply

  assert {
    condition = toset(one([for s in jsondecode(aws_iam_role_policy.task[0].policy).Statement : s.Action if s.Sid == "ConsumeTheQueue"])) == toset([
      "sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:SendMessage",
    ])
    error_message = "the worker's SQS actions, no more"
  }

  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task[0].policy).Statement : s.Resource if s.Sid == "ConsumeTheQueue"]) == [aws_sqs_queue.queue.arn, aws_sqs_queue.dlq.arn]
    error_message = "only this worker's queue and DLQ"
  }

  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task[0].policy).Statement : s.Condition if s.Sid == "PutMetricsInTheWorkerNamespace"]) == { StringEquals = { "cloudwatch:namespace" = "SqsWorker" } }
    error_message = "metrics only in the worker's namespace"
  }

  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task[0].policy).Statement : s.Resource if s.Sid == "UseTheIdempotencyTable"]) == [aws_dynamodb_table.idempotency[0].arn]
    error_message = "only this worker's table"
  }

  assert {
    condition     = toset(one([for s in jsondecode(aws_iam_role_policy.task[0].policy).Statement : s.Action if s.Sid == "UseTheIdempotencyTable"])) == toset(["dynamodb:BatchGetItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"])
    error_message = "item reads and writes only: no scans, no table administration"
  }

  assert {
    condition     = alltrue([for s in jsondecode(aws_iam_role_policy.task[0].policy).Statement : s.Effect == "Allow" && (s.Resource != ["*"] || try(s.Condition, null) != null)])
    error_message = "no unconditioned wildcard resource"
  }

  assert {
    condition     = length(jsondecode(aws_iam_role_policy.execution[0].policy).Statement) == 1 && jsondecode(aws_iam_role_policy.execution[0].policy).Statement[0].Resource == ["${aws_cloudwatch_log_group.worker[0].arn}:*"]
    error_message = "the execution role only writes the worker's log group (public image: no ECR statements)"
  }
}

run "task_definition_runs_the_worker" {
  command = apply

  variables {
    shutdown_grace_s = 45
  }

  assert {
    condition     = jsondecode(aws_ecs_task_definition.worker[0].container_definitions)[0].stopTimeout == 55
    error_message = "stopTimeout is the shutdown grace plus 10 s"
  }

  assert {
    condition     = { for pair in jsondecode(aws_ecs_task_definition.worker[0].container_definitions)[0].environment : pair.name => pair.value } == merge(local.worker_environment, { AWS_REGION = "us-east-1" })
    error_message = "the container's environment is exactly the worker_environment output plus AWS_REGION"
  }

  assert {
    condition     = local.worker_environment.WORKER_QUEUE == aws_sqs_queue.queue.url && local.worker_environment.WORKER_DEAD_LETTER_QUEUE == aws_sqs_queue.dlq.url && local.worker_environment.WORKER_IDEMPOTENCY_TABLE == "billing-idempotency"
    error_message = "queue, DLQ and table reach the worker"
  }

  assert {
    condition     = local.worker_environment.WORKER_PROCESSES == "1"
    error_message = "a task of less than 2 vCPUs runs one worker process"
  }

  assert {
    condition     = local.worker_environment.WORKER_SHUTDOWN_GRACE_S == "45" && local.worker_environment.WORKER_HANDLERS == "billing.jobs,billing.reports" && local.worker_environment.WORKER_METRICS_NAMESPACE == "SqsWorker"
    error_message = "grace, handlers and namespace reach the worker"
  }

  assert {
    condition     = jsondecode(aws_ecs_task_definition.worker[0].container_definitions)[0].command == ["run"] && jsondecode(aws_ecs_task_definition.worker[0].container_definitions)[0].readonlyRootFilesystem
    error_message = "the image's entrypoint runs `sqs-worker run`, on a read-only root file system"
  }

  assert {
    condition     = !contains(keys(local.worker_environment), "WORKER_SCHEDULES_FILE")
    error_message = "no schedule file in the container unless container_schedules_file is set"
  }

  assert {
    condition     = jsondecode(aws_ecs_task_definition.worker[0].container_definitions)[0].logConfiguration.logDriver == "awslogs"
    error_message = "logs go to CloudWatch Logs"
  }

  assert {
    condition     = aws_ecs_task_definition.worker[0].requires_compatibilities == toset(["FARGATE"]) && aws_ecs_task_definition.worker[0].task_role_arn == aws_iam_role.task[0].arn
    error_message = "a Fargate task with the task role"
  }
}

run "stop_timeout_is_capped" {
  command = apply

  variables {
    shutdown_grace_s         = 110
    container_schedules_file = "/app/schedules.yaml"
    environment              = { EXTRA = "1", WORKER_QUEUE = "overridden?" }
  }

  assert {
    condition     = local.worker_environment.WORKER_SCHEDULES_FILE == "/app/schedules.yaml"
    error_message = "container_schedules_file reaches the worker as WORKER_SCHEDULES_FILE"
  }

  assert {
    condition     = contains(jsondecode(aws_ecs_task_definition.worker[0].container_definitions)[0].environment, { name = "EXTRA", value = "1" }) && contains(jsondecode(aws_ecs_task_definition.worker[0].container_definitions)[0].environment, { name = "WORKER_QUEUE", value = aws_sqs_queue.queue.url })
    error_message = "extra environment is added, but the module's WORKER_* settings win"
  }

  assert {
    condition     = jsondecode(aws_ecs_task_definition.worker[0].container_definitions)[0].stopTimeout == 120
    error_message = "ECS caps stopTimeout at 120 s"
  }
}

run "autoscaling_on_backlog_per_task" {
  command = apply

  assert {
    condition     = aws_appautoscaling_target.worker[0].resource_id == "service/mock-cluster/billing" && aws_appautoscaling_target.worker[0].min_capacity == 1 && aws_appautoscaling_target.worker[0].max_capacity == 10
    error_message = "the service's desired count is scaled between min and max"
  }

  assert {
    condition     = aws_appautoscaling_policy.backlog_per_task[0].target_tracking_scaling_policy_configuration[0].target_value == 100
    error_message = "target: var.target_backlog_per_task messages per task"
  }

  assert {
    condition     = [for m in aws_appautoscaling_policy.backlog_per_task[0].target_tracking_scaling_policy_configuration[0].customized_metric_specification[0].metrics : m.expression if m.return_data] == ["visible / tasks"]
    error_message = "metric math: visible messages / running tasks"
  }

  assert {
    condition     = one([for m in aws_appautoscaling_policy.backlog_per_task[0].target_tracking_scaling_policy_configuration[0].customized_metric_specification[0].metrics : m.metric_stat[0].metric[0].metric_name if m.id == "visible"]) == "ApproximateNumberOfMessagesVisible"
    error_message = "backlog is the queue's visible messages"
  }
}

run "ecs_can_be_switched_off" {
  command = apply

  variables {
    enable_ecs = false
    image      = null
    subnet_ids = []
  }

  assert {
    condition     = length(aws_ecs_service.worker) == 0 && length(aws_ecs_task_definition.worker) == 0 && length(aws_iam_role.task) == 0 && length(aws_appautoscaling_policy.backlog_per_task) == 0
    error_message = "enable_ecs = false creates no ECS resources"
  }

  assert {
    condition     = output.worker_environment.WORKER_QUEUE == aws_sqs_queue.queue.url
    error_message = "the settings are still an output"
  }
}

run "ecs_needs_an_image" {
  command = plan

  variables {
    image = null
  }

  expect_failures = [aws_ecs_task_definition.worker]
}

run "web_dashboard_is_off_by_default" {
  command = plan

  assert {
    condition     = length(aws_ecs_service.web_dashboard) == 0 && length(aws_lb.web_dashboard) == 0 && output.web_dashboard_url == null
    error_message = "no dashboard service or ALB unless enable_web_dashboard"
  }
}

run "web_dashboard_runs_behind_an_internal_https_alb" {
  command = apply

  variables {
    enable_web_dashboard           = true
    web_dashboard_certificate_arn  = "arn:aws:acm:us-east-1:123456789012:certificate/0b1c2d3e-0000-4000-8000-000000000000"
    web_dashboard_token_secret_arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:billing-dashboard-token"
    web_dashboard_allowed_cidrs    = ["10.8.0.0/16"]
  }

  assert {
    condition     = aws_lb.web_dashboard[0].internal && aws_lb_listener.web_dashboard[0].protocol == "HTTPS" && aws_lb_listener.web_dashboard[0].port == 443
    error_message = "an internal ALB with an HTTPS listener"
  }

  assert {
    condition     = jsondecode(aws_ecs_task_definition.web_dashboard[0].container_definitions)[0].command == ["dashboard"] && aws_lb_target_group.web_dashboard[0].health_check[0].path == "/healthz"
    error_message = "the second service runs `sqs-worker dashboard` and the ALB probes /healthz"
  }

  assert {
    condition     = contains([for pair in jsondecode(aws_ecs_task_definition.web_dashboard[0].container_definitions)[0].environment : "${pair.name}=${pair.value}"], "WORKER_DASHBOARD_ACTIONS=false") && jsondecode(aws_ecs_task_definition.web_dashboard[0].container_definitions)[0].secrets[0].name == "WORKER_DASHBOARD_TOKEN"
    error_message = "read-only by default, the token from Secrets Manager"
  }

  assert {
    condition     = !strcontains(aws_iam_role_policy.web_dashboard[0].policy, "sqs:PurgeQueue") && strcontains(aws_iam_role_policy.web_dashboard[0].policy, "dynamodb:Query")
    error_message = "a read-only dashboard's role cannot purge; it queries the ledger's status index"
  }
}

run "queue_set_alarms_iam_and_autoscaling_cover_every_queue" {
  command = apply

  variables {
    queues = [{ name = "critical", weight = 10 }, { name = "bulk", weight = 1 }]
  }

  assert {
    condition     = toset([for alarm in aws_cloudwatch_metric_alarm.queue : alarm.alarm_name]) == toset(flatten([for queue in ["critical", "bulk"] : [for alarm in ["dlq-not-empty", "oldest-message-age", "queue-depth"] : "billing-${queue}-${alarm}"]]))
    error_message = "each queue of the set has its depth, age and DLQ alarms"
  }

  assert {
    condition     = aws_cloudwatch_metric_alarm.queue["bulk-dlq-not-empty"].dimensions.QueueName == "billing-bulk-dlq" && aws_cloudwatch_metric_alarm.queue["bulk-queue-depth"].dimensions.QueueName == "billing-bulk"
    error_message = "each alarm watches its own queue"
  }

  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task[0].policy).Statement : s.Resource if s.Sid == "ConsumeTheQueue"]) == [aws_sqs_queue.queue.arn, aws_sqs_queue.dlq.arn, aws_sqs_queue.extra["bulk"].arn, aws_sqs_queue.extra_dlq["bulk"].arn]
    error_message = "the task role reaches every queue of the set and its DLQ, no more"
  }

  assert {
    condition     = [for m in aws_appautoscaling_policy.backlog_per_task[0].target_tracking_scaling_policy_configuration[0].customized_metric_specification[0].metrics : m.expression if m.return_data] == ["(visible_0 + visible_1) / tasks"]
    error_message = "autoscaling on the summed backlog of the set per running task"
  }

  assert {
    condition     = [for m in aws_appautoscaling_policy.backlog_per_task[0].target_tracking_scaling_policy_configuration[0].customized_metric_specification[0].metrics : one(m.metric_stat[0].metric[0].dimensions).value if startswith(m.id, "visible")] == ["billing-critical", "billing-bulk"]
    error_message = "the backlog counts the visible messages of each queue of the set"
  }
}

run "worker_processes_follow_the_task_vcpus" {
  command = plan

  variables {
    cpu    = 2048
    memory = 4096
  }

  assert {
    condition     = local.worker_environment.WORKER_PROCESSES == "2"
    error_message = "a 2-vCPU task runs two worker processes (WORKER_PROCESSES)"
  }
}
