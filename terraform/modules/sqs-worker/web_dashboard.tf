# The web dashboard (`sqs-worker dashboard`, the same image) as a second ECS service behind an internal ALB.
# Off unless enable_web_dashboard. HTTPS only; users authenticate at the ALB (OIDC) or carry the token from
# Secrets Manager. Its own task role: read the queues, the table (GetItem, Query of its status index) and the
# metrics; the actions' permissions only with web_dashboard_actions.

locals {
  web_dashboard   = var.enable_ecs && var.enable_web_dashboard
  dashboard_port  = 8181
  dashboard_oidc  = var.web_dashboard_oidc != null
  dashboard_queue = [aws_sqs_queue.queue.arn, aws_sqs_queue.dlq.arn]
  dashboard_environment = [
    for key, value in merge(var.environment, local.worker_environment, {
      AWS_REGION                      = data.aws_region.current.name
      WORKER_DASHBOARD_HOST           = "0.0.0.0"
      WORKER_DASHBOARD_PORT           = tostring(local.dashboard_port)
      WORKER_DASHBOARD_ACTIONS        = tostring(var.web_dashboard_actions)
      WORKER_DASHBOARD_TRUST_ALB_OIDC = tostring(local.dashboard_oidc)
    }) : { name = key, value = value }
  ]
  dashboard_policy = {
    Version = "2012-10-17"
    Statement = concat(
      [{
        Sid      = "ReadTheQueues"
        Effect   = "Allow"
        Action   = ["sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:ReceiveMessage", "sqs:ChangeMessageVisibility"]
        Resource = local.dashboard_queue
        }, {
        Sid      = "ReadTheMetrics"
        Effect   = "Allow"
        Action   = ["cloudwatch:GetMetricData", "cloudwatch:GetMetricStatistics"]
        Resource = ["*"] # CloudWatch's read actions have no resource type.
      }],
      var.create_idempotency_table ? [{
        Sid      = "ReadTheLedgerAndWriteTheAudit"
        Effect   = "Allow"
        Action   = ["dynamodb:GetItem", "dynamodb:Query", "dynamodb:PutItem"]
        Resource = [aws_dynamodb_table.idempotency[0].arn, "${aws_dynamodb_table.idempotency[0].arn}/index/status-updated_at"]
      }] : [],
      var.web_dashboard_actions ? [{
        Sid    = "ActOnTheDeadLetters"
        Effect = "Allow"
        Action = ["sqs:SendMessage", "sqs:DeleteMessage", "sqs:PurgeQueue", "sqs:StartMessageMoveTask",
        "sqs:ListMessageMoveTasks", "sqs:CancelMessageMoveTask"]
        Resource = local.dashboard_queue
      }] : [],
      local.kms_statements,
    )
  }
}

resource "aws_iam_role" "web_dashboard" {
  count = local.web_dashboard ? 1 : 0

  name               = "${var.name}-dashboard"
  tags               = var.tags
  assume_role_policy = local.assume_role_policy["ecs-tasks"]
}

resource "aws_iam_role_policy" "web_dashboard" {
  count = local.web_dashboard ? 1 : 0

  name   = "${var.name}-dashboard"
  role   = aws_iam_role.web_dashboard[0].id
  policy = jsonencode(local.dashboard_policy)
}

resource "aws_iam_role_policy" "web_dashboard_token" {
  count = local.web_dashboard && var.web_dashboard_token_secret_arn != null ? 1 : 0

  name = "${var.name}-dashboard-token"
  role = aws_iam_role.execution[0].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid      = "ReadTheDashboardToken"
      Effect   = "Allow"
      Action   = ["secretsmanager:GetSecretValue"]
      Resource = [var.web_dashboard_token_secret_arn]
    }]
  })
}

resource "aws_security_group" "web_dashboard_alb" {
  count = local.web_dashboard ? 1 : 0

  name        = "${var.name}-dashboard-alb"
  description = "sqs-worker ${var.name} dashboard ALB: HTTPS in from the allowed networks, to the dashboard tasks"
  vpc_id      = var.vpc_id
  tags        = var.tags

  ingress {
    description = "HTTPS from the allowed networks"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = var.web_dashboard_allowed_cidrs
  }

  egress {
    description = "To the dashboard tasks"
    from_port   = local.dashboard_port
    to_port     = local.dashboard_port
    protocol    = "tcp"
    cidr_blocks = [data.aws_vpc.web_dashboard[0].cidr_block]
  }
}

resource "aws_security_group" "web_dashboard_task" {
  count = local.web_dashboard ? 1 : 0

  name        = "${var.name}-dashboard"
  description = "sqs-worker ${var.name} dashboard tasks: in from the ALB only; HTTPS out to the AWS APIs"
  vpc_id      = var.vpc_id
  tags        = var.tags

  ingress {
    description     = "From the dashboard ALB"
    from_port       = local.dashboard_port
    to_port         = local.dashboard_port
    protocol        = "tcp"
    security_groups = [aws_security_group.web_dashboard_alb[0].id]
  }

  egress {
    description = "HTTPS to SQS, DynamoDB, CloudWatch and ECR"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }
}

data "aws_vpc" "web_dashboard" {
  count = local.web_dashboard ? 1 : 0
  id    = var.vpc_id
}

resource "aws_lb" "web_dashboard" {
  count = local.web_dashboard ? 1 : 0

  name                       = substr("${var.name}-dashboard", 0, 32)
  internal                   = true
  load_balancer_type         = "application"
  subnets                    = var.subnet_ids
  security_groups            = [aws_security_group.web_dashboard_alb[0].id]
  drop_invalid_header_fields = true
  enable_deletion_protection = false # checkov:skip=CKV_AWS_150: an internal tool's ALB, recreated with the service
  tags                       = var.tags
  # checkov:skip=CKV_AWS_91: access logs need a bucket of the caller's; the dashboard's own log has every action
  # checkov:skip=CKV2_AWS_28: internal ALB reachable only from web_dashboard_allowed_cidrs; WAF is the caller's choice

  lifecycle {
    precondition {
      condition     = var.web_dashboard_certificate_arn != null
      error_message = "Set web_dashboard_certificate_arn (the dashboard is served over HTTPS only)."
    }
    precondition {
      condition     = local.dashboard_oidc || var.web_dashboard_token_secret_arn != null
      error_message = "Set web_dashboard_oidc (users log in at the ALB) or web_dashboard_token_secret_arn."
    }
    precondition {
      condition     = length(var.web_dashboard_allowed_cidrs) > 0
      error_message = "Set web_dashboard_allowed_cidrs: the networks that may reach the dashboard."
    }
  }
}

resource "aws_lb_target_group" "web_dashboard" {
  count = local.web_dashboard ? 1 : 0

  name        = substr("${var.name}-dashboard", 0, 32)
  port        = local.dashboard_port
  protocol    = "HTTP" # checkov:skip=CKV_AWS_378: TLS ends at the internal ALB; the hop to the task stays in the VPC
  target_type = "ip"
  vpc_id      = var.vpc_id
  tags        = var.tags

  health_check {
    path    = "/healthz"
    matcher = "200"
  }
}

resource "aws_lb_listener" "web_dashboard" {
  count = local.web_dashboard ? 1 : 0

  load_balancer_arn = aws_lb.web_dashboard[0].arn
  port              = 443
  protocol          = "HTTPS"
  ssl_policy        = "ELBSecurityPolicy-TLS13-1-2-2021-06"
  certificate_arn   = var.web_dashboard_certificate_arn
  tags              = var.tags

  dynamic "default_action" {
    for_each = local.dashboard_oidc ? [var.web_dashboard_oidc] : []
    content {
      type  = "authenticate-oidc"
      order = 1
      authenticate_oidc {
        issuer                 = default_action.value.issuer
        authorization_endpoint = default_action.value.authorization_endpoint
        token_endpoint         = default_action.value.token_endpoint
        user_info_endpoint     = default_action.value.user_info_endpoint
        client_id              = default_action.value.client_id
        client_secret          = default_action.value.client_secret
      }
    }
  }

  default_action {
    type             = "forward"
    order            = 2
    target_group_arn = aws_lb_target_group.web_dashboard[0].arn
  }
}

resource "aws_ecs_task_definition" "web_dashboard" {
  count = local.web_dashboard ? 1 : 0

  family                   = "${var.name}-dashboard"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = 256
  memory                   = 512
  task_role_arn            = aws_iam_role.web_dashboard[0].arn
  execution_role_arn       = aws_iam_role.execution[0].arn
  tags                     = var.tags

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = var.cpu_architecture
  }

  container_definitions = jsonencode([{
    name                   = "dashboard"
    image                  = var.image
    essential              = true
    command                = ["dashboard"] # the image's ENTRYPOINT is sqs-worker
    environment            = local.dashboard_environment
    secrets                = var.web_dashboard_token_secret_arn == null ? [] : [{ name = "WORKER_DASHBOARD_TOKEN", valueFrom = var.web_dashboard_token_secret_arn }]
    readonlyRootFilesystem = true
    user                   = "10001"
    portMappings           = [{ containerPort = local.dashboard_port, protocol = "tcp" }]
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.worker[0].name
        awslogs-region        = data.aws_region.current.name
        awslogs-stream-prefix = "dashboard"
      }
    }
  }])
}

resource "aws_ecs_service" "web_dashboard" {
  count = local.web_dashboard ? 1 : 0

  name                   = "${var.name}-dashboard"
  cluster                = local.cluster_arn
  task_definition        = aws_ecs_task_definition.web_dashboard[0].arn
  desired_count          = 1
  launch_type            = "FARGATE"
  platform_version       = "LATEST"
  propagate_tags         = "SERVICE"
  enable_execute_command = false
  tags                   = var.tags

  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = [aws_security_group.web_dashboard_task[0].id]
    assign_public_ip = false
  }

  load_balancer {
    target_group_arn = aws_lb_target_group.web_dashboard[0].arn
    container_name   = "dashboard"
    container_port   = local.dashboard_port
  }

  depends_on = [aws_lb_listener.web_dashboard]
}
