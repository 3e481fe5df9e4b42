# Least privilege: the task role reaches only this worker's queues, table and metrics namespace; the
# scheduler role may only send to the queue (and its own DLQ); the execution role only pulls and logs.

locals {
  queue_arns = flatten([for member in local.queue_members : [member.queue.arn, member.dlq.arn]])
  kms_statements = var.kms_key_arn == null ? [] : [{
    Sid      = "UseTheQueueAndTableKey"
    Effect   = "Allow"
    Action   = ["kms:Decrypt", "kms:GenerateDataKey"]
    Resource = [var.kms_key_arn]
  }]

  task_policy = {
    Version = "2012-10-17"
    Statement = concat(
      [
        {
          Sid    = "ConsumeTheQueue"
          Effect = "Allow"
          Action = [
            "sqs:ReceiveMessage",
            "sqs:DeleteMessage",
            "sqs:ChangeMessageVisibility",
            "sqs:GetQueueAttributes",
            "sqs:GetQueueUrl",
            "sqs:SendMessage",
          ]
          Resource = local.queue_arns
        },
        {
          Sid      = "PutMetricsInTheWorkerNamespace"
          Effect   = "Allow"
          Action   = ["cloudwatch:PutMetricData"]
          Resource = ["*"] # PutMetricData has no resource type; the namespace condition scopes it.
          Condition = {
            StringEquals = { "cloudwatch:namespace" = var.metrics_namespace }
          }
        },
      ],
      var.create_idempotency_table ? [{
        Sid      = "UseTheIdempotencyTable"
        Effect   = "Allow"
        Action   = ["dynamodb:BatchGetItem", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"]
        Resource = [aws_dynamodb_table.idempotency[0].arn]
      }] : [],
      local.kms_statements,
    )
  }

  scheduler_policy = {
    Version = "2012-10-17"
    Statement = concat(
      [{
        Sid      = "SendScheduledJobs"
        Effect   = "Allow"
        Action   = ["sqs:SendMessage"]
        Resource = concat([aws_sqs_queue.queue.arn], aws_sqs_queue.scheduler_dlq[*].arn)
      }],
      local.kms_statements,
    )
  }
}

# --- The scheduler's role ----------------------------------------------------------------------------------

resource "aws_iam_role" "scheduler" {
  count = local.has_schedules ? 1 : 0

  name               = "${var.name}-scheduler"
  tags               = var.tags
  assume_role_policy = local.assume_role_policy["scheduler"]
}

resource "aws_iam_role_policy" "scheduler" {
  count = local.has_schedules ? 1 : 0

  name   = "send-to-${var.name}"
  role   = aws_iam_role.scheduler[0].id
  policy = jsonencode(local.scheduler_policy)
}

data "aws_caller_identity" "current" {}

# Who may assume each role: one AWS service, from this account only (confused-deputy guard).
locals {
  assume_role_policy = {
    for service in ["scheduler", "ecs-tasks"] : service => jsonencode({
      Version = "2012-10-17"
      Statement = [{
        Effect    = "Allow"
        Principal = { Service = "${service}.amazonaws.com" }
        Action    = "sts:AssumeRole"
        Condition = {
          StringEquals = { "aws:SourceAccount" = data.aws_caller_identity.current.account_id }
        }
      }]
    })
  }
}

# --- The task role (what the worker itself may do) ---------------------------------------------------------

resource "aws_iam_role" "task" {
  count = var.enable_ecs ? 1 : 0

  name               = "${var.name}-task"
  tags               = var.tags
  assume_role_policy = local.assume_role_policy["ecs-tasks"]
}

resource "aws_iam_role_policy" "task" {
  count = var.enable_ecs ? 1 : 0

  name   = "${var.name}-worker"
  role   = aws_iam_role.task[0].id
  policy = jsonencode(local.task_policy)
}

# --- The execution role (what ECS does to start the task) --------------------------------------------------

resource "aws_iam_role" "execution" {
  count = var.enable_ecs ? 1 : 0

  name = "${var.name}-execution"
  tags = var.tags
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "ecs-tasks.amazonaws.com" }
      Action    = "sts:AssumeRole"
    }]
  })
}

resource "aws_iam_role_policy" "execution" {
  count = var.enable_ecs ? 1 : 0

  name = "${var.name}-execution"
  role = aws_iam_role.execution[0].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = concat(
      [{
        Sid      = "WriteTheWorkerLogs"
        Effect   = "Allow"
        Action   = ["logs:CreateLogStream", "logs:PutLogEvents"]
        Resource = ["${aws_cloudwatch_log_group.worker[0].arn}:*"]
      }],
      length(var.ecr_repository_arns) == 0 ? [] : [
        {
          Sid      = "PullTheImage"
          Effect   = "Allow"
          Action   = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
          Resource = var.ecr_repository_arns
        },
        {
          Sid      = "LogInToEcr"
          Effect   = "Allow"
          Action   = ["ecr:GetAuthorizationToken"]
          Resource = ["*"] # GetAuthorizationToken has no resource type.
        },
      ],
    )
  })
}
