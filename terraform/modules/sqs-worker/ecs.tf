# The worker on ECS Fargate: task definition, service, logs, and target tracking on backlog per task.

resource "aws_cloudwatch_log_group" "worker" {
  count = var.enable_ecs ? 1 : 0

  name              = "/ecs/${var.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
  tags              = var.tags
}

resource "aws_ecs_cluster" "this" {
  count = var.enable_ecs && var.ecs_cluster_arn == null ? 1 : 0

  name = var.name
  tags = var.tags

  setting {
    name  = "containerInsights"
    value = "enabled"
  }
}

locals {
  backlog_ids  = length(local.queue_members) == 1 ? ["visible"] : [for index, _ in local.queue_members : "visible_${index}"]
  cluster_arn  = var.ecs_cluster_arn != null ? var.ecs_cluster_arn : try(aws_ecs_cluster.this[0].arn, null)
  cluster_name = local.cluster_arn == null ? null : element(split("/", local.cluster_arn), length(split("/", local.cluster_arn)) - 1)
  container_environment = [
    for key, value in merge(var.environment, local.worker_environment, { AWS_REGION = data.aws_region.current.name }) :
    { name = key, value = value }
  ]
}

resource "aws_security_group" "worker" {
  count = var.enable_ecs && length(var.security_group_ids) == 0 ? 1 : 0

  name        = "${var.name}-worker"
  description = "sqs-worker ${var.name}: no inbound traffic; HTTPS out to the AWS APIs"
  vpc_id      = var.vpc_id
  tags        = var.tags

  egress {
    description = "HTTPS to SQS, DynamoDB, CloudWatch and ECR"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }

  lifecycle {
    precondition {
      condition     = var.vpc_id != null
      error_message = "Set vpc_id (for the worker's security group) or security_group_ids."
    }
  }
}

resource "aws_ecs_task_definition" "worker" {
  count = var.enable_ecs ? 1 : 0

  family                   = var.name
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.cpu
  memory                   = var.memory
  task_role_arn            = aws_iam_role.task[0].arn
  execution_role_arn       = aws_iam_role.execution[0].arn
  tags                     = var.tags

  volume {
    name = "tmp"
  }

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = var.cpu_architecture
  }

  container_definitions = jsonencode([{
    name                   = "worker"
    image                  = var.image
    essential              = true
    command                = ["run"] # the image's ENTRYPOINT is sqs-worker
    environment            = local.container_environment
    stopTimeout            = local.stop_timeout_s
    readonlyRootFilesystem = true
    user                   = "10001"
    # The liveness file (WORKER_HEALTH_FILE, /tmp by default) goes to task storage, not the image.
    mountPoints = [{ sourceVolume = "tmp", containerPath = "/tmp", readOnly = false }]
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.worker[0].name
        awslogs-region        = data.aws_region.current.name
        awslogs-stream-prefix = "worker"
      }
    }
    healthCheck = var.container_health_check ? {
      command     = ["CMD", "sqs-worker", "health", "--check"]
      interval    = 30
      timeout     = 5
      retries     = 3
      startPeriod = 30
    } : null
  }])

  lifecycle {
    precondition {
      condition     = var.image != null
      error_message = "Set image (the worker's container image) when enable_ecs is true."
    }
  }
}

resource "aws_ecs_service" "worker" {
  count = var.enable_ecs ? 1 : 0

  name                   = var.name
  cluster                = local.cluster_arn
  task_definition        = aws_ecs_task_definition.worker[0].arn
  desired_count          = var.min_capacity
  launch_type            = "FARGATE"
  platform_version       = "LATEST"
  propagate_tags         = "SERVICE"
  enable_execute_command = false
  tags                   = var.tags

  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = length(var.security_group_ids) > 0 ? var.security_group_ids : aws_security_group.worker[*].id
    assign_public_ip = var.assign_public_ip
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  # Autoscaling owns the task count after creation.
  lifecycle {
    ignore_changes = [desired_count]

    precondition {
      condition     = length(var.subnet_ids) > 0
      error_message = "Set subnet_ids for the worker's tasks when enable_ecs is true."
    }
  }
}

resource "aws_appautoscaling_target" "worker" {
  count = var.enable_ecs ? 1 : 0

  service_namespace  = "ecs"
  resource_id        = "service/${local.cluster_name}/${aws_ecs_service.worker[0].name}"
  scalable_dimension = "ecs:service:DesiredCount"
  min_capacity       = var.min_capacity
  max_capacity       = var.max_capacity
}

# Target tracking on backlog per task: visible messages / running tasks (metric math), the AWS-recommended
# way to scale SQS consumers.
resource "aws_appautoscaling_policy" "backlog_per_task" {
  count = var.enable_ecs ? 1 : 0

  name               = "${var.name}-backlog-per-task"
  policy_type        = "TargetTrackingScaling"
  service_namespace  = aws_appautoscaling_target.worker[0].service_namespace
  resource_id        = aws_appautoscaling_target.worker[0].resource_id
  scalable_dimension = aws_appautoscaling_target.worker[0].scalable_dimension

  target_tracking_scaling_policy_configuration {
    target_value       = var.target_backlog_per_task
    scale_in_cooldown  = var.scale_in_cooldown_s
    scale_out_cooldown = var.scale_out_cooldown_s

    customized_metric_specification {
      # The backlog of every queue of the worker, summed (a queue set scales on all of its queues together).
      dynamic "metrics" {
        for_each = local.backlog_ids
        content {
          id          = metrics.value
          return_data = false
          metric_stat {
            stat = "Sum"
            metric {
              namespace   = "AWS/SQS"
              metric_name = "ApproximateNumberOfMessagesVisible"
              dimensions {
                name  = "QueueName"
                value = local.queue_members[metrics.key].queue.name
              }
            }
          }
        }
      }

      metrics {
        id          = "tasks"
        return_data = false
        metric_stat {
          stat = "Average"
          metric {
            namespace   = "ECS/ContainerInsights"
            metric_name = "RunningTaskCount"
            dimensions {
              name  = "ClusterName"
              value = local.cluster_name
            }
            dimensions {
              name  = "ServiceName"
              value = aws_ecs_service.worker[0].name
            }
          }
        }
      }

      metrics {
        id          = "backlog_per_task"
        label       = "Visible messages per running task"
        expression  = length(local.backlog_ids) == 1 ? "visible / tasks" : "(${join(" + ", local.backlog_ids)}) / tasks"
        return_data = true
      }
    }
  }
}
